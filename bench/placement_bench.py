"""Placement benchmark: fastt against Baechi's m-TOPO/m-ETF/m-SCT, dp and single.

Part 1 (quality): real zoo models profiled at op granularity on this machine
(small batches, so that profiling on two CPU cores takes minutes), planned on
4 and 8 devices, homogeneous and heterogeneous, plus variants with every
device's memory capped so that no single device holds the model. Every plan
is scored by the shared simulator; the lower bound is the best of
``planners.bounds`` for any plan on those devices.

Part 2 (speed): planning time of every placement planner on synthetic
layered DAGs of 1k, 2k, 5k and 10k ops.

Run:  python bench/placement_bench.py [--quick] [--cache DIR] [--no-record]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _record import markdown_table, record_section  # noqa: E402

from dl_nfv.artifacts import InfeasiblePlan, from_document, load, save  # noqa: E402
from dl_nfv.planners import run  # noqa: E402
from dl_nfv.planners.bounds import lower_bound  # noqa: E402
from dl_nfv.simulator.costs import CostModel  # noqa: E402

GIB = 2**30
PLANNERS = ("fastt", "m-topo", "m-etf", "m-sct", "dp", "single")
BASELINES = PLANNERS[1:]
# (zoo name, batch size, sequence length or None)
MODELS = (("inception-v3", 4, None), ("gnmt", 4, 32), ("transformer", 4, 64),
          ("bert-large", 2, 64), ("resnet152", 4, None))
QUICK_MODELS = (("inception-v3", 2, None), ("gnmt", 2, 16))
SYNTHETIC_SIZES = (1000, 2000, 5000, 10000)


# ------------------------------------------------------------------ inputs
def profiled_graph(name: str, batch: int, seq_len: int | None, cache: Path):
    """The op graph of a zoo model, profiled here once and cached."""
    path = cache / f"{name}-b{batch}" f"{'-s' + str(seq_len) if seq_len else ''}.json"
    if path.exists():
        return load(path, expect="op-graph")
    from dl_nfv.profilers import profile_model, zoo

    started = time.perf_counter()
    graph = profile_model(zoo.model_ref(name, batch_size=batch, seq_len=seq_len),
                          granularity="op", repeats=2, warmup=1)
    save(graph, path)
    print(f"profiled {name} (batch {batch}) in {time.perf_counter() - started:.0f} s: "
          f"{len(graph.ops)} ops", flush=True)
    return graph


def topologies() -> dict[str, dict]:
    """hom-4/hom-8: V100s on NVLink; het-4/het-8: the HeteroG testbed (V100, 1080Ti, P100 hosts
    on 50/100 GbE); the 4-device ones keep the first hosts' devices."""
    topo_dir = ROOT / "examples" / "topologies"
    hom8 = yaml.safe_load((topo_dir / "v100x8-nvlink.yaml").read_text())
    het8 = yaml.safe_load((topo_dir / "heterog-testbed8.yaml").read_text())
    hom4 = copy.deepcopy(hom8)
    hom4["name"] = "v100x4-nvlink"
    hom4["hosts"][0]["devices"][0]["count"] = 4
    het4 = copy.deepcopy(het8)
    het4["name"] = "heterog-testbed4"
    het4["hosts"] = [h for h in het4["hosts"] if h["name"] in ("v100", "p100")]
    return {"hom-4": hom4, "hom-8": hom8, "het-4": het4, "het-8": het8}


def capped(doc: dict, graph) -> dict:
    """``doc`` with every device's memory capped below the model's parameters, gradients and
    optimizer state (so neither one device nor a data-parallel replica holds it), yet with
    the devices together holding 1.5 times what the whole model needs."""
    cm = CostModel(graph, from_document(copy.deepcopy(doc)))
    ops = [op.id for op in graph.ops]
    static = cm.static_bytes(ops)
    need = static + cm.activation_bytes(ops)
    n_devices = len(cm.cluster.devices)
    cap = max(0.6 * static, 1.5 * need / n_devices)
    out = copy.deepcopy(doc)
    out["name"] = doc["name"] + "-capped"
    for host in out["hosts"]:
        for spec in host["devices"]:
            spec["memory_gib"] = round(cap / GIB, 4)
    return out


def layered_graph(n_ops: int, seed: int = 0):
    """A synthetic layered DAG: layers of 1-8 ops, each op fed by 1-2 ops of the layer before,
    conv-like costs measured on 'cpu' (so every GPU time comes from the cost model)."""
    rng = random.Random(seed)
    ops, edges, previous = [], [], []
    i = 0
    while i < n_ops:
        layer = []
        for _ in range(min(rng.randint(1, 8), n_ops - i)):
            op_id = f"op{i}"
            flops = rng.uniform(2e8, 4e9)
            out = int(rng.uniform(2e5, 2e6))
            ops.append({"id": op_id, "name": op_id, "kind": "conv", "flops": flops,
                        "bwd_flops": 2 * flops, "bytes_accessed": flops / 30,
                        "param_bytes": int(rng.uniform(0, 1e6)), "output_bytes": out,
                        "fwd_ms": {"cpu": flops / 5e7}, "bwd_ms": {"cpu": 2 * flops / 5e7},
                        "splittable_dims": [0]})
            for src in rng.sample(previous, min(len(previous), rng.randint(1, 2))):
                edges.append({"src": src[0], "dst": op_id, "bytes": src[1]})
            layer.append((op_id, out))
            i += 1
        previous = layer
    return from_document({"kind": "op-graph", "schema_version": 1,
                          "model": {"name": f"layered-{n_ops}", "batch_size": 32},
                          "ops": ops, "edges": edges})


# ---------------------------------------------------------------- running
def plan_all(graph, topology) -> dict[str, tuple[float | None, float, str]]:
    """planner -> (simulated iteration ms or None when infeasible, planning s, fastt's winner)."""
    out = {}
    for name in PLANNERS:
        started = time.perf_counter()
        try:
            plan = run(name, graph, topology)
        except InfeasiblePlan:
            out[name] = (None, time.perf_counter() - started, "")
            continue
        winner = plan.notes[0].removeprefix("kept: ") if name == "fastt" else ""
        out[name] = (plan.prediction.iteration_ms, time.perf_counter() - started, winner)
    return out


def quality(models, cache: Path) -> tuple[list[list], list[str]]:
    rows, misses = [], []
    topos = topologies()
    for name, batch, seq in models:
        graph = profiled_graph(name, batch, seq, cache)
        for label, doc in topos.items():
            for memory in ("full", "capped"):
                tdoc = doc if memory == "full" else capped(doc, graph)
                topology = from_document(copy.deepcopy(tdoc))
                results = plan_all(graph, topology)
                cm = CostModel(graph, topology)
                devices = list(cm.cluster.device_names)
                bound = lower_bound(cm, devices, min_batch_fraction=1 / min(len(devices), batch)).ms
                fastt = results["fastt"][0]
                feasible = [results[b][0] for b in BASELINES if results[b][0] is not None]
                best = min(feasible) if feasible else None
                if fastt is None or (best is not None and fastt > best * (1 + 1e-6)):
                    misses.append(f"{name} {label} {memory}")
                shape = f"b{batch}" + (f" x {seq}" if seq else "")
                rows.append([f"{name} ({shape})", label, memory, len(graph.ops),
                             *(_ms(results[p][0]) for p in PLANNERS), f"{bound:.2f}",
                             f"{best / fastt:.3f}" if fastt and best else "-",
                             f"{fastt / bound:.2f}" if fastt else "-",
                             f"{results['fastt'][1]:.2f}", results["fastt"][2]])
                print(" | ".join(str(c) for c in rows[-1]), flush=True)
    return rows, misses


def time_one(name: str, n_ops: int, split: bool) -> dict:
    """Plan the synthetic graph of ``n_ops`` ops with ``name``; CPU and wall seconds."""
    topology = load(ROOT / "examples" / "topologies" / "heterog-testbed8.yaml")
    graph = layered_graph(n_ops)
    options = {} if split else {"split_critical": False}
    wall, cpu = time.perf_counter(), time.process_time()
    plan = run(name, graph, topology, **options)
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
            "iteration_ms": plan.prediction.iteration_ms, "edges": len(graph.edges)}


def speed(sizes) -> list[list]:
    """Each planning run in a fresh process, so that no run pays for another's memory."""
    rows = []
    for n in sizes:
        times = {}
        for label, name, split in (("fastt", "fastt", True), ("fastt-no-split", "fastt", False),
                                   ("m-topo", "m-topo", True), ("m-etf", "m-etf", True),
                                   ("m-sct", "m-sct", True)):
            out = subprocess.run([sys.executable, __file__, "--time-one", name, str(n),
                                  "split" if split else "no-split"],
                                 capture_output=True, text=True, check=True)
            times[label] = json.loads(out.stdout.strip().splitlines()[-1])
        baechi = min(times[p]["iteration_ms"] for p in ("m-topo", "m-etf", "m-sct"))
        rows.append([n, times["fastt"]["edges"],
                     *(f"{t['cpu_s']:.2f} / {t['wall_s']:.2f}" for t in times.values()),
                     f"{times['fastt']['iteration_ms']:.1f}",
                     f"{times['fastt-no-split']['iteration_ms']:.1f}", f"{baechi:.1f}"])
        print(" | ".join(str(c) for c in rows[-1]), flush=True)
    return rows


def _ms(value: float | None) -> str:
    return "OOM" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small models, 1k/2k ops only")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "dl-nfv-placement"),
                        help="where profiled graphs are kept between runs")
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument("--time-one", nargs=3, metavar=("PLANNER", "OPS", "SPLIT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.time_one:
        name, n_ops, split = args.time_one
        print(json.dumps(time_one(name, int(n_ops), split == "split")))
        return
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    models = QUICK_MODELS if args.quick else MODELS
    sizes = SYNTHETIC_SIZES[:2] if args.quick else SYNTHETIC_SIZES

    headers = ["model", "devices", "memory", "ops", *(f"{p} ms" for p in PLANNERS), "bound ms",
               "best baseline / fastt", "fastt / bound", "fastt plan s", "fastt winner"]
    q_rows, misses = quality(models, cache)
    speed_headers = ["ops", "edges", "fastt s", "fastt no-split s", "m-topo s", "m-etf s",
                     "m-sct s", "fastt ms", "fastt no-split ms", "best Baechi ms"]
    s_rows = speed(sizes)
    verdict = ("fastt is at most every feasible baseline on every case." if not misses else
               "fastt is slower than a baseline on: " + ", ".join(misses) + ".")
    body = (
        "Simulated iteration time (ms) of each planner's plan on the shared cost model and "
        "simulator. Models are profiled at op granularity on this machine's CPU at small "
        "batches (`b4 x 32`: batch 4, sequence length 32) (GPU times come from the cost model's roofline, calibrated per op on the CPU "
        "measurement). `hom` = V100s on NVLink (`v100x8-nvlink`, 4 or 8 of them), `het` = the "
        "HeteroG testbed (`heterog-testbed8`; 4 = its V100 and P100 hosts). `capped` sets every "
        "device's memory to max(60% of the model's parameters+gradients+optimizer state, 1.5 x "
        "the whole model's need / devices): no device holds the model, a data-parallel replica "
        "usually not either (dp and single are then OOM), the devices together hold it 1.5 "
        "times. The bound is the best lower bound of `planners/bounds/placement.py` for "
        "any plan on those devices. `fastt winner` is the candidate fastt kept.\n\n"
        f"{verdict}\n\n" + markdown_table(headers, q_rows)
        + "\n\nPlanning time on synthetic layered DAGs (layers of 1-8 conv-like ops, 1-2 "
          "inputs each, batch 32) on `heterog-testbed8` (8 devices), as `CPU s / wall s` of "
          "the planning process (the machine is shared: wall time includes waiting for a "
          "core). fastt's unreplication and split searches stop at 5 CPU seconds "
          "(`--time-limit`); `no-split` is `--no-split-critical` (list scheduling only). The "
          "last columns are the simulated iteration times.\n\n"
        + markdown_table(speed_headers, s_rows))
    print(verdict)
    if not args.no_record:
        record_section("placement", "Op placement: fastt vs Baechi, dp and single", body)


if __name__ == "__main__":
    main()
