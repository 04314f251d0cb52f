#!/bin/bash
# deploy/gpu-check's product stage rehearsed on the CPU (ctest DeployProductStageTest...), as it will
# run on a GPU machine: from a bare directory that holds only the orchestrator bundle as it travels
# (deploy/bundle of BUILD_DIR into .gpu-check/bundle.tar.gz, which the stage unpacks) and the parts of
# the source tree the stage reads (deploy/, experiments/), with an empty
# environment (LLMCTL_RATE_PROBE=off aside, as below) and BUILD_DIR's llm-train. Checks that
#   - every library the bundle's binaries load resolves inside it (the stage's own check);
#   - the stage is killed midway (SIGKILL to its process group, once a trial has ended) and a second
#     call measures only what is missing: its experiment holds fewer trials than the file;
#   - every row of experiments/cpu-product.yaml then ends as it expects, through llmctld, llm-agent,
#     the report (json, html) and the store, which is copied;
#   - the agent said it found no NVML.
set -uo pipefail

build=$(cd "$1" && pwd)
source_dir=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
bare=$work/bare
out=$work/out
bundle=$bare/.gpu-check/bundle
home=$out/product/home

fail() {
  echo "FAILED: $*" >&2
  for log in "$out/gpu-check.log" "$out/product/submit.err" "$out/product/llm-agent.log"; do
    [ -f "$log" ] && { echo "--- $log" >&2; tail -n 30 "$log" >&2; }
  done
  exit 1
}
# HOME as the stage has it: without one llmctl reads the password database's home, whose
# ~/.config/llmctl/config.yaml may name another controller than the stage's embedded one.
llmctl() {
  env -i HOME="$work" LLMCTL_HOME="$home" LLMCTL_TRAIN_BIN="$build/trainer/llm-train" \
    "$bundle/bin/llmctl" "$@"
}
cleanup() {
  [ -x "$bundle/bin/llmctl" ] && llmctl daemon stop > /dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$bare"
(cd "$source_dir" && git ls-files -z -co --exclude-standard deploy experiments |
  xargs -0 cp --parents -t "$bare") ||
  fail "could not copy deploy/ and experiments/"
"$source_dir/deploy/bundle" "$build" "$bundle.tar.gz" || fail "deploy/bundle"
[ -e "$bundle" ] && fail "deploy/bundle made $bundle besides $bundle.tar.gz"

# The stage with nothing from this environment but PATH, and LLMCTL_RATE_PROBE=off as every test
# sets it (cmake/LlmctlTargets.cmake): the first submit of CPU trials to a fresh LLMCTL_HOME would
# otherwise measure this machine first (llm-train --probe: 10 s of two cores), which nothing here
# reads; the stage's llmctl and the agent it starts inherit it.
stage() {
  env -i PATH=/usr/bin:/bin HOME="$work" LLMCTL_RATE_PROBE=off GPU_CHECK_BUILD_DIR="$build" \
    "$bare/deploy/gpu-check" --device cpu "$out" product
}

# First call, killed once its experiment has a trial that ended.
setsid bash -c "$(declare -f stage); work='$work' bare='$bare' out='$out' build='$build'; stage" \
  > "$work/first.txt" 2>&1 &
first=$!
ended=0
for _ in $(seq 1 240); do
  kill -0 "$first" 2> /dev/null || fail "the first call ended before it could be killed: $(cat "$work/first.txt")"
  if [ -s "$out/product/experiments.txt" ] &&
    llmctl status "$(head -n 1 "$out/product/experiments.txt")" 2> /dev/null | grep -qE '\b(ok|oom)\b'; then
    ended=1
    break
  fi
  sleep 0.5
done
[ "$ended" = 1 ] || fail "no trial of the first call ended within 120 s: $(cat "$work/first.txt")"
kill -KILL -- "-$first" 2> /dev/null
wait "$first" 2> /dev/null

# Second call: cancels what the first left running, records what ended, runs only the rest.
stage > "$work/second.txt" 2>&1 || fail "the second call failed: $(tail -n 20 "$work/second.txt")"

grep -q "bundle.ldd" "$out/gpu-check.log" 2> /dev/null && fail "the bundle check complained"
[ -s "$out/product/bundle.ldd.txt" ] || fail "no bundle.ldd.txt"
[ "$(wc -l < "$out/product/experiments.txt")" = 2 ] || fail "expected 2 experiments: $(cat "$out/product/experiments.txt")"
first_id=$(sed -n 1p "$out/product/experiments.txt")
second=$(sed -n 2p "$out/product/experiments.txt")
# The second experiment holds exactly the trials the first did not end (a trial that was running
# when the first call died is cancelled, so measured again).
trials=$(python3 - "$out/product/report-$first_id.json" "$out/product/report-$second.json" <<'PY'
import json, sys
first, second = (json.load(open(p))["trials"] for p in sys.argv[1:3])
ended = {t["name"] for t in first if t["outcome"] in ("ok", "oom", "diverged", "failed")}
rerun = [t["name"] for t in second]
expected = [t["name"] for t in first if t["name"] not in ended]
if rerun != expected or not ended:
    sys.exit(f"first call ended {sorted(ended)}; the second ran {rerun}, not {expected}")
print(len(rerun))
PY
) || fail "the second call did not run only what was missing: $trials"
grep -q "4 of 4 rows with an expectation ended as expected" "$out/product.md" ||
  fail "not every row ended as expected: $(cat "$out/product.md")"
# Each ended row has the caching allocator's reserved peak beside its allocated one and the verdict
# predicted at submit (what the verdict's slack is checked against on a GPU).
python3 - "$out/product.md" <<'PY' || fail "a row without its reserved peak or verdict: $(cat "$out/product.md")"
import sys
lines = [l for l in open(sys.argv[1]) if l.startswith("| ")]
header = [c.strip() for c in lines[0].strip("|\n").split("|")]
rows = [dict(zip(header, (c.strip() for c in l.strip("|\n").split("|")))) for l in lines[1:]]
ended = [r for r in rows if r["outcome"].split()[0] in ("ok", "oom")]
bad = [r["trial"] for r in ended if r["verdict"] not in ("fits", "tight", "oom")
       or (r["outcome"].startswith("ok") and r["reserved GiB"] == "–")]
sys.exit(f"rows {bad}" if bad or not ended else 0)
PY
[ -s "$out/product/report-$second.html" ] || fail "no html report"
stored=$(python3 -c 'import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("select count(*) from trials").fetchone()[0])' \
  "$out/product/llmctl.db") || fail "the copied store does not open"
[ "$stored" -ge 4 ] || fail "the copied store holds $stored trials"
grep -q "NVML not available" "$out/product/llm-agent.log" || fail "the agent did not say NVML is absent"
echo "product stage ok: first call killed, the second ran the $trials of 4 trials it had not ended; store holds $stored"
