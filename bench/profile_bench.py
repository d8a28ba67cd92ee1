"""Time-to-profile and measurement consistency of `dl-nfv profile model`.

Profiles ResNet-50 (batch 32) and GPT-2 small (batch 4, sequence 512) with the
default settings (3 repeats, no extra warm-up step, torch's thread count), and
reports for each: the wall time of the whole profile (model build, tracing,
counting pass, warm-up and timed steps), the measured whole training step, the
sum of the per-op forward+backward medians, and their ratio (goal: each
profile under 2 minutes, ratio within 15% of 1). With ``--zoo`` it profiles
every zoo model at its default size instead, into a section of its own.

Usage: python bench/profile_bench.py [--threads default,1] [--zoo] [--no-record]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _record import markdown_table, record_section  # noqa: E402

from dl_nfv.profilers import profile_model  # noqa: E402
from dl_nfv.profilers.zoo import TINY, ZOO, model_ref  # noqa: E402

GOAL_S = 120.0
CASES = (("resnet50", {"batch_size": 32}), ("gpt2-small", {"batch_size": 4, "seq_len": 512}))


def _profile(name: str, options: dict, threads: int | None) -> dict:
    ref = model_ref(name, **options)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    graph = profile_model(ref, threads=threads)
    wall = time.perf_counter() - t0
    p = graph.profile
    size = f"batch {ref.batch_size}" + (f", seq {ref.options['seq_len']}" if "seq_len" in ref.options else "")
    return {"model": name, "size": size, "granularity": graph.granularity.value,
            "ops": len(graph.ops), "gflops": sum(o.flops for o in graph.ops) / 1e9,
            "step_ms": p.step_ms, "op_sum_ms": p.op_sum_ms, "ratio": p.op_sum_ms / p.step_ms,
            "fastest": float(re.search(r"([0-9.]+) \(fastest", p.note).group(1)),
            "peak_gib": p.peak_memory_bytes / 2**30, "wall_s": wall, "threads": p.threads,
            "load": (load_before + os.getloadavg()[0]) / 2}


def _row(r: dict, goal: bool) -> list:
    row = [r["model"], r["size"], r["granularity"], r["ops"], f"{r['gflops']:.1f}", r["threads"],
           f"{r['step_ms']:.0f}", f"{r['op_sum_ms']:.0f}", f"{r['ratio']:.3f}",
           f"{r['fastest']:.3f}",
           f"{r['peak_gib']:.2f}", f"{r['wall_s']:.1f}", f"{r['load']:.1f}"]
    if goal:
        row += ["yes" if abs(r["ratio"] - 1) <= 0.15 else "no",
                "yes" if r["wall_s"] <= GOAL_S else "no"]
    return row


HEADERS = ["model", "size", "granularity", "ops", "fwd GFLOPs", "threads", "step ms",
           "per-op sum ms", "sum / step", "fastest rounds", "peak GiB", "time to profile s",
           "load avg"]
GOALS = ["sum within 15%", "under 2 min"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", action="store_true",
                        help="profile every zoo model (at the last --threads) instead")
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument("--threads", default="default",
                        help="comma-separated thread counts to run the two cases at "
                             "('default' = torch's choice), e.g. 2,1")
    args = parser.parse_args()
    thread_counts = [None if t == "default" else int(t) for t in args.threads.split(",")]
    if args.zoo:
        _zoo(thread_counts[-1], args.no_record)
        return
    results = []
    for threads in thread_counts:
        for name, options in CASES:
            results.append(_profile(name, options, threads))
            print(markdown_table(HEADERS + GOALS, [_row(results[-1], True)]), flush=True)
    body = [markdown_table(HEADERS + GOALS, [_row(r, True) for r in results]),
            "",
            f"Goal: each profile under {GOAL_S:.0f} s with the per-op sum within 15% of the "
            f"whole step (`sum / step`: medians; `fastest rounds`: the fastest instrumented "
            f"sum over the fastest plain step). Defaults: 3 repeats, no warm-up step beyond the counting pass. "
            f"`load avg` is the machine's 1-minute load average during the run: the machine has "
            f"2 cores and is shared with other jobs, which stretches every time here, and two "
            f"OpenMP threads slow down far more than one when the cores are oversubscribed."]
    text = "\n".join(body)
    print(text)
    if not args.no_record:
        record_section("profile", "Profiling: time to profile, per-op sum vs whole step", text)


def _zoo(threads: int | None, no_record: bool) -> None:
    """Every zoo model at its default size (the tiny test models left out)."""
    rows = []
    for entry in ZOO.values():
        if entry.name.endswith(TINY):
            continue
        rows.append(_row(_profile(entry.name, {}, threads), False))
        print(markdown_table(HEADERS, [rows[-1]]), flush=True)
    text = ("Every zoo model at its default size (`dl-nfv profile model NAME`):\n\n"
            + markdown_table(HEADERS, rows))
    print(text)
    if not no_record:
        record_section("profile-zoo", "Profiling every zoo model", text)


if __name__ == "__main__":
    main()
