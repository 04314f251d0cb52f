"""Running a benchmark's child: stdout lines time-stamped as they arrive (with the child's CPU seconds),
stderr kept, peak RSS from wait4; and the environment both sides' children get."""

import os
import subprocess
import sys
import threading
import time


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU seconds of a live process, all its threads (from /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime: fields 14, 15
    except (OSError, IndexError, ValueError):
        return None


class ChildRun:
    def __init__(self, argv, env, echo=False):
        self.argv = argv
        self.lines = []  # (perf_counter seconds, line, child CPU seconds so far)
        self.stderr_lines = []
        started = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                bufsize=1)

        def pump(stream, sink, stamp):
            for line in stream:
                line = line.rstrip("\n")
                # Stdout lines carry their arrival time and the child's CPU seconds at that moment.
                sink.append((time.perf_counter(), line, cpu_seconds(proc.pid)) if stamp else line)
                if echo:
                    print(f"    | {line}", file=sys.stderr, flush=True)

        readers = [threading.Thread(target=pump, args=(proc.stdout, self.lines, True), daemon=True),
                   threading.Thread(target=pump, args=(proc.stderr, self.stderr_lines, False), daemon=True)]
        for r in readers:
            r.start()
        # Wait for the exit without reaping, so /proc/PID stays readable until the readers are done.
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        self.wall_seconds = time.perf_counter() - started
        for r in readers:
            r.join()
        _, status, rusage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # keeps Popen from waiting again
        self.returncode = proc.returncode
        self.peak_rss_bytes = rusage.ru_maxrss * 1024  # KiB on Linux
        self.user_seconds = rusage.ru_utime
        self.system_seconds = rusage.ru_stime

    def tail(self, n=15):
        out = [l for _, l, _ in self.lines[-n:]] + self.stderr_lines[-n:]
        return "\n".join("    " + l for l in out)


# The heap policy llm-train sets itself (trainer/memory/host_heap.h: freed large blocks kept for the
# next step, not unmapped and faulted in again), for the peers too, so that a ratio compares the
# trainers and not glibc's defaults: on a 128k vocabulary those alone made transformers 2x slower
# (docs/benchmarks.md).
HEAP_TUNABLES = "glibc.malloc.mmap_threshold=2147483647:glibc.malloc.trim_threshold=2147483647"


def child_env(threads, wait_policy, device):
    env = dict(os.environ)
    if wait_policy != "inherit":
        env["OMP_WAIT_POLICY"] = wait_policy.upper()
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    env["OPENBLAS_NUM_THREADS"] = str(threads)  # numpy's OpenBLAS, loaded by transformers in the peer
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU benchmark: neither side may touch a GPU
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["GLIBC_TUNABLES"] = HEAP_TUNABLES
    return env
