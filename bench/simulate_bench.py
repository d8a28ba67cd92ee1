"""Simulator throughput: tasks per second and time per simulate() call on two large plans.

(a) data parallelism of ResNet-50 at op granularity on 64 GPUs (8 hosts x 8,
    NVLink inside, 100 Gbps NICs), AllReduce in 25 MB gradient buckets;
(b) GPT-2 XL cut into 8 pipeline stages of 6 blocks on 8 GPUs, 32
    microbatches, 1F1B schedule.

The op graphs are built from the architectures' layer shapes
(``dl_nfv.simulator.synthetic``), so the benchmark needs neither a profile
nor minutes of tracing. Each case is timed end to end (``simulate``: lowering,
engine, memory) and by phase, best of ``--repeat`` runs, after one warm-up run
that fills the cost model's caches (as a planner's search loop would).

With ``--zoo BATCH`` case (a) also runs on the model zoo's ResNet-50 traced
and profiled on this machine's CPU (``dl_nfv.profilers``), which checks that
the synthetic graph's size matches the real one.

Usage: python bench/simulate_bench.py [--repeat 5] [--no-record] [--profile] [--zoo 8]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _record import markdown_table, record_section  # noqa: E402

from dl_nfv.artifacts import (  # noqa: E402
    Fusion,
    Group,
    OpGraph,
    Pipeline,
    Plan,
    ScheduleKind,
    SyncMethod,
    fingerprint,
)
from dl_nfv.simulator import CostModel, simulate  # noqa: E402
from dl_nfv.simulator import synthetic as syn  # noqa: E402
from dl_nfv.simulator.engine import run  # noqa: E402
from dl_nfv.simulator.lower import lower  # noqa: E402
from dl_nfv.simulator.result import SimResult  # noqa: E402

BUCKET_BYTES = 25 * 2**20


def zoo_resnet50(batch_size: int) -> OpGraph:
    """ResNet-50 of the model zoo, traced and profiled here on the CPU (one timed round)."""
    try:
        from dl_nfv.profilers.model import profile_model
        from dl_nfv.profilers.zoo import model_ref
    except ImportError as exc:
        raise SystemExit(f"--zoo needs dl_nfv.profilers (model zoo and profile_model): {exc}") from None
    return profile_model(model_ref("resnet50", batch_size=batch_size), granularity="op",
                         repeats=1, warmup=0, device="cpu")


def resnet_dp(zoo_batch: int | None = None):
    graph = syn.resnet50(batch_size=64 * 32) if zoo_batch is None else zoo_resnet50(zoo_batch)
    topology = syn.cluster(8, 8, name="8x8-v100-100g")
    devices = topology.device_names
    ops = tuple(op.id for op in graph.ops)
    buckets: list[list[str]] = []
    size = 0.0
    index = graph.index
    for op_id in reversed(graph.topological_ids()):
        if index[op_id].param_bytes == 0:
            continue
        if not buckets or size >= BUCKET_BYTES:
            buckets.append([])
            size = 0.0
        buckets[-1].append(op_id)
        size += index[op_id].param_bytes
    plan = Plan(planner="bench", graph_sha256=fingerprint(graph),
                topology_sha256=fingerprint(topology), batch_size=graph.model.batch_size,
                groups=(Group(id="all", ops=ops, devices=devices),),
                fusion=Fusion(gradient_buckets=tuple(tuple(b) for b in buckets)))
    source = "synthetic" if zoo_batch is None else f"zoo, profiled on CPU at batch {zoo_batch}"
    return (f"ResNet-50 data parallel, 64 GPUs, op granularity ({source})", plan, graph,
            topology)


def gpt2_pipeline(stages: int = 8, microbatches: int = 32):
    graph = syn.gpt2(batch_size=microbatches)
    topology = syn.cluster(1, stages, name="1x8-v100-nvlink")
    devices = topology.device_names
    ids = [op.id for op in graph.ops]
    per = 48 // stages
    groups = []
    for s in range(stages):
        lo = 0 if s == 0 else ids.index(f"h{s * per}_ln1")
        hi = len(ids) if s == stages - 1 else ids.index(f"h{(s + 1) * per}_ln1")
        groups.append(Group(id=f"stage{s}", ops=tuple(ids[lo:hi]), devices=(devices[s],),
                            sync=SyncMethod.NONE))
    schedule = {devices[s]: syn.one_f_one_b(stages, microbatches, s) for s in range(stages)}
    plan = Plan(planner="bench", graph_sha256=fingerprint(graph),
                topology_sha256=fingerprint(topology), batch_size=graph.model.batch_size,
                groups=tuple(groups),
                pipeline=Pipeline(microbatches=microbatches, stages=tuple(g.id for g in groups),
                                  schedule_kind=ScheduleKind.ONE_F_ONE_B, schedule=schedule))
    return (f"GPT-2 XL pipeline, {stages} stages x {microbatches} microbatches (1F1B)", plan,
            graph, topology)


def measure(name, plan, graph, topology, repeat: int) -> dict:
    """Best-of-``repeat`` CPU time (process time: other jobs on a shared machine do not count)."""
    cm = CostModel(graph, topology)
    simulate(plan, graph, topology, cost_model=cm, check_fingerprints=False)  # warm caches
    best = {"total": float("inf"), "lower": float("inf"), "engine": float("inf"),
            "result": float("inf"), "wall": float("inf")}
    clock = time.process_time
    for _ in range(repeat):
        w0, t0 = time.perf_counter(), clock()
        result = simulate(plan, graph, topology, cost_model=cm, check_fingerprints=False)
        best["total"] = min(best["total"], clock() - t0)
        best["wall"] = min(best["wall"], time.perf_counter() - w0)
        t0 = clock()
        tasks = lower(plan, graph, topology, cm)
        t1 = clock()
        schedule = run(tasks)
        t2 = clock()
        SimResult(plan, graph, topology, cm, tasks, schedule)
        t3 = clock()
        best["lower"] = min(best["lower"], t1 - t0)
        best["engine"] = min(best["engine"], t2 - t1)
        best["result"] = min(best["result"], t3 - t2)
    n = len(result.tasks)
    edges = sum(result.tasks.ndeps)
    return {"case": name, "tasks": n, "edges": edges, "iteration_ms": result.iteration_ms,
            "total_s": best["total"], "wall_s": best["wall"], "lower_s": best["lower"], "engine_s": best["engine"],
            "result_s": best["result"], "tasks_per_s": n / best["total"],
            "engine_tasks_per_s": n / best["engine"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-record", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of each case")
    parser.add_argument("--zoo", type=int, default=None, metavar="BATCH",
                        help="also run (a) on the zoo's ResNet-50 traced and profiled on this CPU "
                             "at this batch size (minutes)")
    args = parser.parse_args()
    rows = []
    cases = [resnet_dp, gpt2_pipeline]
    if args.zoo:
        cases.insert(1, lambda: resnet_dp(args.zoo))
    for case in cases:
        name, plan, graph, topology = case()
        if args.profile:
            cm = CostModel(graph, topology)
            simulate(plan, graph, topology, cost_model=cm, check_fingerprints=False)
            prof = cProfile.Profile()
            prof.enable()
            simulate(plan, graph, topology, cost_model=cm, check_fingerprints=False)
            prof.disable()
            print(f"--- {name}")
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)
        r = measure(name, plan, graph, topology, args.repeat)
        rows.append(r)
    headers = ["case", "tasks", "dependencies", "simulated iteration ms", "simulate() CPU s",
               "simulate() wall s", "lowering s", "engine s", "memory/result s",
               "tasks/s (end to end)", "tasks/s (engine)"]
    table = markdown_table(headers, [
        [r["case"], r["tasks"], r["edges"], f"{r['iteration_ms']:.1f}", f"{r['total_s']:.3f}",
         f"{r['wall_s']:.3f}",
         f"{r['lower_s']:.3f}", f"{r['engine_s']:.3f}", f"{r['result_s']:.3f}",
         f"{r['tasks_per_s']:,.0f}", f"{r['engine_tasks_per_s']:,.0f}"] for r in rows])
    print(table)
    if not args.no_record:
        body = (table + "\n\nBest of "
                f"{args.repeat} runs after one warm-up run that fills the cost model's caches; "
                "CPU (process) time, so that other jobs on a shared machine do not count, and the "
                "best wall time beside it. "
                "Op graphs are built from the layer shapes (`dl_nfv.simulator.synthetic`); op "
                "times are the cost model's roofline estimates. `simulate()` = lowering + engine "
                "+ memory timeline; the report, critical path and trace are built only on demand "
                "and are not included. docs/simulator.md says where the time goes.")
        record_section("simulate", "Simulator throughput (tasks per second)", body)


if __name__ == "__main__":
    main()
