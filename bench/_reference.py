"""The machine's speed for one model right now: its plain step, timed alone.

A shared machine's speed drifts: on the 2-core virtual machine of the fidelity bench, the
Mixture-of-Experts model's one-thread step, timed alone on one core in 5-second windows,
moved between 2.6 and 3.7 ms within three minutes while the load average stayed under 1
(its data fill most of the last-level cache, which the host's other tenants share). A
prediction made from a profile taken in one such minute meets runs made in another, and
the difference is the machine's, not the cost model's. So the fidelity bench times this
reference (``reference_ms``) right after each profile and at the start of every round of
runs, and sets each error beside the drift between the two.

The reference runs in a process of its own, as a worker of one core runs: pinned to the
first allowed CPU, one intra-op thread, the heap policy of the profile and the workers
(``profilers.corun``'s neighbour, whose step it is). Its clock is the thread's CPU time,
the profile's clock at one thread, which other jobs holding the core do not inflate (what
they do to the caches they share, they do).

    python bench/_reference.py GRAPH.json [SECONDS]   # prints {"median_ms": ..., "steps": ...}
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def reference_ms(graph: Path, seconds: float = 2.0) -> float | None:
    """The median one-thread plain step (ms) of ``graph``'s model over ``seconds`` of
    steps in a fresh process (module doc); None where it fails (the bench goes on)."""
    out = subprocess.run([sys.executable, __file__, str(graph), str(seconds)],
                         capture_output=True, text=True, check=False)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])["median_ms"]
    except (IndexError, KeyError, ValueError):
        return None


def main() -> None:
    from dl_nfv.artifacts import BadInput, ModelRef, from_data
    from dl_nfv.profilers.corun import _settle_child, plain_step

    if len(sys.argv) not in (2, 3):
        _fail("usage: python bench/_reference.py GRAPH.json [SECONDS]")
    graph = Path(sys.argv[1])
    try:
        seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    except ValueError:
        _fail(f"error: SECONDS must be a number, got {sys.argv[2]!r}")
    _settle_child(min(os.sched_getaffinity(0)))  # before the model's first allocation
    try:
        model = from_data(ModelRef, json.loads(graph.read_text())["model"])
        step = plain_step(model, 0)  # (the bench profiles with the default seed)
    except (OSError, ValueError, KeyError, TypeError, BadInput) as exc:
        _fail(f"error: {graph}: no model to step ({type(exc).__name__}: {exc})")
    step()  # cold: the first touches every buffer
    times: list[float] = []
    began = time.perf_counter()
    while time.perf_counter() - began < seconds or len(times) < 3:
        c0 = time.thread_time()
        step()
        times.append(time.thread_time() - c0)
    print(json.dumps({"median_ms": round(statistics.median(times) * 1e3, 4), "steps": len(times)}))


def _fail(line: str) -> None:
    """Bad input: one line on stderr, exit 2."""
    print(line, file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
