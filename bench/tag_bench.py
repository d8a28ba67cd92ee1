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
   fallbacks; the seconds exclude making those plans). Also tag's start (the best of its incumbent and the seeds as TAG
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

Each case plans every other planner once (the four DP baselines, heterog, fastt,
pipeline): those plans are the columns, and tag takes the ``--others`` ones as its seeds
and fallbacks and the DP ones as its baseline (``tag.planner.with_plans``), as `plan tag`
would make them. ``--jobs N`` runs the cases (and the fine-tuning) in N processes; every
search limit is a count or CPU seconds of its own process, so the results do not depend
on N. The CPU seconds of each case and of the whole run are printed; the full bench's
estimate is the quick run's CPU seconds per case times the full bench's cases.

Simulated times are deterministic (the playout and evaluation caps bind before the CPU
time limits on an unloaded machine); planning seconds are wall time and move with the
machine's load. Usage:

    python bench/tag_bench.py --jobs 2       # everything, records the section
    python bench/tag_bench.py --quick --no-record
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _record import markdown_table, record_section  # noqa: E402
from heterog_bench import (  # noqa: E402
    MODELS,
    OTHERS,
    QUICK_MODELS,
    QUICK_TOPOLOGIES,
    TOPOLOGIES,
    TOPOLOGY_DIR,
    _ms,
    graph_of,
)

from dl_nfv.artifacts import InfeasiblePlan, load, save  # noqa: E402
from dl_nfv.planners import run  # noqa: E402
from dl_nfv.planners.heterog import BASELINES, better_start, greedy_start, problem_of  # noqa: E402
from dl_nfv.planners.learned.policy import read_policy  # noqa: E402
from dl_nfv.planners.tag.batching import batchings  # noqa: E402
from dl_nfv.planners.tag.learn import learn  # noqa: E402
from dl_nfv.planners.tag.mcts import search  # noqa: E402
from dl_nfv.planners.tag.planner import (  # noqa: E402
    DEFAULT_GROUPS,
    DEFAULT_POLICY,
    load_net,
    with_plans,
)
from dl_nfv.planners.tag.topogen import generate  # noqa: E402

GENERATED = (1000, 1001, 1002)
TITLE = "TAG vs heterog, fastt, pipeline and data parallelism (bench/tag_bench.py)"
PLAYOUTS = (100, 400)
TUNE_PLAYOUTS = 64  # per search while fine-tuning, as the shipped policy was trained
NAMES = (*BASELINES, "heterog", *OTHERS)
REFINED = re.compile(r"refined -> ([0-9.]+) ms with (.+?) in \d+ simulations")
STARTED = re.compile(r"^search from .+? \(([0-9.]+) ms\)")


def topology_of(name: str):
    """A bench cluster (``examples/topologies``) or a generated one (``random-S``)."""
    if name.startswith("random-"):
        return generate(int(name.removeprefix("random-")))
    return load(TOPOLOGY_DIR / f"{name}.yaml", expect="topology")


def _others(graph, topology, args) -> dict:
    """Every other planner's plan (None where it does not fit), each made once."""
    plans = {}
    for name in NAMES:
        options = ({"max_evaluations": args.evaluations, "search_s": args.time_limit}
                   if name == "heterog" else {})
        try:
            plans[name] = run(name, graph, topology, **options)
        except InfeasiblePlan:
            plans[name] = None
    return plans


def _tag(graph, topology, plans: dict, args, others: str, policy: str = ""):
    """tag planned from the given plans: (iteration ms or inf, planning wall s, its own
    result and batching from its notes, (its start ms, its own ms))."""
    t0 = time.perf_counter()
    seeds = [plans[o] for o in filter(None, others.split(",")) if plans[o] is not None]
    baselines = [plans[b] for b in BASELINES if plans[b] is not None]
    try:
        plan = with_plans(graph, topology, seeds, baselines=baselines, others=others,
                          playouts=args.playouts, max_evaluations=args.evaluations,
                          time_limit=args.time_limit, policy=policy)
    except InfeasiblePlan:
        return math.inf, time.perf_counter() - t0, "-", (math.inf, math.inf)
    own = next((m for n in plan.notes if (m := REFINED.match(n))), None)
    start = next((float(m[1]) for n in plan.notes if (m := STARTED.search(n))), math.inf)
    said = f"{float(own[1]):.1f} ({own[2]})" if own else "-"
    return (plan.prediction.iteration_ms, time.perf_counter() - t0, said,
            (start, float(own[1]) if own else math.inf))


def main_case(m: str, t: str, args) -> dict:
    """Sections 1 and 2 of one case, in one process: its row, its priors row, what the
    summaries count, and its CPU seconds."""
    c0 = time.process_time()
    graph, topology = graph_of(m), topology_of(t)
    plans = _others(graph, topology, args)
    ms = {n: (math.inf if p is None else p.prediction.iteration_ms) for n, p in plans.items()}
    tag, seconds, own, (start, mine) = _tag(graph, topology, plans, args, args.others)
    seeded = min((ms[o] for o in args.others.split(",") if o), default=math.inf)
    best_dp = min(ms[b] for b in BASELINES)
    best_other = min(ms.values())
    row = [m, t, *(_ms(ms[n]) for n in NAMES), _ms(tag), _ms(start), own,
           "-" if math.isinf(best_dp) else f"{best_dp / tag:.2f}x",
           "-" if math.isinf(best_other) else f"{best_other / tag:.3f}x", f"{seconds:.1f}"]
    print(" | ".join(row), flush=True)
    priors, wins, ties = _priors(graph, topology, plans)
    print(" | ".join([m, t, *priors]), flush=True)
    return {"row": row, "priors": [m, t, *priors], "wins": wins, "ties": ties,
            "vs_dp": None if math.isinf(best_dp) else best_dp / tag,
            "slower": tag > best_other * (1 + 1e-4),  # 0.01%: group boundaries differ
            "improved": mine < start * (1 - 1e-9), "beat_seeds": mine < seeded * (1 - 1e-9),
            "seconds": seconds, "cpu": time.process_time() - c0}


def _priors(graph, topology, plans: dict) -> tuple[list[str], dict, dict]:
    """Section 2's cells of one case: the search alone, GNN vs uniform priors."""
    net = load_net(read_policy(DEFAULT_POLICY))
    problem = problem_of(graph, topology, groups=DEFAULT_GROUPS)
    env = problem.env
    start, _ = better_start(env, greedy_start(env), "greedy")
    fitting = [plans[b].prediction.iteration_ms for b in BASELINES if plans[b] is not None]
    ref = min(fitting) if fitting else -env.evaluate(start).reward
    cells, wins, ties = [f"{-env.evaluate(start).reward / ref:.3f}"], {}, {}
    for playouts in PLAYOUTS:
        got = [search(env, problem.graph, start, ref_ms=ref, net=n, playouts=playouts,
                      time_limit_s=math.inf, choices=batchings(graph.model.batch_size)).outcome
               for n in (net, None)]
        ratio = [-o.reward / ref for o in got]
        wins[playouts] = ratio[0] < ratio[1] * (1 - 1e-9)
        ties[playouts] = abs(ratio[0] - ratio[1]) <= ratio[1] * 1e-9
        cells += [f"{ratio[0]:.3f}", f"{ratio[1]:.3f}"]
    return cells, wins, ties


def tune(models: list[str], generated: list[str], iterations: int, path: str) -> dict:
    """The shipped policy fine-tuned on the generated clusters, saved at ``path``."""
    c0, t0 = time.process_time(), time.perf_counter()
    tuned = learn([(m, graph_of(m)) for m in models], [(t, topology_of(t)) for t in generated],
                  iterations=iterations, playouts=TUNE_PLAYOUTS, seed=0,
                  init=read_policy(DEFAULT_POLICY))
    save(tuned, path)
    return {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}


def tuning_case(m: str, t: str, args, path: str) -> dict:
    """Section 3 of one case: tag with no seeds, with the shipped and the tuned policy."""
    c0 = time.process_time()
    graph, topology = graph_of(m), topology_of(t)
    plans = {b: _dp(b, graph, topology) for b in BASELINES}
    shipped = _tag(graph, topology, plans, args, "")
    mine = _tag(graph, topology, plans, args, "", policy=path)
    row = [m, t, _ms(shipped[0]), shipped[2], _ms(mine[0]), mine[2],
           f"{shipped[0] / mine[0]:.3f}"]
    print(" | ".join(row), flush=True)
    return {"row": row, "ratio": shipped[0] / mine[0], "cpu": time.process_time() - c0}


def _dp(name: str, graph, topology):
    try:
        return run(name, graph, topology)
    except InfeasiblePlan:
        return None


def main_section(results: list[dict], args) -> str:
    """Section 1's table and summary."""
    table = markdown_table(["model", "cluster", *NAMES, "tag", "tag's start", "tag's own (batching)",
                            "vs best DP", "vs best other", "plan s"], [r["row"] for r in results])
    vs_dp = [r["vs_dp"] for r in results if r["vs_dp"] is not None]
    slower = [f"{r['row'][0]}/{r['row'][1]}" for r in results if r["slower"]]
    n = len(results)
    return (f"{table}\n\ntag >= 1.3x the best DP baseline in {sum(s >= 1.3 for s in vs_dp)} of "
            f"{len(vs_dp)} cases where one fits; slower than the best other planner in "
            f"{len(slower)} ({', '.join(slower) or 'none'}); tag's own search and refinement "
            f"faster than its start (the best of HeteroG's greedy start, the best uniform "
            f"strategy and the seeds as TAG strategies) in {sum(r['improved'] for r in results)} "
            f"of {n}, faster than the best seed plan itself ({args.others or 'none'}) in "
            f"{sum(r['beat_seeds'] for r in results)} of {n}; planning at most "
            f"{max(r['seconds'] for r in results):.1f} s (wall, noisy).")


def priors_section(results: list[dict]) -> str:
    """Section 2's table and summary."""
    heads = ["model", "cluster", "start"] + [f"{k} @{p}" for p in PLAYOUTS for k in ("gnn", "uniform")]
    said = "; ".join(f"at {p} playouts the GNN's search is faster in "
                     f"{sum(r['wins'][p] for r in results)} of {len(results)} cases, equal in "
                     f"{sum(r['ties'][p] for r in results)}" for p in PLAYOUTS)
    return (f"Effective time (iteration ms, scaled up for a memory overflow) over the best DP "
            f"baseline's, lower is better; start: the incumbent (HeteroG's greedy start or the "
            f"best uniform strategy). {said}.\n\n"
            f"{markdown_table(heads, [r['priors'] for r in results])}")


def tuning_section(results: list[dict], tuned: dict, models, generated, args) -> str:
    """Section 3's table and summary."""
    ratios = [r["ratio"] for r in results]
    table = markdown_table(["model", "cluster", "shipped", "shipped's own (batching)",
                            "fine-tuned", "fine-tuned's own (batching)", "shipped / tuned"],
                           [r["row"] for r in results])
    return (f"The shipped policy fine-tuned for {args.tune_iterations} iterations ({TUNE_PLAYOUTS} "
            f"playouts a search, seed 0, {tuned['wall']:.0f} s wall) on {', '.join(generated)} and "
            f"{', '.join(models)}; tag with no seeds from other planners (its search, "
            f"refinement and the DP fallback). The shipped policy's plan is within 10% of the "
            f"fine-tuned one's in {sum(r <= 1.10 for r in ratios)} of {len(ratios)} cases (worst "
            f"{max(ratios):.3f}x).\n\n{table}")


def run_all(models, topos, generated, args) -> tuple[list, list, dict, float]:
    """Every case of the three sections in ``args.jobs`` processes (the fine-tuning among
    the first); returns the results in case order and the CPU seconds of all."""
    cases = [(m, t) for m in models for t in [*topos, *generated]]
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(
            max_workers=args.jobs, mp_context=get_context("spawn")) as pool:
        path = str(Path(tmp) / "tuned.policy.json")
        tuning = pool.submit(tune, models, generated, args.tune_iterations, path)
        firsts = [pool.submit(main_case, m, t, args) for m, t in cases]
        tuned = tuning.result()
        thirds = [pool.submit(tuning_case, m, t, args, path) for m in models for t in generated]
        first = [f.result() for f in firsts]
        third = [f.result() for f in thirds]
    cpu = tuned["cpu"] + sum(r["cpu"] for r in (*first, *third))
    return first, third, tuned, cpu


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
    parser.add_argument("--jobs", type=int, default=1, help="cases planned in parallel processes")
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    models, topos = args.models.split(","), args.topologies.split(",")
    if args.quick:
        models, topos = list(QUICK_MODELS), list(QUICK_TOPOLOGIES)
        args.evaluations = 300
    seen = set(read_policy(DEFAULT_POLICY).trained_on.topologies)
    generated = [f"random-{s}" for s in GENERATED if f"random-{s}" not in seen]
    t0 = time.perf_counter()
    first, third, tuned, cpu = run_all(models, topos, generated, args)
    wall = time.perf_counter() - t0
    sections = (main_section(first, args), priors_section(first),
                tuning_section(third, tuned, models, generated, args))
    print("\n\n".join(sections))
    cases = len(first) + len(third)
    print(f"\n{cases} cases and the fine-tuning: {cpu / 60:.1f} CPU min ({cpu / len(first):.0f} "
          f"CPU s per section-1 case with its section-2 and -3 share), {wall / 60:.1f} min wall "
          f"with {args.jobs} job(s)")
    if args.no_record:
        return
    body = (f"Simulated iteration ms on the shared cost model (deterministic: the playout and "
            f"evaluation caps bind); planning seconds are wall time on a busy shared machine. "
            f"tag: the shipped policy, {args.playouts} playouts, at most {args.evaluations} "
            f"simulations of refinement, SFB on, the plans of {args.others} as seeds and fallbacks; "
            f"tag's own: its search and refinement before the fallbacks and SFB; "
            f"{'/'.join(generated)}: generated clusters the shipped policy never saw.\n\n"
            f"{sections[0]}\n\n### The GNN earns its place\n\n{sections[1]}\n\n"
            f"### Unseen topologies: shipped vs fine-tuned\n\n{sections[2]}")
    record_section("tag_bench", TITLE, body)


if __name__ == "__main__":
    main()
