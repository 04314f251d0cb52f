#!/usr/bin/env python3
"""deploy/gpu-check's bookkeeping: versions, one JSON row per finished trial or check, and the tables.

Every subcommand reads and writes files in the output directory only, so a stage killed halfway leaves
the rows it finished. Not meant to be run by hand; deploy/gpu-check calls it:

  gpu_check.py env OUT DEVICE LLM_TRAIN BUILD_DIR     versions -> OUT/env.json (+ nvidia-smi.txt)
  gpu_check.py env-field ENV_JSON FIELD               prints one field ('' when absent)
  gpu_check.py stage-row OUT STAGE STATUS SECONDS     appends to OUT/stages.jsonl
  gpu_check.py cuda-kernels BUILD_DIR                 prints whether the build compiled cuda_kernels.cu
                                                      ("yes", or "no: WHY"; exit 1 unless yes)
  gpu_check.py kernels-count KERNELS_JSON             the kernels stage's tests, from GoogleTest's JSON:
                                                      "N ran, F failed, S skipped"; exit 1 when none ran
                                                      or one skipped
  gpu_check.py has-row JSONL TRIAL                    exit 0 when JSONL has a row for TRIAL
  gpu_check.py lab-row OUT FILE TRIAL EXPECTED CODE   one lab trial's row -> OUT/lab.jsonl
  gpu_check.py lab-table OUT FILE [SKIPPED...]        OUT/lab.md and OUT/lab.json from lab.jsonl
  gpu_check.py ranks-row OUT BACKEND DEVICE CODE JSONL  one c10d check's row -> OUT/ranks.jsonl (+ .md)
  gpu_check.py product-missing OUT FILE LLM_TRAIN     FILE's trials the product stage has no final row of
  gpu_check.py product-record OUT REPORT_JSON         ended trials of `llmctl report --format json` ->
                                                      OUT/product/trials.jsonl (latest row per trial wins)
  gpu_check.py product-table OUT FILE                 OUT/product.md and OUT/product.json
  gpu_check.py product-file FILE GPU_BYTES COPY       COPY: FILE without the device_memory caps larger
                                                      than the GPU (prints the ones it dropped)
  gpu_check.py bundle-check BUNDLE LDD_TXT            exit 0 when every library `env -i ldd` listed in
                                                      LDD_TXT (the bundle's binaries) resolves inside BUNDLE
  gpu_check.py probe-summary PROBE_JSON               the probe's rates as Markdown; exit 1 unless it
                                                      is this build's probe version (rate_probe.h)
                                                      with an fp32 matmul
  gpu_check.py summary OUT                            Markdown: versions and every stage's status
"""

import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GIB = 2**30


def run_text(argv):
    """A command's stdout, or '' when it is missing or fails (versions are best-effort facts)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def tree_commit():
    """HEAD, marked when the tree differs from it (a device machine's copy of .git can be older than
    the working tree sent with it, so HEAD alone may name a commit the tree has moved past)."""
    head = run_text(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    if not head:
        return "unknown (no .git)"
    changed = run_text(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])
    return head + (" + uncommitted changes" if changed else "")


def read_jsonl(path):
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut short by a kill
    return rows


def append_jsonl(path, row):
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def load_env(out):
    path = Path(out) / "env.json"
    return json.loads(path.read_text()) if path.exists() else {}


def env_tag(env):
    return env.get("tag", "versions unknown (the build stage has not run)")


# ---------------------------------------------------------------------------------------------------


def cmd_env(out, device, llm_train, build_dir):
    out = Path(out)
    import torch

    env = {
        "device": device,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "os": run_text(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
                    "unknown"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cxx": run_text(["c++", "--version"]).splitlines()[0] if run_text(["c++", "--version"]) else "",
        "cmake": (run_text(["cmake", "--version"]).splitlines() or [""])[0],
        "nvcc": (run_text(["nvcc", "--version"]).splitlines() or [""])[-1],
        "llm_train": "; ".join(run_text([llm_train, "--version"]).splitlines()),
        "commit": tree_commit(),
        "build_dir": build_dir,
        "cuda_kernels": cuda_kernels_built(build_dir),
    }
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    if device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("gpu_check: --device cuda but PyTorch sees no GPU")
        props = torch.cuda.get_device_properties(0)
        env.update({
            "gpu": props.name,
            "gpu_memory_bytes": props.total_memory,
            "gpu_count": torch.cuda.device_count(),
            "compute_capability": f"{props.major}.{props.minor}",
            "driver": run_text(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).split("\n")[0],
        })
        smi = run_text(["nvidia-smi"])
        # The highest CUDA version the driver supports, as nvidia-smi's header states it.
        match = re.search(r"CUDA Version:\s*([0-9.]+)", smi)
        env["driver_cuda"] = match.group(1) if match else None
        (out / "nvidia-smi.txt").write_text(smi + "\n" + run_text(["nvidia-smi", "-q"]) + "\n")
        env["tag"] = (f"{props.name}, driver {env['driver']} (CUDA {env['driver_cuda']}), torch {torch.__version__} "
                      f"(CUDA {torch.version.cuda}), {env['llm_train']}")
    else:
        env["tag"] = f"CPU {env['cpu']} x{env['cpus']}, torch {torch.__version__}, {env['llm_train']}"
    (out / "env.json").write_text(json.dumps(env, indent=2) + "\n")


def cuda_kernels_built(build_dir):
    """LLMCTL_CUDA_KERNELS_BUILT from BUILD_DIR's CMakeCache.txt (trainer/CMakeLists.txt): "yes", or "no: WHY"."""
    cache = Path(build_dir) / "CMakeCache.txt"
    if not cache.exists():
        return f"no: {cache} does not exist (the build stage has not configured)"
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith("LLMCTL_CUDA_KERNELS_BUILT:"):
            return line.split("=", 1)[1]
    return f"no: {cache} has no LLMCTL_CUDA_KERNELS_BUILT (configured by a tree before the CUDA kernels' guard)"


def cmd_cuda_kernels(build_dir):
    built = cuda_kernels_built(build_dir)
    print(built)
    sys.exit(0 if built == "yes" else 1)


def cmd_kernels_count(kernels_json):
    """The tests a kernels run ran: a filter that matches none, or a binary that writes no results, runs
    nothing and exits 0, which must not pass the stage."""
    path = Path(kernels_json)
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        print(f"no test results in {path}: {error}")
        sys.exit(1)
    ran = failed = skipped = 0
    for suite in report.get("testsuites", []):
        for test in suite.get("testsuite", []):
            if test.get("status") != "RUN":
                continue
            if test.get("result") == "SKIPPED":
                skipped += 1
            else:
                ran += 1
                failed += 1 if test.get("failures") else 0
    print(f"{ran} ran, {failed} failed, {skipped} skipped")
    sys.exit(0 if ran > 0 and skipped == 0 else 1)


def cmd_env_field(env_json, field):
    path = Path(env_json)
    value = json.loads(path.read_text()).get(field, "") if path.exists() else ""
    print("" if value is None else value)


def cmd_stage_row(out, stage, status, seconds):
    append_jsonl(Path(out) / "stages.jsonl", {"stage": stage, "status": status, "seconds": int(seconds),
                                              "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                              "env": env_tag(load_env(out))})


def cmd_summary(out):
    out = Path(out)
    env = load_env(out)
    lines = [f"# gpu-check: {env_tag(env)}", ""]
    if env:
        lines.append(f"commit {env.get('commit')}; {env.get('os')}; {env.get('cxx')}; {env.get('cmake')}; "
                     f"nvcc: {env.get('nvcc') or 'none'}; CUDA kernels: {env.get('cuda_kernels', 'not recorded')}; "
                     f"transformers {env.get('transformers')}")
        lines.append("")
    lines += ["| stage | status | seconds | when (UTC) |", "|---|---|---:|---|"]
    for row in read_jsonl(out / "stages.jsonl"):
        lines.append(f"| {row['stage']} | {row['status']} | {row['seconds']} | {row['time_utc']} |")
    for name in ("product.md", "lab.md", "peer.md", "ranks.md"):
        if (out / name).exists():
            lines += ["", f"See {name}."]
    print("\n".join(lines))


def cmd_has_row(jsonl, trial):
    """Whether TRIAL has a finished row (one stopped at the time budget is measured again)."""
    sys.exit(0 if any(r.get("trial") == trial and not r.get("stopped_at_budget") for r in read_jsonl(jsonl))
             else 1)


def summarize_events(events_path):
    """What one llm-train run measured, from its --events file (a run cut short has no result)."""
    events = read_jsonl(events_path)
    start = next((e for e in events if e.get("type") == "start"), {})
    result = next((e for e in events if e.get("type") == "result"), None)
    snapshots = [e for e in events if e.get("type") == "snapshot"]
    steps = [e for e in events if e.get("type") == "step"]
    # Step 0 pays for CUDA's and cuBLAS's first calls and creates the optimizer state: not counted.
    timed = [s for s in steps if s["step"] >= 1] or steps
    seconds = sum(s["seconds"] for s in timed)
    at_peak = max(snapshots, key=lambda s: s["allocated_bytes"]) if snapshots else {}
    return {
        "parameters": start.get("parameters_total"),
        "trainable": start.get("parameters_trainable"),
        "load_peak_bytes": start.get("load_peak_bytes"),
        "result": result,
        "steps_run": len(steps),
        "timed_steps": len(timed),
        "tokens_per_second": sum(s["tokens"] for s in timed) / seconds if seconds > 0 else None,
        "peak_bytes": result.get("peak_bytes") if result else (max((s["peak_bytes"] for s in snapshots), default=None)),
        "reserved_peak_bytes": max((s["reserved_bytes"] for s in snapshots), default=None),
        "at_peak": {k: at_peak.get(k) for k in ("step", "phase", "params_bytes", "grads_bytes", "optim_device_bytes",
                                                "optim_host_bytes", "other_bytes", "allocated_bytes")},
    }


def published_figures(experiment_file):
    table = json.loads((REPO / "deploy" / "lab-published.json").read_text())
    return table.get(experiment_file, {})


def cmd_lab_row(out, experiment_file, trial, expected, exit_code):
    out = Path(out)
    measured = summarize_events(out / "lab" / f"{trial}.events.jsonl")
    result = measured.pop("result")
    # 124: the stage's time budget ended the run (deploy/gpu-check says so for timeout's SIGKILL too);
    # 137 otherwise: something else killed it, on a GPU machine most likely the kernel's out-of-memory
    # killer when the host ran out (the cpu-offload row keeps 16 bytes per parameter in host memory).
    stopped_at_budget = exit_code == "124"
    if stopped_at_budget:
        observed = "stopped: time budget"
        error = "the stage's time budget ran out during this trial; run the stage again"
    elif exit_code == "137":
        observed = "killed"
        error = "killed by SIGKILL before its time budget: the host's out-of-memory killer? (see dmesg)"
    elif result:
        observed = result["outcome"]
        error = result.get("error", "")
    else:
        observed, error = "failed", f"exit code {exit_code}, no result event (see lab/{trial}.log)"
    env = load_env(out)
    row = {"trial": trial, "file": experiment_file, "expected": expected or None, "observed": observed,
           "matches": (observed == expected) if expected and not stopped_at_budget else None,
           "stopped_at_budget": stopped_at_budget, "exit_code": int(exit_code),
           "error": error, "published": published_figures(experiment_file).get(trial), "env": env_tag(env),
           **measured}
    append_jsonl(out / "lab.jsonl", row)


def gib(n):
    return "–" if n is None else f"{n / GIB:.2f}"


def cmd_lab_table(out, experiment_file, *skipped):
    out = Path(out)
    env = load_env(out)
    rows = {r["trial"]: r for r in read_jsonl(out / "lab.jsonl")}  # a rerun's row replaces the older one
    lines = [f"## Lab table: {experiment_file} on {env_tag(env)}", "",
             "| trial | expected | observed | peak GiB | peak GB | reserved GiB | params | grads | optim (device + host) "
             "| acts | tokens/s | published (lab) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows.values():
        p = r.get("at_peak") or {}
        pub = r.get("published")
        if pub:
            figures = [f"{pub['peak_gb']:.2f} GB" if pub.get("peak_gb") is not None else None,
                       f"{pub['tokens_per_second']:,} tok/s" if pub.get("tokens_per_second") else None,
                       pub.get("outcome")]
            pub_text = f"{pub['what']}: " + ", ".join(f for f in figures if f)
        else:
            pub_text = "–"
        mark = "" if r["matches"] is not False else " ✗"
        peak_gb = "–" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / 1e9:.2f}"
        tps = "–" if r.get("tokens_per_second") is None else f"{r['tokens_per_second']:,.0f}"
        optim = (f"{gib(p.get('optim_device_bytes'))} + {gib(p.get('optim_host_bytes'))}"
                 if p.get("optim_device_bytes") is not None else "–")
        lines.append(f"| {r['trial']} | {r['expected'] or '–'} | {r['observed']}{mark} | {gib(r.get('peak_bytes'))} | "
                     f"{peak_gb} | {gib(r.get('reserved_peak_bytes'))} | {gib(p.get('params_bytes'))} | "
                     f"{gib(p.get('grads_bytes'))} | {optim} | {gib(p.get('other_bytes'))} | {tps} | {pub_text} |")
    for trial in skipped:
        if trial not in rows:
            lines.append(f"| {trial} | | skipped: out of time | | | | | | | | | |")
    matched = sum(1 for r in rows.values() if r["matches"])
    stated = sum(1 for r in rows.values() if r["matches"] is not None)
    steps = max((r["steps_run"] for r in rows.values()), default=0)
    if published_figures(experiment_file):
        models = ("Models are random-init presets of the published shapes (no network there, so no hub weights): "
                  "memory is the same as with the real weights, loss is not.")
    else:
        models = "Models are the file's small random-init stand-ins under its simulated device budget."
    lines += ["", f"{matched} of {stated} rows with an expectation ended as expected (✗: not). {models} Each trial ran at most {steps} optimizer steps (the file's own "
              "count is longer; an out-of-memory row stops at its first); tokens/s is over the steps after the first. Peak: the allocator's "
              "high-water mark since training started (GiB = 2^30 bytes; GB = 10^9); columns params to acts are "
              "the snapshot with the most allocated bytes. Published: the LitGPT lab's figures on an A100 80GB "
              "with real weights (deploy/lab-published.json), for the trials that match one of its rows."]
    (out / "lab.md").write_text("\n".join(lines) + "\n")
    (out / "lab.json").write_text(json.dumps({"env": env, "file": experiment_file, "rows": list(rows.values()),
                                              "skipped": [t for t in skipped if t not in rows]}, indent=2) + "\n")
    print("\n".join(lines))


def cmd_ranks_row(out, backend, device, exit_code, jsonl):
    """One c10d check: its JSON lines and exit code. NCCL cannot run two ranks on one GPU, and
    llm-c10d-check refuses that with exit code 3 before starting any rank: with fewer GPUs than ranks
    that is the expected outcome, so the row says so instead of counting it as a failure."""
    out = Path(out)
    env = load_env(out)
    checks = read_jsonl(jsonl) if exit_code != "skipped" else []
    gpus = env.get("gpu_count")
    if exit_code == "skipped":
        status = "skipped: out of time"
    elif exit_code == "0":
        status = "ok"
    elif backend == "nccl" and exit_code == "3" and gpus is not None and gpus < 2:
        status = f"refused, as expected: NCCL needs a GPU per rank and this machine has {gpus}"
    else:
        status = f"failed (exit code {exit_code})"
    row = {"backend": backend, "device": device, "world_size": 2, "exit_code": exit_code, "status": status,
           "checks": checks, "env": env_tag(env)}
    append_jsonl(out / "ranks.jsonl", row)
    lines = [f"## c10d collectives, 2 ranks, on {env_tag(env)}", "", "| backend | device | checks | status |",
             "|---|---|---:|---|"]
    for r in read_jsonl(out / "ranks.jsonl"):
        lines.append(f"| {r['backend']} | {r['device']} | {len(r['checks'])} | {r['status']} |")
    (out / "ranks.md").write_text("\n".join(lines) + "\n")
    print(f"ranks: {backend} on {device}: {status}")
    sys.exit(0 if status == "ok" or status.startswith("refused, as expected") else 1)


# ----------------------------------------------------------------------------------------------------
# The product stage: llmctl submit -> llmctld -> llm-agent -> llm-train, read back through the report.

# An outcome the stage measures again: the run was stopped (cancelled at the stage's budget) or its
# worker was lost with the machine's processes (the stage killed midway), not a result of the trial.
def product_row_is_final(row):
    if row["outcome"] == "cancelled":
        return False
    return not (row["outcome"] == "failed" and "vanished" in (row.get("error") or ""))


def product_rows(out):
    rows = {}
    for row in read_jsonl(Path(out) / "product" / "trials.jsonl"):
        rows[row["trial"]] = row  # a later attempt's row replaces the earlier one
    return rows


def cmd_product_missing(out, experiment_file, llm_train):
    listed = subprocess.run([llm_train, "--config", experiment_file, "--list"], capture_output=True, text=True)
    if listed.returncode != 0:
        sys.exit(f"gpu_check: {llm_train} --config {experiment_file} --list failed: {listed.stderr.strip()}")
    listing = listed.stdout
    done = {t for t, r in product_rows(out).items() if product_row_is_final(r)}
    for line in listing.splitlines():
        trial = line.split("\t")[0]
        if trial and trial not in done:
            print(trial)


def cmd_product_record(out, report_json):
    report = json.loads(Path(report_json).read_text())
    env = env_tag(load_env(out))
    for trial in report["trials"]:
        if trial.get("outcome") in (None, "", "queued", "running"):
            continue
        samples = [s for a in trial.get("attempts", []) for s in a.get("device_samples", [])]
        gpu_samples = [s for s in samples if s.get("device", "").find("cuda") >= 0]
        append_jsonl(Path(out) / "product" / "trials.jsonl", {
            "trial": trial["name"], "experiment_id": report["experiment_id"], "outcome": trial["outcome"],
            "expected": trial.get("expected") or None, "error": trial.get("error", ""),
            "peak_bytes": trial.get("peak_bytes"), "predicted_peak_bytes": (trial.get("prediction") or {}).get("peak_bytes"),
            "prediction_error": trial.get("prediction_error"), "tokens_per_second": trial.get("tokens_per_second"),
            "steady_tokens_per_second": trial.get("steady_tokens_per_second"),
            "predicted_tokens_per_second": (trial.get("prediction") or {}).get("tokens_per_second"),
            "tokens_per_second_prediction_error": trial.get("tokens_per_second_prediction_error"),
            "time_rates": (trial.get("prediction") or {}).get("calibration"),
            "train_seconds": trial.get("train_seconds"), "at_peak": trial.get("at_peak"),
            "device_samples": len(samples),
            "gpu_memory_used_max_bytes": max((s["memory_used_bytes"] for s in gpu_samples), default=None),
            # What the verdict's slack stands for (common/estimate/memory_verdict.h): the caching
            # allocator's reserve beside its allocated peak, and the verdict predicted at submit.
            "reserved_peak_bytes": max((s["reserved_bytes"] for a in trial.get("memory_timeline", [])
                                        for s in a.get("snapshots", []) if s.get("reserved_bytes") is not None),
                                       default=None),
            "predicted_verdict": (trial.get("prediction") or {}).get("verdict") or None,
            "env": env})


def cmd_product_table(out, experiment_file):
    out = Path(out)
    env = load_env(out)
    rows = product_rows(out)
    published = published_figures(experiment_file)
    lines = [f"## Product stage: {experiment_file} through llmctl, llmctld, llm-agent on {env_tag(env)}", "",
             "| trial | expected | outcome | lab's outcome | peak GiB | reserved GiB | predicted GiB | verdict | error "
             "| NVML max used GiB | samples | tokens/s | predicted tokens/s | error | train s |",
             "|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]

    def percent(value):
        return "–" if value is None else f"{100 * value:+.1f}%"

    def rate(value):
        return "–" if not value else f"{value:,.0f}"

    for r in rows.values():
        pub = (published.get(r["trial"]) or {}).get("outcome") or "–"
        mark = " ✗" if r["expected"] and r["outcome"] != r["expected"] else ""
        # The report's steady tokens/s (each attempt's first step left out), which the prediction is of;
        # a row recorded before it was kept has the whole run's.
        tps = r.get("steady_tokens_per_second") or r.get("tokens_per_second")
        secs = "–" if r.get("train_seconds") is None else f"{r['train_seconds']:.1f}"
        lines.append(f"| {r['trial']} | {r['expected'] or '–'} | {r['outcome']}{mark} | {pub} | "
                     f"{gib(r.get('peak_bytes'))} | {gib(r.get('reserved_peak_bytes'))} | "
                     f"{gib(r.get('predicted_peak_bytes'))} | {r.get('predicted_verdict') or '–'} | "
                     f"{percent(r.get('prediction_error'))} | {gib(r.get('gpu_memory_used_max_bytes'))} | "
                     f"{r['device_samples']} | {rate(tps)} | {rate(r.get('predicted_tokens_per_second'))} | "
                     f"{percent(r.get('tokens_per_second_prediction_error'))} | {secs} |")
    missing = [t for t, r in rows.items() if not product_row_is_final(r)]
    lines += ["", f"{sum(1 for r in rows.values() if r['expected'] and r['outcome'] == r['expected'])} of "
              f"{sum(1 for r in rows.values() if r['expected'])} rows with an expectation ended as expected (✗: not)"
              + (f"; to measure again: {', '.join(missing)}" if missing else "") + ". Peak: llm-train's allocator "
              "high-water mark; reserved: the caching allocator's (on a CPU the same); predicted and verdict: `llmctl "
              "estimate` at submit (tight: within the 5% it keeps for the caching allocator's slack, "
              "common/estimate/memory_verdict.h, which the reserved column measures); NVML: the agent's samples of the GPU's "
              "used memory (CUDA context and caching allocator included; – without NVML); tokens/s: the "
              "report's steady figure, each attempt's first step left out, beside `llmctl estimate`'s at "
              "submit (the node's probe's rates once the agent has measured them). A row of two steps (the "
              "product files' setting) times only its second, and a run's early steps are slower than its "
              "steady ones: its tokens/s error overstates the time model's (docs/developing.md, the product "
              "stage; the peer stage's 20-step runs test it)."]
    calibrations = sorted({r["time_rates"] for r in rows.values() if r.get("time_rates")})
    if calibrations:
        lines.append("Time calibration at submit: " + "; ".join(calibrations) + ".")
    (out / "product.md").write_text("\n".join(lines) + "\n")
    (out / "product.json").write_text(json.dumps({"env": env, "file": experiment_file, "rows": list(rows.values())},
                                                 indent=2) + "\n")
    print("\n".join(lines))


_SIZE = re.compile(r"device_memory: *([0-9.]+) *(GiB|MiB|GB|MB)")
_UNITS = {"GiB": 2**30, "MiB": 2**20, "GB": 10**9, "MB": 10**6}


def cmd_product_file(experiment_file, gpu_bytes, copy):
    """The product file for a GPU smaller than a cap it names (the lab's H100 94GB on an 80 GB card):
    llm-train refuses a device_memory above the GPU's, so such a cap is dropped and the row runs
    under the card's own memory. The copy sits beside FILE, so its relative paths still resolve."""
    dropped = []

    def replace(match):
        if float(match.group(1)) * _UNITS[match.group(2)] <= int(gpu_bytes):
            return match.group(0)
        dropped.append(match.group(1) + match.group(2))
        return 'device_memory: ""'

    Path(copy).write_text(_SIZE.sub(replace, Path(experiment_file).read_text()))
    print(" ".join(dropped))


# The C and C++ runtime every machine has (deploy/bundle leaves them out).
_RUNTIME = re.compile(r"^(linux-vdso|ld-linux.*|libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|"
                      r"libgcc_s)\.so")


def probe_version():
    """kRateProbeVersion, read from common/estimate/rate_probe.h: the one place the version is set."""
    header = (REPO / "common/estimate/rate_probe.h").read_text()
    return int(re.search(r"kRateProbeVersion = (\d+);", header).group(1))


def cmd_probe_summary(probe_json):
    """The probe's rates as a table (docs/estimate.md, "Measured rates"); exits 1 on a document that is
    not this build's probe version with an fp32 rate (the estimator would refuse or re-measure it)."""
    version = probe_version()
    try:
        probe = json.loads(Path(probe_json).read_text())
        if probe.get("version") != version or not any(m.get("dtype") == "fp32" for m in probe["matmul"]):
            raise ValueError(f"not a version {version} probe with an fp32 matmul")
    except (OSError, ValueError, KeyError, TypeError) as error:
        sys.exit(f"{probe_json}: {error}")
    identity = probe["identity"]
    print(f"probe of {identity['device']} {identity['device_name']} ({identity['threads']} threads), "
          f"{probe['seconds']:.1f} s, each rate the median of {probe['rounds']} rounds")
    print("| dtype | size | tokens | TFLOP/s |\n|---|---:|---:|---:|")
    for m in probe["matmul"]:
        print(f"| {m['dtype']} | {m['size']} | {m['tokens']} | {m['flops_per_s'] / 1e12:.3f} |")
    print(f"memory {probe['memory_bytes_per_s'] / 1e9:.1f} GB/s, launch {probe['launch_seconds'] * 1e6:.1f} us, "
          f"host AdamW {probe['host_adamw_values_per_s'] / 1e9:.2f} Gvalues/s, "
          f"8-bit AdamW {probe['adamw_8bit_values_per_s'] / 1e6:.0f} Mvalues/s, "
          f"host->device {probe['host_to_device_bytes_per_s'] / 1e9:.1f} GB/s")


def cmd_bundle_check(bundle, ldd_txt):
    bundle = Path(bundle).resolve()
    problems = []
    for line in Path(ldd_txt).read_text().splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] != "=>" or _RUNTIME.match(parts[0]):
            continue
        if parts[2] == "not":
            problems.append(f"{parts[0]} not found")
        elif not str(Path(parts[2]).resolve()).startswith(str(bundle / "lib") + "/"):
            problems.append(f"{parts[0]} from {parts[2]}, outside the bundle")
    for problem in problems:
        print(problem)
    sys.exit(1 if problems else 0)


COMMANDS = {
    "has-row": cmd_has_row,
    "lab-row": cmd_lab_row,
    "lab-table": cmd_lab_table,
    "ranks-row": cmd_ranks_row,
    "env": cmd_env,
    "env-field": cmd_env_field,
    "stage-row": cmd_stage_row,
    "cuda-kernels": cmd_cuda_kernels,
    "kernels-count": cmd_kernels_count,
    "summary": cmd_summary,
    "product-missing": cmd_product_missing,
    "product-record": cmd_product_record,
    "product-table": cmd_product_table,
    "product-file": cmd_product_file,
    "bundle-check": cmd_bundle_check,
    "probe-summary": cmd_probe_summary,
}


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[1]](*sys.argv[2:])


if __name__ == "__main__":
    main()
