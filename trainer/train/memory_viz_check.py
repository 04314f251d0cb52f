"""Reads an llm-train memory history with PyTorch's own tools and reports what they found.

Usage: memory_viz_check.py MEMORY_PICKLE OUT_DIR

Checks that the file uses only the pickle opcodes pytorch.org/memory_viz's unpickler reads, loads
it with pickle, runs torch.cuda._memory_viz's text tools (segsum, trace, the
segments and memory flamegraph inputs) and its HTML viewers (trace_plot: Active Memory Timeline,
segment_plot: Allocator State History, written to OUT_DIR), and replays the trace: the bytes live
at the trace's start are those of the segments at its end minus what the trace allocated plus what
it freed; at each "snapshot" entry the replayed total is reported beside the entry's own size.
Prints one JSON object for profiling_test.cc to compare with the run's snapshot events.
"""

import collections
import json
import os
import pickle
import pickletools
import sys

from torch.cuda import _memory_viz


# The opcodes the viewer's own unpickler (torch/utils/viz/MemoryViz.js, behind
# pytorch.org/memory_viz) reads; a file with any other does not open there.
MEMORY_VIZ_OPCODES = {
    "APPEND", "APPENDS", "BINFLOAT", "BINGET", "BININT", "BININT1", "BININT2", "BINPUT",
    "BINUNICODE", "DICT", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "FRAME", "LIST", "LONG1",
    "LONG_BINGET", "LONG_BINPUT", "MARK", "MEMOIZE", "NEWFALSE", "NEWTRUE", "NONE", "PROTO",
    "SETITEM", "SETITEMS", "SHORT_BINUNICODE", "STOP", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
}


def main(path, out_dir):
    with open(path, "rb") as f:
        raw = f.read()
    opcodes = {op.name for op, _, _ in pickletools.genops(raw)}
    assert opcodes <= MEMORY_VIZ_OPCODES, opcodes - MEMORY_VIZ_OPCODES
    data = pickle.loads(raw)
    assert set(data) >= {"segments", "device_traces"}, sorted(data)
    (trace,) = data["device_traces"]

    live_bytes = 0
    categories = collections.Counter()
    for segment in data["segments"]:
        assert segment["device"] == 0 and segment["total_size"] > 0, segment
        (block,) = segment["blocks"]
        assert block["state"] == "active_allocated" and block["size"] == segment["total_size"]
        live_bytes += block["size"]
        frames = block["frames"]
        if frames and frames[0]["filename"] == "category":
            categories[frames[0]["name"]] += block["size"]

    allocated = sum(e["size"] for e in trace if e["action"] == "alloc")
    freed = sum(e["size"] for e in trace if e["action"] == "free_completed")
    current = live_bytes - allocated + freed
    assert current >= 0, current
    markers = []
    for entry in trace:
        assert {"action", "addr", "size", "stream", "frames", "time_us"} <= set(entry), entry
        if entry["action"] == "alloc":
            current += entry["size"]
        elif entry["action"] == "free_completed":
            current -= entry["size"]
        elif entry["action"] == "snapshot":
            markers.append(
                {
                    "label": entry["frames"][0]["name"],
                    "replayed": current,
                    "recorded": entry["size"],
                }
            )
    assert current == live_bytes

    identity = lambda lines: lines  # the flamegraph inputs, without downloading flamegraph.pl
    report = {
        "entries": len(trace),
        "ooms": [e["size"] for e in trace if e["action"] == "oom"],
        "live_bytes": live_bytes,
        "categories": categories,
        "markers": markers,
        "segsum_lines": len(_memory_viz.segsum(data).splitlines()),
        "trace_lines": len(_memory_viz.trace(data).splitlines()),
        "segments_lines": len(_memory_viz.segments(data, identity).splitlines()),
        "memory_lines": len(_memory_viz.memory(data, identity).splitlines()),
    }
    for name, plot in (
        ("trace_plot", _memory_viz.trace_plot),
        ("segment_plot", _memory_viz.segment_plot),
    ):
        html = plot(data)
        with open(os.path.join(out_dir, name + ".html"), "w") as f:
            f.write(html)
        report[name + "_bytes"] = len(html)
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
