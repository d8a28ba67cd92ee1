"""DisCo benchmark: `disco` against DDP (`dp-no-fusion`), Horovod (`dp-horovod`) and
XLA-like fusion (`dp-xla-like`), and the ideal-overlap bound, on the shared cost model.

Models: op-granularity profiles kept in ``bench/profiles/`` (ResNet-50 and BERT-base
written op by op, VGG-19, Inception-v3, GPT-2 small and the Transformer base of the zoo,
profiled on CPU by `dl-nfv profile model --granularity op`), scaled to the bench's
global batch by the cost model's batch law (``plan_bench.scaled``); the GPU times are the
cost model's roofline estimates calibrated by those measurements. Clusters:
``v100x8-nvlink``, ``a100-2x4-100g`` and ``ring8-mixed``; data parallelism over every
device.

Columns: simulated iteration ms of each plan, the ideal-overlap bound (max of compute
under maximal fusion and one AllReduce of every gradient), disco over the bound and the
best baseline over disco. Goals: disco within 1.1x of the bound on every case, at least
1.15x faster than the best baseline on half of them. The simulated times are
deterministic where the evaluation cap stops the search (``--evaluations``); the CPU
time limit is a safety net. Usage:

    python bench/disco_bench.py                    # every case, records the section
    python bench/disco_bench.py --quick --no-record
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _record import markdown_table, record_section  # noqa: E402
from plan_bench import scaled  # noqa: E402

from dl_nfv.artifacts import load  # noqa: E402
from dl_nfv.planners import run  # noqa: E402

PROFILES = ROOT / "bench" / "profiles"
TOPOLOGY_DIR = ROOT / "examples" / "topologies"
# model -> (cached op-granularity profile, batch scale factor to the bench's global batch)
MODELS = {
    "resnet50": ("resnet50-ops-b16-r3", 8),
    "vgg19": ("vgg19-ops-b4-r1", 8),
    "inception-v3": ("inception-v3-ops-b4-r1", 8),
    "bert-base": ("bert12-ops-b32-s64-r3", 1),
    "gpt2-small": ("gpt2-small-ops-b4-s128-r1", 8),
    "transformer": ("transformer-ops-b8-s64-r1", 4),
}
TOPOLOGIES = ("v100x8-nvlink", "a100-2x4-100g", "ring8-mixed")
BASELINES = ("dp-no-fusion", "dp-horovod", "dp-xla-like")
QUICK_MODELS = ("resnet50", "vgg19")
QUICK_TOPOLOGIES = ("v100x8-nvlink", "ring8-mixed")
TITLE = "DisCo vs DDP, Horovod and XLA-like fusion (bench/disco_bench.py)"


def graph_of(model: str):
    stem, factor = MODELS[model]
    return scaled(load(PROFILES / f"{stem}.json", expect="op-graph"), factor)


def run_case(graph, topology, *, evaluations: int, time_limit: float) -> dict:
    """Every planner's plan on one case: name -> (iteration ms, planning s), and the bound."""
    out = {}
    for name in (*BASELINES, "disco"):
        options = {"max_evaluations": evaluations, "time_limit": time_limit} if name == "disco" else {}
        t0 = time.perf_counter()
        plan = run(name, graph, topology, **options)
        out[name] = (plan.prediction.iteration_ms, time.perf_counter() - t0)
        out["bound"] = plan.bound_ms
    return out


def suite(models, topologies, *, evaluations: int, time_limit: float) -> tuple[str, str]:
    rows, within, faster, cases = [], 0, 0, 0
    for model in models:
        graph = graph_of(model)
        for topo_name in topologies:
            topology = load(TOPOLOGY_DIR / f"{topo_name}.yaml", expect="topology")
            r = run_case(graph, topology, evaluations=evaluations, time_limit=time_limit)
            disco_ms, bound = r["disco"][0], r["bound"]
            best = min(r[b][0] for b in BASELINES)
            cases += 1
            within += disco_ms <= 1.1 * bound
            faster += best / disco_ms >= 1.15
            rows.append([model, topo_name, *(f"{r[b][0]:.1f}" for b in BASELINES),
                         f"{disco_ms:.1f}", f"{bound:.1f}", f"{disco_ms / bound:.2f}x",
                         f"{best / disco_ms:.3f}x", f"{r['disco'][1]:.1f}"])
            print(" | ".join(str(c) for c in rows[-1]), file=sys.stderr)
    table = markdown_table(["model", "cluster", *(f"{b} ms" for b in BASELINES), "disco ms",
                            "bound ms", "disco / bound", "best baseline / disco",
                            "disco plan s"], rows)
    summary = (f"disco within 1.1x of the ideal-overlap bound on {within} of {cases} cases "
               f"(goal: all); at least 1.15x faster than the best baseline on {faster} of "
               f"{cases} (goal: half); search capped at {evaluations} simulated candidates "
               f"or {time_limit:g} CPU s.")
    return table, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two models on two clusters, "
                        "a small search budget")
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument("--evaluations", type=int, default=150,
                        help="candidates disco may simulate per case")
    parser.add_argument("--time-limit", type=float, default=30.0,
                        help="CPU seconds disco may search per case")
    args = parser.parse_args(argv)
    models, topologies = (QUICK_MODELS, QUICK_TOPOLOGIES) if args.quick else (MODELS, TOPOLOGIES)
    evaluations = 40 if args.quick else args.evaluations
    table, summary = suite(models, topologies, evaluations=evaluations,
                           time_limit=args.time_limit)
    body = f"{table}\n\n{summary}\n"
    print(body)
    if not args.no_record and not args.quick:
        record_section("disco_bench", TITLE, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
