#!/usr/bin/env bash
# fetch-gpu-check-debs.sh: downloads the Debian 12 packages that building llm-train needs besides a
# compiler, CMake and PyTorch, into .gpu-check/debs/ (ignored by git), for deploy/gpu-check's build
# stage on a lent GPU machine that has no network and none of these libraries.
#
#   scripts/fetch-gpu-check-debs.sh        (on this project's Debian 12 machine, once; no root needed)
#
# What llm-train links besides LibTorch (the trainer-only configuration's find_package and
# pkg_check_modules calls): yaml-cpp (library), PCRE2's 8-bit library (found with pkg-config, so pkgconf
# comes too), libjpeg-turbo and libpng (BLIP-2's images; libpng's header includes zlib's),
# nlohmann-json and CLI11 (headers only); and GoogleTest (static libraries), for the fused kernels'
# tests that the kernels stage runs on the GPU. Debian 12's binaries need glibc 2.36, which any
# newer distribution (Ubuntu 24.04: 2.39) has. About 3.8 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  libyaml-cpp-dev libyaml-cpp0.7
  libpcre2-dev libpcre2-8-0
  libjpeg62-turbo-dev libjpeg62-turbo libpng-dev libpng16-16 zlib1g-dev
  nlohmann-json3-dev
  libcli11-dev
  pkgconf-bin libpkgconf3
  libgtest-dev
)
# shellcheck source=/dev/null
. /etc/os-release
if [ "${ID:-}" != debian ] || [ "${VERSION_ID:-}" != 12 ]; then
  echo "fetch-gpu-check-debs: run this on Debian 12 (this is ${PRETTY_NAME:-unknown}): the GPU machine's" \
    "glibc must be at least as new as the one these binaries were built for" >&2
  exit 2
fi
dest=.gpu-check/debs
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp"
(cd "$dest.tmp" && apt-get download "${packages[@]}")
rm -rf "$dest"
mv "$dest.tmp" "$dest"
du -sh "$dest"
ls "$dest"
