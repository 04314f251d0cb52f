#!/bin/bash
# deploy/bundle's test (ctest DeployBundleTest.RunsWithOnlyTheBundlesLibraries): bundles BUILD_DIR's
# orchestrator into a temporary directory, then checks that every library the three binaries load
# (gRPC, Protobuf, SQLite, OpenSSL, ...), but the C and C++ runtime, comes from the bundle's lib/
# with no LD_LIBRARY_PATH, that each binary
# starts from there with an empty environment, that the bundle fits the 64 MiB a device call carries
# beside the tree, and that a second bundle into the same place is refused.
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

size=$(du -sk "$out" | cut -f1)
[ "$size" -lt $((64 * 1024)) ] || fail "the bundle is $size KiB, more than 64 MiB"

if "$source_dir/deploy/bundle" "$build" "$out" 2>"$work/again.txt"; then
  fail "a second bundle into $out was not refused"
fi
grep -q "exists" "$work/again.txt" || fail "the refusal does not say why: $(cat "$work/again.txt")"
echo "bundle ok: $size KiB"
