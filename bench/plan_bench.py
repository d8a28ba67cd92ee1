"""Pipeline planner benchmark: `pipeline` against gpipe, 1f1b, pipedream and dp on five models x
five clusters, on the shared cost model and simulator; writes its table to docs/benchmarks.md.

Models are profiled for real (`dl-nfv profile model ... --granularity layer`, CPU, batch 32,
three timed rounds, medians) and cached in ``--cache``. The profiles the recorded table was
made from are kept in ``bench/profiles/`` (the default), so that the table can be made again
to the digit: the planners are deterministic and the GPU times come from the profiles (only
a plan whose search the time limit cuts, the TAG cluster's largest at 8x, moves with the
machine's speed); with an empty ``--cache`` the models are profiled on this machine (about 9
minutes) and every figure moves with its measurements. The GPU times the planners use are
the cost model's roofline estimates calibrated by those measurements. Goals:
`pipeline` never slower than a baseline; >= 1.5x the best of gpipe/1f1b/pipedream on the
heterogeneous and ring clusters; within 1.2x of its lower bound on at least half the cases;
every plan under 10 CPU s (the summary lists the plans over it and what took the time).
Every case is also planned by `exact` where the cluster's routes all cost the same.

A second table repeats the suite at 8x the batch (256 samples, 128 for GPT-2 XL): the measured graphs are
scaled by the cost model's own batch law (every op time ``fixed + (t - fixed) x 8``, with
the op's measured fixed part, else the launch overhead;
FLOPs, bytes moved, activations and edge bytes x 8, parameters unchanged), because
profiling at batch 256 on two CPU cores takes hours. It shows the regime real training
runs in (tens of samples per device) next to the measured one (2 to 4 per device).

A last table plans operator-level graphs of 250 to 900 ops (BERT-base with 3, 6 and 12
encoder layers and ResNet-50, written op by op in ``bench/models`` and profiled at op
granularity, kept in ``bench/profiles``) with `pipeline --max-replicas 1` and with `exact`
at one microbatch per sample, and gives `pipeline`'s ratio to `exact`'s optimal bottleneck
(goal: within 1.05x).

Usage:
    python bench/plan_bench.py                       # whole suite, records the section
    python bench/plan_bench.py --models resnet152 --topologies ring8-mixed --no-record
    python bench/plan_bench.py --scales 1            # the measured batch only
    python bench/plan_bench.py --ops-only            # the operator-level table only, put in
                                                     # place of its own in the recorded section
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _record import DOC, git_revision, markdown_table, record_section  # noqa: E402

from dl_nfv.artifacts import load, save  # noqa: E402
from dl_nfv.planners.compare import compare  # noqa: E402

# (zoo name, batch size, sequence length or None)
MODELS = {
    "gpt2-xl": ("gpt2-xl", 16, 16),  # batch 32 x 32 tokens needs > 18 GB to profile: OOM here
    "bert-large": ("bert-large", 32, 64),
    "resnet152": ("resnet152", 32, None),
    "vgg19": ("vgg19", 32, None),
    "inception-v3": ("inception-v3", 32, None),
}
TOPOLOGIES = {
    "v100x8-nvlink": "homogeneous",
    "a100-2x4-25g": "homogeneous",
    "tag-hetero16": "heterogeneous",
    "heterog-testbed8": "heterogeneous",
    "ring8-mixed": "ring",
}
BASELINES = ("gpipe", "1f1b", "pipedream")
# operator-level graphs (bench/models: BERT-base with 3, 6 and 12 encoder layers and
# ResNet-50 written op by op), profiled at op granularity; (model file, input shape, input
# dtype, cached profile). Planned on clusters whose routes cost the same between every
# pair of devices, where `exact` finds the optimal contiguous single-device split.
OP_MODELS = {
    "bert3-ops": ("bench/models/bert_ops.py:bert3", (32, 64), "int64", "bert3-ops-b32-s64-r3"),
    "bert6-ops": ("bench/models/bert_ops.py:bert6", (32, 64), "int64", "bert6-ops-b32-s64-r3"),
    "bert12-ops": ("bench/models/bert_ops.py:bert12", (32, 64), "int64", "bert12-ops-b32-s64-r3"),
    "resnet50-ops": ("bench/models/resnet_ops.py:resnet50", (16, 3, 224, 224), "float32",
                     "resnet50-ops-b16-r3"),  # batch 32 needs more than 16 GB to profile here
}
OP_TOPOLOGIES = ("v100x8-nvlink",)
CPU_LIMIT_S = 10.0  # CPU seconds a plan should take at most
# timed rounds per profile (medians): one round let a single slow step of the shared machine
# make one of BERT-large's 24 identical layers twice as slow as the rest
PROFILE_REPEATS = 3
PLANNERS = ("pipeline", *BASELINES, "dp")


def graph_for(model: str, cache: Path):
    """The layer-granularity op graph of ``model``, profiled on first use and cached."""
    from dl_nfv.profilers import profile_model
    from dl_nfv.profilers.zoo import model_ref

    name, batch, seq = MODELS[model]
    path = cache / f"{model}-b{batch}{f'-s{seq}' if seq else ''}-r{PROFILE_REPEATS}.json"
    if path.exists():
        graph = load(path, expect="op-graph")
        if any(op.bwd_flops and op.bwd_input_flops is None for op in graph.ops):
            graph = _with_input_flops(graph)  # profiled before they were counted
            save(graph, path)
        return graph
    print(f"profiling {model} (batch {batch}{f', seq {seq}' if seq else ''}) ...", file=sys.stderr)
    ref = model_ref(name, batch_size=batch, **({"seq_len": seq} if seq else {}))
    graph = profile_model(ref, granularity="layer", repeats=PROFILE_REPEATS)
    cache.mkdir(parents=True, exist_ok=True)
    save(graph, path)
    return graph


def _with_input_flops(graph):
    """``graph`` with every op's ``bwd_input_flops`` counted (the profiler's counting pass on
    the same model, granularity and batch; its times are kept)."""
    from dataclasses import replace

    from dl_nfv.artifacts import OpKind
    from dl_nfv.profilers.model import input_gradient_flops

    print(f"counting the input-gradient FLOPs of {graph.model.name} ...", file=sys.stderr)
    counted = input_gradient_flops(graph.model, graph.granularity,
                                   leaf_modules=graph.model.options.get("leaf_modules", ()))
    return replace(graph, ops=tuple(
        replace(op, bwd_input_flops=min(counted[op.id], op.bwd_flops))
        if op.id in counted and op.kind is not OpKind.INPUT else op for op in graph.ops))


def scaled(graph, factor: int):
    """``graph`` at ``factor`` x its batch by the cost model's batch law (see the module doc)."""
    from dataclasses import replace

    from dl_nfv.artifacts import CATALOG
    from dl_nfv.simulator import scale_by_batch

    if factor == 1:
        return graph

    def fixed_of(name: str, fixed: dict[str, float]) -> float:
        if name in fixed:
            return fixed[name]
        return CATALOG[name].launch_overhead_us / 1e3 if name in CATALOG else 0.0

    def times(measured: dict[str, float], fixed: dict[str, float]) -> dict[str, float]:
        return {name: scale_by_batch(ms, fixed_of(name, fixed), factor)
                for name, ms in measured.items()}

    ops = tuple(replace(op, flops=op.flops * factor, bwd_flops=op.bwd_flops * factor,
                        bwd_input_flops=(None if op.bwd_input_flops is None
                                         else op.bwd_input_flops * factor),
                        bytes_accessed=op.bytes_accessed * factor,
                        output_bytes=op.output_bytes * factor,
                        fwd_ms=times(op.fwd_ms, op.fwd_fixed_ms),
                        bwd_ms=times(op.bwd_ms, op.bwd_fixed_ms)) for op in graph.ops)
    edges = tuple(replace(e, bytes=e.bytes * factor) for e in graph.edges)
    model = replace(graph.model, batch_size=graph.model.batch_size * factor,
                    options={**graph.model.options, "scaled_from_batch": graph.model.batch_size})
    return replace(graph, model=model, ops=ops, edges=edges)


def op_graph_for(model: str, cache: Path):
    """The operator-level graph of ``model`` (``OP_MODELS``), profiled on first use and cached."""
    from dl_nfv.profilers import profile_model
    from dl_nfv.profilers.zoo import model_ref

    source, shape, dtype, stem = OP_MODELS[model]
    path = cache / f"{stem}.json"
    if path.exists():
        return load(path, expect="op-graph")
    print(f"profiling {model} at op granularity ...", file=sys.stderr)
    ref = model_ref(str(ROOT / source), input_shapes=[shape], input_dtypes=[dtype])
    graph = profile_model(ref, granularity="op", repeats=PROFILE_REPEATS)
    cache.mkdir(parents=True, exist_ok=True)
    save(graph, path)
    return graph


def bound_cpu_s(graph, topology) -> float:
    """CPU seconds of the pipeline family's bound, which the first pipeline-family planner of
    a case computes and the others reuse (``pipeline_bound`` keeps it); computed here, so the
    planners' own times below exclude it."""
    from dl_nfv.artifacts import TieSync
    from dl_nfv.planners.pipeline.planner import pipeline_bound
    from dl_nfv.planners.pipeline.problem import Problem

    cpu = time.process_time()
    pipeline_bound(Problem(graph, topology, tie_sync=TieSync.EXCHANGE))
    return time.process_time() - cpu


def run_case(graph, topology) -> dict:
    """Every planner and exact on one case: the compare rows plus CPU seconds per planner
    (the pipeline's including the family's bound, ``bound_cpu_s``, under ``"bound"``)."""
    rows = {"bound": (None, bound_cpu_s(graph, topology))}
    for name in (*PLANNERS, "exact"):
        cpu = time.process_time()
        (row,) = compare(graph, topology, [name])
        rows[name] = (row, time.process_time() - cpu + (rows["bound"][1] if name == "pipeline"
                                                        else 0.0))
    return rows


def over_limit(model: str, topo_name: str, rows: dict) -> list[str]:
    """A line for every plan of the case over ``CPU_LIMIT_S`` CPU seconds, saying what took it."""
    out = []
    for name, (_, cpu) in rows.items():
        if name == "bound" or cpu <= CPU_LIMIT_S:
            continue
        why = (f" (the family's lower bound {rows['bound'][1]:.1f} s, the search and "
               f"simulations {cpu - rows['bound'][1]:.1f} s)") if name == "pipeline" else ""
        out.append(f"  - {name} on {model} / {topo_name}: {cpu:.1f} s{why}")
    return out


def _exact_cell(rows: dict, pipe) -> str:
    """Exact's simulated ms and the pipeline's ratio to it, or why exact has no plan."""
    row, cpu = rows["exact"]
    if not row.feasible:
        return "n/a (routes differ)" if "same transfer cost" in row.error else "n/a"
    return f"{row.iteration_ms:.1f} ({pipe.iteration_ms / row.iteration_ms:.2f})"


def _ms(row) -> str:
    return f"{row.iteration_ms:.1f}" if row.feasible else "OOM" if "GiB" in row.error else "n/a"


def suite(graphs: dict, topologies: list[str]) -> str:
    """Run every case and return the markdown table with its goal summary."""
    table, summary = [], {"cases": 0, "never_slower": 0, "hetero": 0, "hetero_ok": 0,
                          "possible": 0, "within": 0, "max_plan_s": 0.0, "max_cpu_s": 0.0,
                          "seeded": 0}
    worst, slow = [], []
    for model, graph in graphs.items():
        for topo_name in topologies:
            topology = load(ROOT / "examples" / "topologies" / f"{topo_name}.yaml", expect="topology")
            rows = run_case(graph, topology)
            slow += over_limit(model, topo_name, rows)
            pipe, cpu = rows["pipeline"]
            base = {n: rows[n][0] for n in BASELINES}
            others = [rows[n][0].iteration_ms for n in PLANNERS
                      if n != "pipeline" and rows[n][0].feasible]
            best_pipe = min((r.iteration_ms for r in base.values() if r.feasible), default=None)
            summary["cases"] += 1
            if not pipe.feasible:
                table.append([model, topo_name, "infeasible: " + pipe.error[:60], *([""] * 13)])
                continue
            summary["never_slower"] += all(pipe.iteration_ms <= o * 1.0001 for o in others)
            speedup = best_pipe / pipe.iteration_ms if best_pipe else float("inf")
            ceiling = best_pipe / pipe.bound_ms if best_pipe and pipe.bound_ms else float("inf")
            if TOPOLOGIES.get(topo_name) in ("heterogeneous", "ring"):
                summary["hetero"] += 1
                summary["hetero_ok"] += speedup >= 1.5
                summary["possible"] += ceiling >= 1.5
            ratio = pipe.ratio_to_bound or float("inf")
            summary["within"] += ratio <= 1.2
            summary["max_plan_s"] = max(summary["max_plan_s"], pipe.plan_s or 0.0)
            summary["max_cpu_s"] = max(summary["max_cpu_s"], cpu)
            plan = pipe.plan
            chosen = plan.notes[0].split(";")[0].removeprefix("chosen: ") if plan.notes else ""
            summary["seeded"] += chosen.startswith("seed")
            if ratio > 1.2:
                worst.append((model, topo_name, ratio, plan.notes[-1]))
            table.append([
                model, topo_name, f"{pipe.iteration_ms:.1f}",
                "x".join(str(len(g.devices)) for g in plan.groups),
                str(plan.pipeline.microbatches if plan.pipeline else 1),
                plan.pipeline.schedule_kind.value if plan.pipeline else "dp", chosen,
                *(_ms(base[n]) for n in BASELINES), _ms(rows["dp"][0]),
                f"{speedup:.2f}x", f"{ceiling:.2f}x", f"{pipe.bound_ms:.1f} ({ratio:.2f})",
                _exact_cell(rows, pipe), f"{pipe.plan_s:.1f} / {cpu:.1f}",
            ])
            print(" | ".join(table[-1]), file=sys.stderr)
    headers = ["model", "cluster", "pipeline ms", "devices per stage", "m", "schedule",
               "chosen from", "gpipe", "1f1b", "pipedream", "dp", "vs best pipe baseline",
               "most possible", "bound ms (ratio)", "exact ms (pipeline's ratio)",
               "plan s wall / cpu"]
    lines = [markdown_table(headers, table), "",
             f"- `pipeline` never slower than any baseline: {summary['never_slower']}/{summary['cases']}",
             f"- heterogeneous and ring clusters with >= 1.5x over the best of gpipe/1f1b/pipedream: "
             f"{summary['hetero_ok']}/{summary['hetero']} (where the bound allows 1.5x at all: "
             f"{summary['possible']}/{summary['hetero']})",
             f"- within 1.2x of the lower bound: {summary['within']}/{summary['cases']}",
             f"- slowest plan: {summary['max_plan_s']:.1f} s wall, {summary['max_cpu_s']:.1f} s CPU",
             f"- plans won by a baseline's plan in the final pool: {summary['seeded']}",
             f"- plans over {CPU_LIMIT_S:.0f} CPU s (every planner and exact): {len(slow)}"]
    lines += slow
    if worst:
        lines.append("- above 1.2x of the bound (the bound's parts):")
        lines += [f"  - {m} on {t}: {r:.2f}x ({parts.removeprefix('bound parts (ms): ')})"
                  for m, t, r, parts in worst]
    return "\n".join(lines)


def bottleneck_ms(plan, graph, topology) -> float:
    """Exact's objective (``planners.exact.stages.evaluate``) of a plan of single-device stages."""
    from dl_nfv.planners.exact.stages import evaluate

    stages = [(g.ops, g.devices[0]) for g in plan.groups]
    m = plan.pipeline.microbatches if plan.pipeline else 1
    return evaluate(graph, topology, stages, microbatches=m).bottleneck_ms


def op_suite(graphs: dict, topologies: Sequence[str]) -> str:
    """`pipeline` restricted to one device per stage against `exact`, one microbatch per
    sample, on the operator-level graphs: the markdown table with its summary."""
    from dl_nfv.planners import run

    table, ratios, slow = [], [], []
    for model, graph in graphs.items():
        for topo_name in topologies:
            topology = load(ROOT / "examples" / "topologies" / f"{topo_name}.yaml",
                            expect="topology")
            m = graph.model.batch_size
            cpu = time.process_time()
            exact = run("exact", graph, topology, microbatches=m)
            exact_s = time.process_time() - cpu
            bound_s = bound_cpu_s(graph, topology)
            cpu = time.process_time()
            pipe = run("pipeline", graph, topology, microbatches=m, max_replicas=1)
            pipe_s = time.process_time() - cpu + bound_s
            best, got = bottleneck_ms(exact, graph, topology), bottleneck_ms(pipe, graph, topology)
            ratios.append(got / best)
            if pipe_s > CPU_LIMIT_S:
                slow.append(f"  - pipeline on {model} / {topo_name}: {pipe_s:.1f} s (the "
                            f"family's lower bound {bound_s:.1f} s, the search and "
                            f"simulations {pipe_s - bound_s:.1f} s)")
            table.append([model, str(len(graph.ops)), exact.notes[1].split(" (")[0], str(m),
                          f"{best:.2f}", f"{got:.2f} ({got / best:.3f})",
                          str(len(pipe.groups)), f"{exact.prediction.iteration_ms:.1f}",
                          f"{pipe.prediction.iteration_ms:.1f}",
                          f"{exact_s:.1f} / {pipe_s:.1f}"])
            print(" | ".join(table[-1]), file=sys.stderr)
    headers = ["model", "ops", "ideals of blocks", "m", "exact bottleneck ms",
               "pipeline bottleneck ms (ratio)", "pipeline stages", "exact simulated ms",
               "pipeline simulated ms", "CPU s exact / pipeline"]
    within = sum(r <= 1.05 for r in ratios)
    lines = [markdown_table(headers, table), "",
             f"- `pipeline --max-replicas 1` within 1.05x of `exact`'s bottleneck: "
             f"{within}/{len(ratios)} (largest ratio {max(ratios, default=0):.3f})",
             f"- plans over {CPU_LIMIT_S:.0f} CPU s: {len(slow)}", *slow]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--scales", default="1,8", help="batch multiples to run (1 = as measured)")
    parser.add_argument("--cache", type=Path, default=ROOT / "bench" / "profiles",
                        help="where profiled op graphs are kept between runs (default: the "
                             "profiles the recorded table was made from; an empty folder "
                             "profiles the models on this machine)")
    parser.add_argument("--op-models", default=",".join(OP_MODELS),
                        help="operator-level graphs planned against exact ('' for none)")
    parser.add_argument("--ops-only", action="store_true",
                        help="only the operator-level graphs; recorded in place of their table "
                             "in the recorded section, the rest of it left as it is")
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if args.ops_only:
        graphs = {m: op_graph_for(m, args.cache) for m in args.op_models.split(",") if m}
        body = op_suite(graphs, OP_TOPOLOGIES) + "\n\n" + OP_NOTE
        print(body)
        if not args.no_record:
            record_op_table(body, " ".join(["python", *sys.argv]))
        return 0
    measured = {m: graph_for(m, args.cache) for m in args.models.split(",")}
    topologies = args.topologies.split(",")
    parts = []
    for factor in (int(x) for x in args.scales.split(",")):
        graphs = {m: scaled(g, factor) for m, g in measured.items()}
        title = ("As measured (batch 32; GPT-2 XL 16)" if factor == 1 else
                 f"{factor}x the measured batch (256; GPT-2 XL 128): the measured graphs scaled "
                 f"by the cost model's batch law (what-if)")
        parts.append(f"### {title}\n\n" + suite(graphs, topologies))
    op_models = [m for m in args.op_models.split(",") if m]
    if op_models:
        graphs = {m: op_graph_for(m, args.cache) for m in op_models}
        parts.append(f"{OP_TITLE}\n\n" + op_suite(graphs, OP_TOPOLOGIES) + "\n\n" + OP_NOTE)
    text = "\n\n".join(parts) + "\n\n" + NOTE
    print(text)
    if not args.no_record:
        record_section("plan_bench", "Pipeline planner vs baselines (bench/plan_bench.py)", text)
    return 0


OP_TITLE = "### Operator-level graphs: `pipeline` with one device per stage against `exact`"


def record_op_table(body: str, command: str, doc: Path = DOC) -> None:
    """Put ``body`` in place of the operator-level table (its heading up to the suite's
    closing note) in the recorded section, saying the command and code it came from."""
    text = doc.read_text()
    start, end = "<!-- bench:plan_bench -->", "<!-- /bench:plan_bench -->"
    if start not in text or end not in text:
        raise SystemExit(f"{doc} has no recorded plan_bench section: run the whole suite")
    before, rest = text.split(start, 1)
    section, after = rest.split(end, 1)
    if OP_TITLE not in section or NOTE[:60] not in section:
        raise SystemExit("the recorded section has no operator-level table: run the whole suite")
    head, tail = section.split(OP_TITLE, 1)
    tail = tail[tail.index(NOTE[:60]):]
    table = (f"{OP_TITLE}\n\nRecorded on its own: `{command}` at revision {git_revision()} (the "
             f"rest of this section at the revision above).\n\n{body.strip()}\n\n")
    doc.write_text(before + start + head + table + tail + end + after)


NOTE = ("Models profiled on this machine's CPU at layer granularity, batch 32 (BERT-large with "
        "sequence 64; GPT-2 XL batch 16 with sequence 16, since profiling it at 32 x 32 needs more "
        "than the 18 GB this shared machine could give it; full sequences are too slow on two "
        "cores), the median of three timed rounds per op; GPU times are the cost model's "
        "roofline estimates calibrated by those measurements, and every iteration time is the shared simulator's. `vs best "
        "pipe baseline`: the best of gpipe/1f1b/pipedream over `pipeline`; `most possible`: "
        "that baseline over the lower bound (no plan can beat the bound, so no planner can reach "
        "1.5x where this is below 1.5x); `exact ms`: `plan exact`'s plan (the split into "
        "single-device stages with the least bottleneck load), simulated, where every pair of "
        "devices sees the same route, and `pipeline`'s simulated time over it; `devices per stage` lists each stage's replicas; "
        "plan time is wall / CPU seconds (the machine is shared: wall includes waiting for a "
        "core).")


OP_NOTE = ("BERT-base with 3, 6 and 12 encoder layers (batch 32, sequence 64) and ResNet-50 "
           "(batch 16) written op by op in bench/models, profiled on this machine's CPU at op "
           "granularity (three timed rounds); the V100 times are the cost model's roofline "
           "estimates calibrated by them. Both planners plan one microbatch per sample. The "
           "bottleneck is exact's objective (docs/planners/exact.md) of each plan's stages: "
           "the largest per-iteration compute or received transfer of a stage; `exact` "
           "minimises it over every contiguous split of the graph's ideals (keeping each shape "
           "query with its producer), so no ratio is below 1 by more than such an op's "
           "microseconds. `pipeline` chooses by the simulated iteration time, which also counts "
           "filling and draining the pipeline. CPU seconds of `pipeline` include the family's "
           "lower bound.")


if __name__ == "__main__":
    raise SystemExit(main())
