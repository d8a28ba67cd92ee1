"""The cost model's 1-core op times at a share of the batch against plain steps' CPU time.

For each model the benchmark

1. profiles it as the README does (``profile_model`` with the defaults: torch's threads,
   and every op again at 1 thread, each thread count with its rounds at an eighth of the
   batch);
2. asks the cost model for the summed forward and backward of every op on a one-core
   device of ``examples/topologies/local-cpu.yaml`` at the batch ``B`` and at ``B/2``,
   ``B/4``, ``B/8`` (what a data-parallel replica or a pipeline microbatch computes);
3. runs plain training steps (``loss(module(x)).backward()``, no instrumentation) at those
   batches on one pinned thread and takes the median CPU time of the thread.

A runtime worker of a one-core device computes like step 3, so the ratio predicted /
measured checks the profile's batch-independent parts and the instrumentation it takes
off the ops, without the runtime's own work or communication. CPU time is what other jobs
on a shared machine do not inflate (they do inflate cache misses: expect a few percent).

Usage: python bench/batch_scaling_bench.py [--models unet,moe,resnet50] [--quick]
       [--no-record (the default: it prints, docs/benchmarks.md has no section for it)]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dl_nfv.artifacts.io import load  # noqa: E402
from dl_nfv.profilers import zoo  # noqa: E402
from dl_nfv.profilers.model import profile_model  # noqa: E402
from dl_nfv.simulator.costs import CostModel  # noqa: E402

MODELS = {
    "unet": ("bench/models/unet.py:build", [(8, 3, 64, 64)], None),
    "moe": ("bench/models/moe.py:build", [(32, 256)], None),
    "prune": ("bench/models/prune.py:build", [(16, 32, 64)], None),
    "mlp": ("mlp", [], 64),
    "resnet50": ("resnet50", [], 4),
}


def plain_cpu_ms(ref, batch: int, steps: int) -> float:
    """Median CPU ms of the calling thread over ``steps`` plain steps at ``batch`` (after 2)."""
    workload = zoo.instantiate(ref, seed=0)
    module = workload.module.train()
    inputs, target = workload.make_batch(batch, 0)
    times = []
    for _ in range(steps + 2):
        module.zero_grad(set_to_none=True)
        t0 = time.thread_time()
        workload.loss(module(*inputs), target).backward()
        times.append(time.thread_time() - t0)
    return statistics.median(times[2:]) * 1e3


def run(model: str, quick: bool) -> list[tuple]:
    name, shapes, batch = MODELS[model]
    path = str(ROOT / name) if ":" in name else name
    ref = zoo.model_ref(path, batch_size=batch, input_shapes=shapes)
    graph = profile_model(ref, repeats=2 if quick else 3)
    cost = CostModel(graph, load(ROOT / "examples/topologies/local-cpu.yaml"))
    ids = [op.id for op in graph.ops]
    device = "local/cpu0"
    big = ref.batch_size
    threads, cpus = torch.get_num_threads(), sorted(os.sched_getaffinity(0))
    rows = []
    try:
        torch.set_num_threads(1)
        os.sched_setaffinity(0, cpus[:1])
        for b in sorted({big, max(1, big // 2), max(1, big // 4), max(1, big // 8)}, reverse=True):
            predicted = sum(cost.ops_ms(ids, device, b / big))
            measured = plain_cpu_ms(ref, b, 3 if quick else 7)
            rows.append((model, b, predicted, measured))
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, cpus)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="unet,moe")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps")
    parser.add_argument("--no-record", action="store_true",
                        help="accepted for symmetry with the other benches: nothing is recorded")
    args = parser.parse_args()
    print("| model | batch | predicted 1-core ms | plain step CPU ms | predicted / measured |")
    print("|---|---|---|---|---|")
    for model in args.models.split(","):
        if model not in MODELS:
            parser.error(f"--models: unknown {model!r} (one of {', '.join(MODELS)})")
        for m, b, predicted, measured in run(model, args.quick):
            print(f"| {m} | {b} | {predicted:.1f} | {measured:.1f} | {predicted / measured:.2f} |",
                  flush=True)
    print(f"\nload average (1 min): {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
