#!/usr/bin/env bash
# Installs what llmctl needs on a fresh Debian 12 machine: Debian packages (with retries) and the
# pinned LibTorch wheel in a project-local virtual environment (.venv). Re-running it checks and returns
# in about a second when nothing is missing.
#   (no flag)  what building and running llmctl needs (`make demo`)
#   --tests    adds the real peers some tests run against: Keystone with uwsgi and the openstack CLI,
#              cloud-init and shellcheck (`make test`; about 3.5 minutes of the first run), and Blazar
#              from PyPI in .venv-blazar (73 s and 222 MB more)
#   --dev      adds the Python packages that regenerate the test fixtures and run the peer benchmarks
#              (transformers, tokenizers, safetensors, numpy, peft, bitsandbytes; `make bench`)
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0
with_dev=0
for flag in "$@"; do
  case "$flag" in
    --tests) with_tests=1 ;;
    --dev) with_dev=1 ;;
    *)
      echo "setup: unknown option '$flag' (expected --tests or --dev)" >&2
      exit 2
      ;;
  esac
done

TORCH_VERSION=2.15.0
DEBIAN_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git python3-venv
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libboost-dev libboost-system-dev libcurl4-openssl-dev libssl-dev
  nlohmann-json3-dev libsqlite3-dev sqlite3 libspdlog-dev libyaml-cpp-dev libcli11-dev
  libgtest-dev libgmock-dev libpcre2-dev
  # JPEG and PNG decoding for image-caption datasets (common/image).
  libjpeg62-turbo-dev libpng-dev
)
TEST_PACKAGES=(
  # A real Keystone (OpenStack Zed) for the cloud client's tests, and the openstack CLI that cross-checks them:
  # about 175 packages, 27 MB, 3.5 min here. The tests start their own on loopback (tests/keystone).
  keystone uwsgi-plugin-python3 python3-openstackclient
  # cloud-init and shellcheck check the node bootstrap's user-data (controller/openstack/user_data.cc).
  cloud-init shellcheck
  # clang (14) checks the lock annotations: make thread-safety (scripts/thread_safety.py).
  clang
)
if ((with_tests)); then
  DEBIAN_PACKAGES+=("${TEST_PACKAGES[@]}")
fi
# The real Blazar for the lease tests (tests/blazar). It needs newer oslo libraries than Debian's Zed
# Keystone, so it gets a virtual environment of its own, made with Debian's python3 (3.11).
BLAZAR_VERSION=18.0.0
DEV_PYTHON_PACKAGES=(numpy "transformers==5.23.0" "tokenizers==0.23.3" "safetensors==0.8.0" "peft==0.21.2"
  "bitsandbytes==0.50.2" "pillow==13.0.0" "sentencepiece==0.2.3" "protobuf==7.36.2")

retry() {
  local attempt
  for attempt in 1 2 3 4 5; do
    if "$@"; then return 0; fi
    echo "setup: '$*' failed (attempt $attempt of 5); retrying in $((attempt * 5)) s" >&2
    sleep $((attempt * 5))
  done
  echo "setup: giving up on '$*'" >&2
  return 1
}

missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  retry $SUDO apt-get update -q
  retry $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  # Where systemd runs, the package starts its own Keystone on port 5000: the tests need none of it.
  if [[ " ${missing[*]} " == *" keystone "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now keystone || true
  fi
fi

# Python: prefer Debian's python3 for the venv when the default python3 cannot make one.
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
installed_torch=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
if [ "$installed_torch" != "$TORCH_VERSION" ]; then
  echo "setup: installing torch==$TORCH_VERSION into .venv (about 3 GB to download, about 75 s here)"
  retry .venv/bin/pip install -q --disable-pip-version-check "torch==$TORCH_VERSION"
fi
if ((with_dev)); then
  if ! .venv/bin/python -c 'import transformers, tokenizers, safetensors, numpy, peft, bitsandbytes, PIL, sentencepiece, google.protobuf' 2>/dev/null; then
    echo "setup: installing the fixture and benchmark tools into .venv"
    retry .venv/bin/pip install -q --disable-pip-version-check "${DEV_PYTHON_PACKAGES[@]}"
  fi
fi
if ((with_tests)); then
  installed_blazar=$(.venv-blazar/bin/python -c 'import importlib.metadata as m; print(m.version("blazar"))' 2>/dev/null || true)
  if [ "$installed_blazar" != "$BLAZAR_VERSION" ]; then
    echo "setup: installing blazar==$BLAZAR_VERSION into .venv-blazar (about 75 s and 222 MB)"
    [ -x .venv-blazar/bin/python ] || /usr/bin/python3 -m venv .venv-blazar
    retry .venv-blazar/bin/pip install -q --disable-pip-version-check "blazar==$BLAZAR_VERSION"
  fi
fi
echo "setup: ok"
