"""run_train_bench.py's report: the Markdown tables of both sides' figures, and the machine they ran on."""

import os
import subprocess

from profile_summary import markdown as profile_markdown


def mib(n):
    return "n/a" if n is None else f"{n / 2**20:,.0f} MiB"


def percent(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


def model_flops_utilization(args, precision, side):
    """6 · N · tokens/s over the device's dense peak for the precision (None without a peak)."""
    peak = args.peak_tflops if precision.startswith("bf16") else args.peak_tflops_fp32
    if not peak or not side["parameters"] or side["tokens_per_second"] != side["tokens_per_second"]:
        return None
    return 6 * side["parameters"] * side["tokens_per_second"] / (peak * 1e12)


def ratio(a, b, fmt="{:.2f}x"):
    if a is None or b is None or not b or a != a or b != b:
        return "n/a"
    return fmt.format(a / b)


def gpu_name():
    """The first GPU's name as nvidia-smi reports it."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out.splitlines()[0] if out else "GPU (nvidia-smi unavailable)"


def machine_info():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} logical CPUs, load average {load}"


def report(args, rows, ours_baseline, data_info, machine):
    out = []
    out.append(f"## llm-train vs transformers: {args.model.name}, seq {args.seq_len}, micro-batch "
               f"{args.micro_batch_size}, global batch {args.global_batch_size}, AdamW, "
               f"{'CPU, ' + str(args.threads) + ' thread(s)' if args.device == 'cpu' else args.gpu_name}"
               + (f", best of {args.repeats} runs per side" if args.repeats > 1 else "")
               + (f"; adapters: alpha {args.lora_alpha:g} on {args.lora_targets} (peer: PEFT, "
                  "bitsandbytes for qlora)" if args.peft != "none" else "") + "\n")
    out.append("| config | ours tok/s | peer tok/s | ratio (ours/peer) | ours peak RSS | peer peak RSS | "
               "ratio | ours peak − baseline | peer peak − baseline | ratio | ours allocator peak¹ |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for precision, ours, peer in rows:
        ours_net = ours["peak_rss"] - ours_baseline
        peer_net = peer["peak_rss"] - peer["baseline_rss"] if peer["baseline_rss"] else None
        out.append(
            f"| {precision} | {ours['tokens_per_second']:,.0f} | {peer['tokens_per_second']:,.0f} | "
            f"{ratio(ours['tokens_per_second'], peer['tokens_per_second'])} | "
            f"{mib(ours['peak_rss'])} | {mib(peer['peak_rss'])} | {ratio(ours['peak_rss'], peer['peak_rss'])} | "
            f"{mib(ours_net)} | {mib(peer_net)} | {ratio(ours_net, peer_net)} | {mib(ours['allocator_peak'])} |")
    predicted = [(precision, ours) for precision, ours, _ in rows if "predicted_tokens_per_second" in ours]
    if predicted:
        out.append("")
        out.append("| config | ours tok/s | predicted tok/s | error | predicted at |")
        out.append("|---|---:|---:|---:|---|")
        for precision, ours in predicted:
            guess = ours["predicted_tokens_per_second"]
            error = "–" if not guess else f"{100 * (guess / ours['tokens_per_second'] - 1):+.1f}%"
            out.append(f"| {precision} | {ours['tokens_per_second']:,.0f} | "
                       f"{'–' if not guess else f'{guess:,.0f}'} | {error} | {ours['prediction_note']} |")
        out.append("")
        out.append("Predicted: `llmctl estimate` of the same experiment file before it ran (error: predicted "
                   "over measured, less one), at the probe's rates when `--rates` names one.")
    out.append("")
    out.append("Tokens/s: non-padding input tokens of the measured steps over their summed step times "
               f"(the first {args.warmup_steps} step(s) of {args.steps} are warm-up and not counted; "
               "a step's time covers batch assembly, forward, loss, backward and the optimizer step, "
               "on both sides). Ratio > 1 means llm-train is faster / uses more memory.")
    out.append("")
    out.append("Peak RSS: the child process's resident-set high-water mark (`ru_maxrss` from `wait4`): "
               "everything the process touched, tensors, allocator slack, libraries, and for the peer the "
               "Python interpreter, torch's Python modules and transformers. "
               f"Baseline: the RSS before any model tensor exists — ours {mib(ours_baseline)} (peak RSS "
               "of `llm-train --prepare` on the same experiment: LibTorch loaded, data tokenized, no "
               "model), the peer's as it reports it just before building the model "
               f"({', '.join(mib(p['baseline_rss']) + ' for ' + pr for pr, _, p in rows)}). "
               "Peak − baseline is the fairest memory comparison: what training itself added.")
    out.append("")
    out.append("¹ Allocator peak: llm-train's exact high-water mark of LibTorch CPU tensor bytes during "
               "training (its counting allocator, the `result` event's `peak_bytes`); it excludes "
               "oneDNN/BLAS scratch, malloc slack and code. The peer has no such counter.")
    if args.device == "cuda":
        out.append("")
        out.append("| config | ours GPU peak | peer GPU peak | ratio | ours reserved | peer reserved | ratio | "
                   "ours MFU | peer MFU |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for precision, ours, peer in rows:
            out.append(f"| {precision} | {mib(ours['allocator_peak'])} | {mib(peer['allocator_peak'])} | "
                       f"{ratio(ours['allocator_peak'], peer['allocator_peak'])} | {mib(ours['reserved_peak'])} | "
                       f"{mib(peer['reserved_peak'])} | {ratio(ours['reserved_peak'], peer['reserved_peak'])} | "
                       f"{percent(ours['mfu'])} | {percent(peer['mfu'])} |")
        out.append("")
        out.append("GPU peak: each side's CUDA caching-allocator high-water mark of allocated bytes during "
                   "training (llm-train's `result` peak_bytes; the peer's torch.cuda.max_memory_allocated() "
                   "after a reset once the model and optimizer exist); reserved: what the allocator held. "
                   f"MFU = 6 · N · tokens/s / peak, N = all parameters (embeddings included, attention's "
                   f"own FLOPs not counted), peak {args.peak_tflops:g} TFLOP/s for bf16 rows and "
                   f"{args.peak_tflops_fp32:g} TFLOP/s for fp32 rows (dense, no sparsity).")
    out.append("")
    out.append("| config | side | params | threads | process wall s | process CPU s | measured steps: "
               "wall s | CPU s | tok per CPU-s | first loss | last loss |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for precision, ours, peer in rows:
        for side, r in (("ours", ours), ("peer", peer)):
            fl = "n/a" if r["first_loss"] is None else f"{r['first_loss']:.4f}"
            ll = "n/a" if r["last_loss"] is None else f"{r['last_loss']:.4f}"
            wall = sum(r["step_seconds"][args.warmup_steps:])
            cpu = r["measured_cpu"]
            cpu_text = "n/a" if cpu is None else f"{cpu:.1f}"
            per_cpu = "n/a" if not cpu else f"{r['measured_tokens'] / cpu:,.0f}"
            out.append(f"| {precision} | {side} | {r['parameters']:,} | {r['threads']} | {r['wall']:.1f} | "
                       f"{r['cpu']:.1f} | {wall:.1f} | {cpu_text} | {per_cpu} | {fl} | {ll} |")
    out.append("")
    out.append("Process wall/CPU: the whole child, start-up and model building included. Measured steps: "
               "the steps counted in tokens/s; their CPU seconds (all threads, read from /proc as each "
               "step's line arrives) are less sensitive than wall time to other load on a shared "
               "machine, though OpenMP threads spinning at barriers count as CPU time too.")
    if any(o["phases"] or p["phases"] for _, o, p in rows):
        out.append("")
        out.append("Mean seconds per measured step, by phase"
                   + ("" if args.phase_timing else " (ours: run with --phase-timing)") + ":")
        out.append("")
        out.append("| config | side | batch | forward (+loss) | backward | optimizer | step |")
        out.append("|---|---|---:|---:|---:|---:|---:|")
        for precision, ours, peer in rows:
            for side, r in (("ours", ours), ("peer", peer)):
                ph = r["phases"]
                if not ph:
                    continue
                out.append(f"| {precision} | {side} | {ph['batch']:.3f} | {ph['forward']:.3f} | "
                           f"{ph['backward']:.3f} | {ph['optimizer']:.3f} | {sum(ph.values()):.3f} |")
        if args.phase_timing:
            out.append("")
            out.append("Ours are read from the arrival times of llm-train's per-phase snapshot lines "
                       "(snapshot_every 1), so its phases include taking a memory snapshot.")
    for precision, ours, _ in rows:
        if ours.get("profile_error"):
            out.append("")
            out.append(f"Profile of {precision}: not taken ({ours['profile_error']}).")
        if ours.get("profile"):
            out.append("")
            title = (f"Profile of {precision} (step {args.warmup_steps}, a separate run; trace under "
                     f"{args.profile_dir})")
            out.append(profile_markdown(ours["profile"], title).rstrip())
    out.append("")
    out.append(f"Data: {data_info}. Peer: {rows[0][2]['versions']}, LlamaForCausalLM with "
               f"attn_implementation=sdpa, torch.optim.AdamW({'fused=True' if args.peer_optimizer == 'fused' else args.peer_optimizer}). "
               f"llm-train: {args.llm_train}. Machine: {machine} (at the start).")
    return "\n".join(out) + "\n"
