"""HeteroG benchmark: `heterog` against the four data-parallel baselines, fastt and pipeline on
zoo models x three heterogeneous clusters, on the shared cost model and simulator.

Models: the profiles kept in ``bench/profiles/`` (VGG-19, ResNet-152, Inception-v3 and
BERT-large at batch 32, GPT-2 XL at batch 16, at layer granularity; Transformer base at
op granularity, profiled at batch 8 on one thread and scaled to batch 32 by the cost
model's batch law, ``plan_bench.scaled``, as the DisCo bench does); profiled on CPU by
`dl-nfv profile model`, the GPU times the cost model's roofline estimates calibrated by
those measurements. GPT-2 XL stays for the cases where every data-parallel baseline is
out of memory.
Clusters: ``heterog-testbed8`` (V100, 1080Ti, P100 on 100/50 GbE), ``tag-hetero16`` (V100,
1080Ti, P100 on 22.5 Gbps) and ``mixed-a100-t4-2rack`` (A100 and T4 racks with
oversubscribed uplinks).

Sections:

1. Every case: simulated iteration ms of each planner ("OOM" where the plan cannot fit),
   heterog's speed-up over the best DP baseline, and heterog's planning seconds (the
   shipped policy, its default refinement budget). Goals: >= 1.5x the best DP baseline
   on at least half the cases, never slower, a plan wherever every DP baseline is out of
   memory, planning under 60 s.
2. Generalisation: the cases whose model or cluster the shipped policy was not trained
   on (read from the policy's header), planned with the shipped policy and with a policy
   trained by the same recipe on every model and cluster of the bench (trained here;
   goal: the shipped policy's plan within 10% of the one that saw the case).
3. The learning matters: from the shipped policy's strategy, a greedy list-scheduling
   strategy and a random one (seeded), hill climbing with the same budget of simulations
   (``--budget``); both the start and the refined iteration ms are listed.

Simulated times are deterministic where the evaluation caps bind (they do at the default
budgets on an unloaded machine); planning seconds are wall time on whatever machine runs
it. Usage:

    python bench/heterog_bench.py                 # everything, records the section
    python bench/heterog_bench.py --quick --no-record
    python bench/heterog_bench.py --models transformer --sections main   # one model, printed
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _record import markdown_table, record_section  # noqa: E402
from plan_bench import scaled  # noqa: E402

from dl_nfv.artifacts import InfeasiblePlan, load, save  # noqa: E402
from dl_nfv.planners import run  # noqa: E402
from dl_nfv.planners.heterog import (  # noqa: E402
    BASELINES,
    DEFAULT_POLICY,
    ORDER_EVALUATIONS,
    PIPELINE_EVALUATIONS,
    greedy_start,
    learn,
    load_policy,
    problem_of,
    random_start,
)
from dl_nfv.planners.learned.decoder import greedy  # noqa: E402
from dl_nfv.planners.learned.policy import read_policy  # noqa: E402
from dl_nfv.planners.learned.refine import refine  # noqa: E402

PROFILES = ROOT / "bench" / "profiles"
TOPOLOGY_DIR = ROOT / "examples" / "topologies"
MODELS = {"vgg19": "vgg19-b32-r3", "resnet152": "resnet152-b32-r3",
          "inception-v3": "inception-v3-b32-r3", "bert-large": "bert-large-b32-s64-r3",
          "gpt2-large": "gpt2-large-b16-s16-r3", "gpt2-xl": "gpt2-xl-b16-s16-r3",
          "transformer": "transformer-ops-b8-s64-r1"}
SCALE = {"transformer": 4}  # to the bench's batch of 32
TOPOLOGIES = ("heterog-testbed8", "tag-hetero16", "mixed-a100-t4-2rack")
OTHERS = ("fastt", "pipeline")
QUICK_MODELS = ("vgg19", "inception-v3")
QUICK_TOPOLOGIES = ("heterog-testbed8", "mixed-a100-t4-2rack")
SEARCH_S = 50.0  # CPU seconds: a safety net; the evaluation cap binds first
TITLE = "HeteroG vs data parallelism, fastt and pipeline (bench/heterog_bench.py)"
SECTIONS = ("main", "generalisation", "learning")


def _plan_ms(name: str, graph, topology, **options) -> tuple[float, float, str]:
    """(iteration ms or inf for OOM, planning wall s, the plan's last note)."""
    t0 = time.perf_counter()
    try:
        plan = run(name, graph, topology, **options)
    except InfeasiblePlan:
        return math.inf, time.perf_counter() - t0, ""
    return plan.prediction.iteration_ms, time.perf_counter() - t0, (plan.notes or ("",))[-1]


def _heterog(graph, topology, **options) -> tuple[float, float, float, str]:
    """heterog's (iteration ms or inf, planning wall s, planning CPU s, what its plan's order
    is: ``yes`` for an order from group priorities, ``no`` where the simulator's ready-task
    order was kept, ``M mb`` for a pipeline of M microbatches, ``DP`` where a data-parallel
    baseline was)."""
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        plan = run("heterog", graph, topology, **options)
    except InfeasiblePlan:
        return math.inf, time.perf_counter() - t0, time.process_time() - c0, "-"
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    kind = ("DP" if any("data-parallel baseline" in n for n in plan.notes)
            else f"{plan.pipeline.microbatches} mb" if plan.pipeline is not None
            else "yes" if plan.order else "no")
    return plan.prediction.iteration_ms, wall, cpu, kind


def graph_of(model: str):
    """The bench's op graph of ``model`` (``MODELS``, at ``SCALE`` x its profiled batch)."""
    return scaled(load(PROFILES / f"{MODELS[model]}.json", expect="op-graph"), SCALE.get(model, 1))


def _ms(value: float) -> str:
    return "OOM" if math.isinf(value) else f"{value:.1f}"


def main_table(graphs, topologies, args) -> tuple[str, dict]:
    """Section 1; returns its markdown and heterog's ms per case."""
    rows, heterog_ms, speedups, worst_s, worst_cpu = [], {}, [], 0.0, 0.0
    slower, rescued, all_oom, ordered, piped = [], 0, 0, 0, 0
    for m, graph in graphs.items():
        for t, topology in topologies.items():
            base = {b: _plan_ms(b, graph, topology)[0] for b in BASELINES}
            other = {o: _plan_ms(o, graph, topology)[0] for o in OTHERS}
            ms, seconds, cpu, order = _heterog(graph, topology, max_evaluations=args.evaluations,
                                               search_s=SEARCH_S)
            heterog_ms[(m, t)] = ms
            best = min(base.values())
            worst_s, worst_cpu = max(worst_s, seconds), max(worst_cpu, cpu)
            ordered += order == "yes"
            piped += order.endswith(" mb")
            if math.isinf(best):
                all_oom += 1
                rescued += not math.isinf(ms)
                gain = "-"
            else:
                speedups.append(best / ms)
                gain = f"{best / ms:.2f}x"
                if ms > best * (1 + 1e-9):
                    slower.append(f"{m}/{t}")
            rows.append([m, t, *(_ms(base[b]) for b in BASELINES), *(_ms(other[o]) for o in OTHERS),
                         _ms(ms), gain, order, f"{seconds:.1f}", f"{cpu:.1f}"])
            print(" | ".join(map(str, rows[-1])), flush=True)
    table = markdown_table(["model", "cluster", *BASELINES, *OTHERS, "heterog", "vs best DP",
                            "order", "plan s", "plan CPU s"], rows)
    wins = sum(s >= 1.5 for s in speedups)
    summary = (f"heterog >= 1.5x the best DP baseline in {wins} of {len(speedups)} cases where "
               f"one fits; slower than it in {len(slower)} ({', '.join(slower) or 'none'}); "
               f"a plan in {rescued} of the {all_oom} cases where every DP baseline is out of "
               f"memory; planning at most {worst_s:.1f} s wall ({worst_cpu:.1f} CPU s; wall time "
               f"moves with the machine's load). An execution order from group priorities in "
               f"{ordered} of {len(rows)} cases, a pipeline of microbatches in {piped} (order: yes; "
               f"no: the simulator's ready-task order was faster; M mb: M microbatches; DP: a "
               f"data-parallel baseline was kept).")
    return f"{table}\n\n{summary}", heterog_ms


def held_out_table(graphs, topologies, heterog_ms, args) -> str:
    """Section 2: the shipped policy against one trained on every model and cluster here."""
    shipped = read_policy(DEFAULT_POLICY)
    seen_graphs, seen_topologies = set(shipped.trained_on.graphs), set(shipped.trained_on.topologies)
    cases = [(m, t) for m in graphs for t in topologies
             if MODELS[m] not in seen_graphs or t not in seen_topologies]
    if not cases:
        return "The shipped policy saw every model and cluster of this run."
    path = Path(tempfile.mkdtemp(prefix="heterog-bench-")) / "all.policy.json"
    t0 = time.process_time()
    policy = learn([(MODELS[m], g) for m, g in graphs.items()], list(topologies.items()),
                   episodes=args.episodes, seed=0, search_s=args.train_search_s)
    save(policy, path)
    train_s = time.process_time() - t0
    rows, within = [], 0
    for m, t in cases:
        ms_seen = _plan_ms("heterog", graphs[m], topologies[t], policy=str(path),
                           max_evaluations=args.evaluations, search_s=SEARCH_S)[0]
        ms = heterog_ms[(m, t)]
        ratio = ms / ms_seen
        within += ratio <= 1.10
        rows.append([m, t, _ms(ms), _ms(ms_seen), f"{ratio:.2f}"])
    table = markdown_table(["model", "cluster", "shipped policy ms", "policy that saw it ms",
                            "ratio"], rows)
    held = sorted({m for m, _ in cases if MODELS[m] not in seen_graphs}
                  | {t for _, t in cases if t not in seen_topologies})
    return (f"Held out of the shipped policy's training: {', '.join(held)}. The policy that saw "
            f"them: {args.episodes} episodes over every model and cluster above, "
            f"{train_s:.0f} CPU s to train.\n\n{table}\n\nWithin 10%: {within} of {len(cases)}.")


def learning_table(graphs, topologies, args) -> str:
    """Section 3: the same refinement budget from three starts."""
    network = load_policy(read_policy(DEFAULT_POLICY))
    rows, wins = [], {"greedy": 0, "random": 0}
    for m, graph in graphs.items():
        for t, topology in topologies.items():
            problem = problem_of(graph, topology)
            env = problem.env
            starts = {"policy": greedy(network, env, problem.graph), "greedy": greedy_start(env),
                      "random": random_start(env, 0)}
            got = {k: refine(env, s, max_evaluations=args.budget, time_limit_s=1e9)
                   for k, s in starts.items()}
            cells = []
            for r in got.values():
                start = r.start.iteration_ms if r.start.feasible else math.inf
                end = r.outcome.iteration_ms if r.outcome.feasible else math.inf
                cells += [_ms(start), _ms(end)]
            for k in wins:
                wins[k] += got["policy"].outcome.reward > got[k].outcome.reward
            rows.append([m, t, *cells])
    n = len(rows)
    table = markdown_table(["model", "cluster", "policy start", "refined", "greedy start", "refined",
                            "random start", "refined"], rows)
    return (f"Hill climbing with {args.budget} simulations from each start (OOM: the strategy "
            f"overflows memory). The policy's refined strategy is faster than the greedy "
            f"start's in {wins['greedy']} of {n} cases and than the random start's in "
            f"{wins['random']} of {n}.\n\n{table}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--quick", action="store_true",
                        help="two models on two clusters, small budgets: a smoke run")
    parser.add_argument("--evaluations", type=int, default=2000,
                        help="heterog's refinement budget (simulations)")
    parser.add_argument("--budget", type=int, default=300,
                        help="simulations per start in the learning section")
    parser.add_argument("--episodes", type=int, default=4500,
                        help="episodes for the policy that sees every case")
    parser.add_argument("--train-search-s", type=float, default=15.0)
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help="which sections to run (recording needs all three)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    sections = args.sections.split(",")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    if set(sections) != set(SECTIONS):
        args.no_record = True
    models, topos = args.models.split(","), args.topologies.split(",")
    if args.quick:
        models, topos = list(QUICK_MODELS), list(QUICK_TOPOLOGIES)
        args.evaluations, args.budget, args.episodes, args.train_search_s = 300, 100, 200, 2.0
    graphs = {m: graph_of(m) for m in models}
    topologies = {t: load(TOPOLOGY_DIR / f"{t}.yaml", expect="topology") for t in topos}
    first, heterog_ms = main_table(graphs, topologies, args)
    print(first)
    if "generalisation" in sections:
        print(second := held_out_table(graphs, topologies, heterog_ms, args))
    if "learning" in sections:
        print(third := learning_table(graphs, topologies, args))
    if args.no_record:
        return
    body = (f"Simulated iteration ms on the shared cost model (deterministic: the refinement's "
            f"evaluation caps bind; the machine's load does not change them); planning seconds "
            f"are wall time on a busy shared machine and move with its load, CPU seconds less "
            f"so. heterog: the shipped policy, at most {args.evaluations} simulations of "
            f"refinement, {ORDER_EVALUATIONS} of the order search and {PIPELINE_EVALUATIONS} "
            f"of the micro-batched refinement (dl-nfv's extension: up to 32 microbatches; the "
            f"learning section refines at one batch, HeteroG's published space).\n\n{first}\n\n### Generalisation\n\n{second}\n\n"
            f"### The learning matters\n\n{third}")
    record_section("heterog_bench", TITLE, body)


if __name__ == "__main__":
    main()
