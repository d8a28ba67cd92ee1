"""TAG benchmark: `tag` against heterog, fastt, pipeline and the four data-parallel baselines
on the heterog bench's models and clusters plus generated clusters the shipped policy never
saw, on the shared cost model and simulator.

Cases: the models and clusters of ``bench/heterog_bench.py`` (imported from it), plus
``GENERATED``: three ``random:`` topologies (``planners/tag/topogen.py``) of seeds the
shipped policy was not trained on (checked against its header).

Sections:

1. Every case: simulated iteration ms of each planner ("OOM" where the plan cannot fit),
   tag's speed-up over the best DP baseline and over the best other planner, and tag's
   planning seconds (shipped policy, ``--playouts``, its default refinement, SFB on, the
   ``--others`` planners' plans, by default pipeline's and heterog's, as seeds and
   fallbacks). Also tag's start (the best of its incumbent and the seeds as TAG
   strategies) and its own result (search and refinement, before the fallbacks and SFB)
   with its batching, read from its notes, and how often the own result beats the start
   and the seed plans themselves.
   Goals: tag never slower than the best of the others; >= 1.3x the best DP baseline on
   at least half the cases.
2. The GNN earns its place: the tree search alone (no refinement, no seeds, no
   fallback; the batching its first decision) from the same incumbent with the shipped
   policy's priors and values and with uniform priors, at 100 and 400 playouts; the
   search's ms over the best DP baseline's (lower is better), and how often the GNN's is
   strictly faster.
3. Unseen topologies: the shipped policy fine-tuned for ``--tune-iterations`` iterations
   on the generated clusters and the bench's models (``learn(init=...)``, as
   `dl-nfv plan learn tag --init`), then tag (no seeds from other planners, so the policy
   decides) with the shipped and the fine-tuned policy on each (model, generated
   cluster). Goal: the shipped policy within 10% of the fine-tuned one.

Simulated times are deterministic (the playout and evaluation caps bind before the CPU
time limits on an unloaded machine); planning seconds are wall time and move with the
machine's load. Usage:

    python bench/tag_bench.py                 # everything, records the section
    python bench/tag_bench.py --quick --no-record
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _record import markdown_table, record_section  # noqa: E402
from heterog_bench import (  # noqa: E402
    MODELS,
    OTHERS,
    PROFILES,
    QUICK_MODELS,
    QUICK_TOPOLOGIES,
    TOPOLOGIES,
    TOPOLOGY_DIR,
    _ms,
    _plan_ms,
)

from dl_nfv.artifacts import InfeasiblePlan, load, save  # noqa: E402
from dl_nfv.planners import run  # noqa: E402
from dl_nfv.planners.heterog import (  # noqa: E402
    BASELINES,
    best_baseline,
    better_start,
    greedy_start,
    problem_of,
)
from dl_nfv.planners.learned.policy import read_policy  # noqa: E402
from dl_nfv.planners.tag.batching import batchings  # noqa: E402
from dl_nfv.planners.tag.learn import learn  # noqa: E402
from dl_nfv.planners.tag.mcts import search  # noqa: E402
from dl_nfv.planners.tag.planner import (  # noqa: E402
    DEFAULT_GROUPS,
    DEFAULT_POLICY,
    load_net,
)
from dl_nfv.planners.tag.topogen import generate  # noqa: E402

GENERATED = (1000, 1001, 1002)
TITLE = "TAG vs heterog, fastt, pipeline and data parallelism (bench/tag_bench.py)"
PLAYOUTS = (100, 400)
TUNE_PLAYOUTS = 64  # per search while fine-tuning, as the shipped policy was trained


def main_table(graphs, topologies, args) -> str:
    """Section 1."""
    rows, vs_dp, slower, worst_s, improved, beat_seeds = [], [], [], 0.0, 0, 0
    names = [*BASELINES, "heterog", *OTHERS]
    for m, graph in graphs.items():
        for t, topology in topologies.items():
            ms = {b: _plan_ms(b, graph, topology)[0] for b in BASELINES}
            ms["heterog"] = _plan_ms("heterog", graph, topology, max_evaluations=args.evaluations,
                                     search_s=args.time_limit)[0]
            ms.update({o: _plan_ms(o, graph, topology)[0] for o in OTHERS})
            tag, seconds, own, (start, mine) = _tag(graph, topology, args, others=args.others)
            worst_s = max(worst_s, seconds)
            seeded = min(ms[o] for o in args.others.split(",") if o) if args.others else math.inf
            improved += mine < start * (1 - 1e-9)
            beat_seeds += mine < seeded * (1 - 1e-9)
            best_dp = min(ms[b] for b in BASELINES)
            best_other = min(ms.values())
            gain_dp = "-" if math.isinf(best_dp) else f"{best_dp / tag:.2f}x"
            if not math.isinf(best_dp):
                vs_dp.append(best_dp / tag)
            if tag > best_other * (1 + 1e-4):  # 0.01%: group boundaries differ between planners
                slower.append(f"{m}/{t}")
            rows.append([m, t, *(_ms(ms[n]) for n in names), _ms(tag), _ms(start), own, gain_dp,
                         "-" if math.isinf(best_other) else f"{best_other / tag:.3f}x",
                         f"{seconds:.1f}"])
            print(" | ".join(rows[-1]), flush=True)
    table = markdown_table(["model", "cluster", *names, "tag", "tag's start", "tag's own (batching)",
                            "vs best DP", "vs best other", "plan s"], rows)
    wins = sum(s >= 1.3 for s in vs_dp)
    return (f"{table}\n\ntag >= 1.3x the best DP baseline in {wins} of {len(vs_dp)} cases where "
            f"one fits; slower than the best other planner in {len(slower)} "
            f"({', '.join(slower) or 'none'}); tag's own search and refinement faster than its "
            f"start (the best of HeteroG's greedy start, the best uniform strategy and the seeds "
            f"as TAG strategies) in {improved} of {len(rows)}, faster than the best seed plan "
            f"itself ({args.others or 'none'}) in {beat_seeds} of {len(rows)}; planning at most "
            f"{worst_s:.1f} s (wall, noisy).")


def _tag(graph, topology, args, **options) -> tuple[float, float, str, tuple[float, float]]:
    """tag's (iteration ms or inf, planning wall s, its own result and batching from its
    notes: what the search and refinement reached before the fallbacks and SFB, and
    (the search's start ms, its own ms) from its notes, inf where absent)."""
    t0 = time.perf_counter()
    try:
        plan = run("tag", graph, topology, playouts=args.playouts, max_evaluations=args.evaluations,
                   time_limit=args.time_limit, **options)
    except InfeasiblePlan:
        return math.inf, time.perf_counter() - t0, "-", (math.inf, math.inf)
    own = next((m for n in plan.notes if (m := REFINED.match(n))), None)
    start = next((float(m[1]) for n in plan.notes if (m := STARTED.search(n))), math.inf)
    said = f"{float(own[1]):.1f} ({own[2]})" if own else "-"
    return (plan.prediction.iteration_ms, time.perf_counter() - t0, said,
            (start, float(own[1]) if own else math.inf))


REFINED = re.compile(r"refined -> ([0-9.]+) ms with (.+?) in \d+ simulations")
STARTED = re.compile(r"^search from .+? \(([0-9.]+) ms\)")


def priors_table(graphs, topologies, args) -> str:
    """Section 2: the search alone, GNN vs uniform priors, at equal playouts."""
    net = load_net(read_policy(DEFAULT_POLICY))
    rows, wins, ties, cases = [], dict.fromkeys(PLAYOUTS, 0), dict.fromkeys(PLAYOUTS, 0), 0
    for m, graph in graphs.items():
        for t, topology in topologies.items():
            problem = problem_of(graph, topology, groups=DEFAULT_GROUPS)
            env = problem.env
            start, _ = better_start(env, greedy_start(env), "greedy")
            baseline = best_baseline(graph, topology, "sgd")
            ref = (baseline.prediction.iteration_ms if baseline is not None
                   else -env.evaluate(start).reward)
            cells = [f"{-env.evaluate(start).reward / ref:.3f}"]
            for playouts in PLAYOUTS:
                got = [search(env, problem.graph, start, ref_ms=ref, net=n, playouts=playouts,
                              time_limit_s=math.inf,
                              choices=batchings(graph.model.batch_size)).outcome
                       for n in (net, None)]
                ratio = [-o.reward / ref for o in got]
                wins[playouts] += ratio[0] < ratio[1] * (1 - 1e-9)
                ties[playouts] += abs(ratio[0] - ratio[1]) <= ratio[1] * 1e-9
                cells += [f"{ratio[0]:.3f}", f"{ratio[1]:.3f}"]
            cases += 1
            rows.append([m, t, *cells])
            print(" | ".join(rows[-1]), flush=True)
    heads = ["model", "cluster", "start"] + [f"{k} @{p}" for p in PLAYOUTS for k in ("gnn", "uniform")]
    table = markdown_table(heads, rows)
    said = "; ".join(f"at {p} playouts the GNN's search is faster in {wins[p]} of {cases} cases, "
                     f"equal in {ties[p]}" for p in PLAYOUTS)
    return (f"Effective time (iteration ms, scaled up for a memory overflow) over the best DP "
            f"baseline's, lower is better; start: the incumbent (HeteroG's greedy start or the "
            f"best uniform strategy). {said}.\n\n{table}")


def tuning_table(graphs, generated, args) -> str:
    """Section 3: shipped vs fine-tuned on the generated clusters (tag without seeds)."""
    t0 = time.perf_counter()
    tuned = learn(list(graphs.items()), list(generated.items()), iterations=args.tune_iterations,
                  playouts=TUNE_PLAYOUTS, seed=0, init=read_policy(DEFAULT_POLICY))
    spent = time.perf_counter() - t0
    rows, ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tuned.policy.json"
        save(tuned, path)
        for m, graph in graphs.items():
            for t, topology in generated.items():
                shipped = _tag(graph, topology, args, others="")
                mine = _tag(graph, topology, args, others="", policy=str(path))
                ratio = shipped[0] / mine[0]
                ratios.append(ratio)
                rows.append([m, t, _ms(shipped[0]), shipped[2], _ms(mine[0]), mine[2],
                             f"{ratio:.3f}"])
                print(" | ".join(rows[-1]), flush=True)
    table = markdown_table(["model", "cluster", "shipped", "shipped's own (batching)",
                            "fine-tuned", "fine-tuned's own (batching)", "shipped / tuned"], rows)
    within = sum(r <= 1.10 for r in ratios)
    return (f"The shipped policy fine-tuned for {args.tune_iterations} iterations ({TUNE_PLAYOUTS} "
            f"playouts a search, seed 0, {spent:.0f} s wall) on {', '.join(generated)} and "
            f"{', '.join(graphs)}; tag with no seeds from other planners (its search, "
            f"refinement and the DP fallback). The shipped policy's plan is within 10% of the "
            f"fine-tuned one's in {within} of {len(ratios)} cases (worst "
            f"{max(ratios):.3f}x).\n\n{table}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--quick", action="store_true",
                        help="two models on two clusters plus the generated ones, small budgets")
    parser.add_argument("--playouts", type=int, default=400, help="tag's playouts in section 1")
    parser.add_argument("--evaluations", type=int, default=1000,
                        help="refinement simulations of tag and heterog")
    parser.add_argument("--time-limit", type=float, default=120.0,
                        help="CPU s of search for tag and heterog (a safety net)")
    parser.add_argument("--others", default="pipeline,heterog",
                        help="tag's seeds and fallbacks in section 1 (its option of that name)")
    parser.add_argument("--tune-iterations", type=int, default=10,
                        help="fine-tuning iterations on the generated clusters (section 3)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    models, topos = args.models.split(","), args.topologies.split(",")
    if args.quick:
        models, topos = list(QUICK_MODELS), list(QUICK_TOPOLOGIES)
        args.evaluations = 300
    seen = set(read_policy(DEFAULT_POLICY).trained_on.topologies)
    unseen = [s for s in GENERATED if f"random-{s}" not in seen]
    graphs = {m: load(PROFILES / f"{MODELS[m]}.json", expect="op-graph") for m in models}
    topologies = {t: load(TOPOLOGY_DIR / f"{t}.yaml", expect="topology") for t in topos}
    generated = {f"random-{s}": generate(s) for s in unseen}
    topologies.update(generated)
    first = main_table(graphs, topologies, args)
    print(first)
    second = priors_table(graphs, topologies, args)
    print(second)
    third = tuning_table(graphs, generated, args)
    print(third)
    if args.no_record:
        return
    body = (f"Simulated iteration ms on the shared cost model (deterministic: the playout and "
            f"evaluation caps bind); planning seconds are wall time on a busy shared machine. "
            f"tag: the shipped policy, {args.playouts} playouts, at most {args.evaluations} "
            f"simulations of refinement, SFB on, the plans of {args.others} as seeds and fallbacks; "
            f"tag's own: its search and refinement before the fallbacks and SFB; random-{'/'.join(map(str, unseen))}: generated "
            f"clusters the shipped policy never saw.\n\n{first}\n\n### The GNN earns its place\n\n"
            f"{second}\n\n### Unseen topologies: shipped vs fine-tuned\n\n{third}")
    record_section("tag_bench", TITLE, body)


if __name__ == "__main__":
    main()
