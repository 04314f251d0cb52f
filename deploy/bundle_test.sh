#!/bin/bash
# deploy/bundle's test (ctest DeployBundleTest.RunsWithOnlyTheBundlesLibraries): bundles BUILD_DIR's
# orchestrator into a temporary directory, then checks that every library the three binaries load
# (gRPC, Protobuf, SQLite, OpenSSL, ...), but the C and C++ runtime, comes from the bundle's lib/
# with no LD_LIBRARY_PATH, that each binary
# starts from there with an empty environment, that the bundle as it travels (OUT.tar.gz) fits the
# 64 MiB a device call carries together with the tracked tree and the build stage's .debs, and that a
# second bundle into the same place is refused.
set -euo pipefail

build=$(cd "$1" && pwd)
source_dir=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out="$work/llmctl-bundle"

"$source_dir/deploy/bundle" "$build" "$out"

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

for binary in llmctl llmctld llm-agent; do
  [ -x "$out/bin/$binary" ] || fail "$out/bin/$binary is missing"
done
# deploy/gpu-check's own check of the same (gpu_check.py bundle-check): every library but the C and
# C++ runtime found, and inside the bundle.
env -i PATH=/usr/bin:/bin ldd "$out"/bin/* >"$work/ldd.txt" 2>&1
python3 "$source_dir/deploy/gpu_check.py" bundle-check "$out" "$work/ldd.txt" >"$work/check.txt" ||
  fail "the bundle does not stand alone: $(cat "$work/check.txt")"

# Each starts from the bundle with no environment at all.
env -i "$out/bin/llmctl" --help >"$work/llmctl.txt" 2>&1 || fail "llmctl --help: $(cat "$work/llmctl.txt")"
env -i "$out/bin/llmctld" --help >"$work/llmctld.txt" 2>&1 || fail "llmctld --help: $(cat "$work/llmctld.txt")"
env -i "$out/bin/llm-agent" --help >"$work/agent.txt" 2>&1 || fail "llm-agent --help: $(cat "$work/agent.txt")"

# What a device call carries (docs/developing.md, "On a GPU machine"): the tracked tree, the bundle's
# archive and .gpu-check/debs (scripts/fetch-gpu-check-debs.sh: 3.8 MB; counted as 4 MiB where they
# have not been fetched), at most 64 MiB together.
"$source_dir/deploy/bundle" "$build" "$out.tar.gz"
tar -tzf "$out.tar.gz" > "$work/archive.txt"
grep -qx "bundle/bin/llmctl" "$work/archive.txt" || fail "$out.tar.gz holds no bundle/bin/llmctl"
archive=$(stat -c %s "$out.tar.gz")
if git -C "$source_dir" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  tree=$(git -C "$source_dir" ls-files -z -co --exclude-standard |
    (cd "$source_dir" && xargs -0 stat -c %s 2> /dev/null) | awk '{ sum += $1 } END { print sum + 0 }')
else
  tree=$(du -sb --exclude=.git --exclude=.gpu-check --exclude='build*' --exclude=.venv "$source_dir" | cut -f1)
fi
debs=$((4 << 20))
if [ -d "$source_dir/.gpu-check/debs" ]; then debs=$(du -sb "$source_dir/.gpu-check/debs" | cut -f1); fi
travels=$((tree + archive + debs))
[ "$travels" -le $((64 << 20)) ] ||
  fail "a device call would carry $((travels >> 20)) MiB (tree $((tree >> 20)), bundle.tar.gz $((archive >> 20)), debs $((debs >> 20))), more than its 64 MiB"
size=$(du -sk "$out" | cut -f1)

if "$source_dir/deploy/bundle" "$build" "$out" 2>"$work/again.txt"; then
  fail "a second bundle into $out was not refused"
fi
grep -q "exists" "$work/again.txt" || fail "the refusal does not say why: $(cat "$work/again.txt")"
echo "bundle ok: $size KiB; a device call carries $((travels >> 20)) MiB of its 64 (tree $((tree >> 20)), bundle.tar.gz $((archive >> 20)), debs $((debs >> 20)))"
