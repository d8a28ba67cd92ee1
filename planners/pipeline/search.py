"""The pipeline search: orderings x microbatch counts x DP layouts, timed by the scheduler.

1. **Orderings** (``mapping.candidate_orderings``) and **microbatch counts**
   (divisors of the batch that leave a microbatch ``Problem.min_rows`` rows, the rows
   the graph's batch norms need in training, or the one the user fixed).
2. For every pair, the partition DP (``partition.OrderingTables``) finds the smallest
   feasible bottleneck and one layout per cap of the grid above it.
3. Every distinct layout gets integer replica shares and the scheduler's inputs
   (a layout that leaves a replica fewer than ``Problem.min_rows`` rows is skipped, as
   one that does not fit; where that is 2, the DP gets no stage wider than the
   microbatch's rows allow), and is screened by a closed-form flush estimate (``flush_estimate_ms``); an
   (ordering, microbatch count) is scored by the list-scheduled time of its
   ``TOP_PER_EXPLORE`` best layouts by estimate (three list variants, one splitting
   backwards; skipping layouts estimated ``ESTIMATE_SLACK`` above the best time so far).
4. **Local search over orderings**: host-block moves of the best ordering
   (seeded ``random.Random(seed)``, a fixed number of rounds), re-running 2–3
   for the microbatch counts that did best; a move is kept when its score is
   better. None on a uniform cluster (``symmetry``), whose orderings equal up to its
   symmetry are explored once in any case. The candidates as they stood before it are
   kept (``Outcome.base``) for a plan given more time to keep what a shorter one has.
5. **Finer units** (graphs the problem coarsened): every allowed cut within a unit of a
   stage boundary of the fastest layout so far becomes a unit boundary
   (``finer_units``: op by op where the cuts are, coarse elsewhere), the best layouts so
   far are carried over unchanged, and the two best (ordering, microbatch count) pairs
   are explored again on the finer units; twice (``REFINE_PASSES``), so that a cut can
   move by up to two coarse units. A coarse unit of an operator-level graph holds ten
   ops or more, and a cut in its middle can matter by several per cent. The climbs of
   step 6 then get an eighth of their budget: their moves are a few ops each.
6. The layouts scheduled so far and the 32 best others by estimate are ranked by
   their list-scheduled time; the 12 best are scheduled by ``auto_schedule``
   (GPipe, 1F1B and list variants); the ``REFINED_CANDIDATES`` fastest get their
   stage boundaries hill-climbed on the scheduled time (``refine``: one boundary
   moved by a unit, else one unit passed between two stages further apart), and all are
   returned fastest first; the caller simulates the top few on the shared
   simulator and keeps the winner.

Steps 1-5 time tied weights as AllReduced whatever ``problem.tie_sync`` says; step 6
times them as it says. An exchange (``TieSync.EXCHANGE``) only shortens the tail of
layouts whose tie ends sit on single devices, and scoring orderings with it steered the
ordering search away from layouts that are fast for other reasons (BERT-large on the
TAG cluster: 74.5 instead of 70.0 ms simulated).

The work done is fixed by the inputs and the seed, so a run is deterministic;
``time_limit`` (CPU seconds of this process, so that a busy machine does not
change the result; the planner passes its plan's limit and the CPU time the plan had
``started`` at, before its bound) only stops the local search early on a slow machine,
between two orderings (once the plan has used ``LOCAL_SEARCH_SHARE`` of its limit), and
the boundary climbs, between two neighbourhoods (at ``CLIMB_SHARE``), and the result then
records that it did. The rest of the limit is for what is never cut: the final
scheduling, and the planner's simulations.

Complexity: O(orderings x microbatch counts x DP) + O((rounds + refined pairs) x DP) +
O((layouts + REFINE_BUDGET) x stages^2 x microbatches).
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from dl_nfv.artifacts import TieSync

from .build import Replicas, all_replicas, stage_costs
from .mapping import candidate_orderings, neighbours
from .partition import TAU_GRID, Layout, OrderingTables
from .problem import Problem
from .scheduler import (
    Policy,
    StageCosts,
    Timed,
    auto_schedule,
    flush_estimate_ms,
    round_trip_caps,
    run,
)
from .symmetry import canonical

MAX_MICROBATCH_OPTIONS = 7
# shares of the plan's time limit after which the local search and the climbs stop (CPU
# time from the plan's start, its bound included)
LOCAL_SEARCH_SHARE = 0.5
CLIMB_SHARE = 0.7
LOCAL_SEARCH_ROUNDS = 12
NEIGHBOURS_PER_ROUND = 12
TOP_FOR_LIST = 32
TOP_PER_EXPLORE = 3  # layouts per (ordering, microbatch count) list-scheduled to score it
ESTIMATE_SLACK = 1.5  # ... unless their estimate is this much above the best time so far
TOP_FOR_SCHEDULING = 12
REFINED_CANDIDATES = 12  # the fastest candidates whose stage boundaries are hill-climbed
REFINE_ROUNDS = 8
REFINE_STEPS = (1,)  # units a boundary moves by in one neighbour
REFINE_PASSES = 2  # moves onto finer units around the best layouts' cuts (coarsened graphs)
REFINE_AROUND = 1  # the fastest layouts whose cuts get finer units
REFINED_PAIRS = 2  # (ordering, microbatch count) pairs explored again on finer units
# on finer units a climb's move is a few ops and helps little: the climbs get this share
# of REFINE_BUDGET (bounded work where the units are many)
FINE_CLIMB_SHARE = 0.125
# work of the climbs over all the candidates refined: a neighbour costs its stages x
# microbatches (a scheduling's events); 131072 is 256 neighbours of 16 stages x 32 microbatches
REFINE_BUDGET = 131072
SCREENED_MOVES = 3  # the moves of a climb's round fully scheduled


@dataclass(slots=True)
class Evaluated:
    """A layout with its replicas, scheduler inputs and timed schedule."""

    layout: Layout
    reps: list[Replicas]
    costs: StageCosts
    timed: Timed

    @property
    def makespan_ms(self) -> float:
        return self.timed.makespan_ms


@dataclass(slots=True)
class Outcome:
    """What the search found: candidates fastest first, and how the search went."""

    candidates: list[Evaluated]
    # the candidates as they stood before the steps a time limit may cut (empty: the same)
    base: list[Evaluated] = field(default_factory=list)
    problem: Problem | None = None  # the units the candidates are on (finer than given)
    orderings_tried: int = 0
    layouts_timed: int = 0
    timed_out: bool = False
    notes: list[str] = field(default_factory=list)


def microbatch_options(batch_size: int, fixed: int = 0, min_samples: int = 1) -> list[int]:
    """Microbatch counts to try: ``fixed``, or up to 7 divisors of the batch spread evenly.

    Every microbatch keeps at least ``min_samples`` samples.
    """
    if fixed:
        return [fixed]
    divisors = [m for m in range(1, batch_size + 1)
                if batch_size % m == 0 and batch_size // m >= min_samples]
    if len(divisors) <= MAX_MICROBATCH_OPTIONS:
        return divisors
    # keep the largest, the smallest and an even spread (in log scale) between
    picks = {divisors[0], divisors[-1]}
    k = MAX_MICROBATCH_OPTIONS - 2
    for i in range(1, k + 1):
        picks.add(divisors[round(i * (len(divisors) - 1) / (k + 1))])
    return sorted(picks)


@dataclass(slots=True)
class Screened:
    """A layout with its scheduler inputs and closed-form estimate."""

    layout: Layout
    reps: list[Replicas]
    costs: StageCosts
    estimate_ms: float


def screen(problem: Problem, layout: Layout) -> Screened | None:
    """Replicas, scheduler inputs and the flush estimate; None when a stage cannot hold a
    microbatch, or a replica's slice of one has fewer rows than ``problem.min_rows``."""
    reps = all_replicas(problem, layout)
    if min(c for r in reps for c in r.counts) < problem.min_rows:
        return None
    costs = stage_costs(problem, layout, reps)
    if min(costs.caps) < 1:
        return None
    return Screened(layout, reps, costs, flush_estimate_ms(costs))


def evaluate(problem: Problem, layout: Layout, *, full: bool = False,
             policies: Sequence[Policy] = tuple(Policy), screened: Screened | None = None
             ) -> Evaluated | None:
    """Time ``layout``: quick (list scheduler, round-trip caps) or ``full`` (best schedule).

    None when some stage cannot hold even one microbatch.
    """
    screened = screened or screen(problem, layout)
    if screened is None:
        return None
    reps, costs = screened.reps, screened.costs
    try:
        if full:
            timed = auto_schedule(costs, policies)
        elif Policy.LIST in policies:  # the list variants that win most often
            timed = min(run(costs, Policy.LIST, caps=round_trip_caps(costs)),
                        run(costs, Policy.LIST, backward_first=True),
                        run(costs, Policy.LIST, backward_first=True, split=True),
                        key=lambda t: t.makespan_ms)
        else:
            timed = auto_schedule(costs, policies)
    except ValueError:
        return None
    return Evaluated(layout, reps, costs, timed)


def search(problem: Problem, *, microbatches: int = 0, max_stages: int = 0,
           max_replicas: int = 0, policies: Sequence[Policy] = tuple(Policy), seed: int = 0,
           time_limit: float = 30.0, started: float | None = None,
           extra: Sequence[Layout] = (), collectives: dict | None = None) -> Outcome:
    """Run the search described in the module docstring; ``extra`` layouts join the pool.

    ``max_replicas``: most devices per stage (0: any). ``started``: the
    ``time.process_time()`` the limit counts from (default: now). ``collectives``: the
    AllReduce coefficients per ``symmetry.collective_key`` to use and fill (a uniform
    cluster's nested sub-clusters share one: their keys are classes of the whole)."""
    t0 = time.process_time() if started is None else started
    # orderings and microbatch counts are scored with tied weights AllReduced; the final
    # layouts are timed and climbed as the problem sums them (see the module docstring)
    scoring = problem
    if problem.tie_sync is not TieSync.ALLREDUCE:
        scoring = copy.copy(problem)
        scoring.tie_sync = TieSync.ALLREDUCE
    state = _Search(scoring, policies, max_stages, max_replicas)
    if collectives is not None:
        state.cache = collectives
    state.consider(extra)
    options = microbatch_options(problem.batch_size, microbatches, problem.min_rows)
    per_ordering = []
    for ordering in candidate_orderings(problem.cm, fold=bool(problem.ties)):
        scores = state.explore(ordering, options)
        per_ordering.append((min(scores.values(), default=float("inf")), ordering, scores))
    per_ordering.sort(key=lambda x: x[0])
    refined = problem.coarsened
    # on a uniform cluster a host-block move either permutes alike hosts (an equivalent
    # ordering) or splits a leaf's hosts apart: no local search (``symmetry``)
    if (per_ordering and per_ordering[0][0] < float("inf") and len(problem.devices) > 2
            and problem.labels is None):
        if not refined:  # what a plan cut at once by its time limit would be made from
            state.outcome.base = state.scheduled(problem)
        state.local_search(per_ordering[0], seed, t0 + time_limit * LOCAL_SEARCH_SHARE)
    for _ in range(REFINE_PASSES if refined else 0):
        state, problem = state.on_finer_units(problem)
    final = state.scheduled(problem)
    known = {ev.layout.key for ev in final}
    budget = [int(REFINE_BUDGET * (FINE_CLIMB_SHARE if refined else 1.0))]
    for ev in final[:REFINED_CANDIDATES]:
        better, cut = refine(problem, ev, policies, budget, t0 + time_limit * CLIMB_SHARE)
        state.outcome.timed_out |= cut
        if better.layout.key not in known:
            known.add(better.layout.key)
            final.append(better)
    final.sort(key=fastest_first)
    state.outcome.candidates = final
    state.outcome.problem = problem
    return state.outcome


class _Search:
    """The search's state: layouts screened and list-scheduled so far, keyed by layout."""

    def __init__(self, problem: Problem, policies: Sequence[Policy], max_stages: int,
                 max_replicas: int):
        self.problem = problem
        self.policies = policies
        self.max_stages = max_stages
        self.max_replicas = max_replicas
        self.cache: dict = {}  # collective coefficients shared by the orderings' tables
        self.screened: dict[tuple, Screened | None] = {}
        self.quick: dict[tuple, Evaluated | None] = {}
        self.best_ms = float("inf")  # the best list-scheduled time so far
        self.outcome = Outcome(candidates=[])
        self.scores: dict[tuple[tuple[str, ...], int], float] = {}  # (ordering, m) -> score
        self.forms: dict[tuple, dict[int, float]] = {}  # (canonical ordering, ms) -> scores

    def timed(self, sc: Screened) -> Evaluated | None:
        key = sc.layout.key
        if key not in self.quick:
            self.quick[key] = evaluate(self.problem, sc.layout, policies=self.policies,
                                       screened=sc)
        return self.quick[key]

    def consider(self, layouts: Sequence[Layout]) -> float:
        """Screen ``layouts``; the best list-scheduled time of the few estimated best."""
        fresh = []
        for lay in layouts:
            if lay.key not in self.screened:
                self.screened[lay.key] = screen(self.problem, lay)
                self.outcome.layouts_timed += 1
            if (sc := self.screened[lay.key]) is not None:
                fresh.append(sc)
        fresh.sort(key=lambda sc: (sc.estimate_ms, len(sc.layout.stages), sc.layout.key))
        times = [ev.makespan_ms for sc in fresh[:TOP_PER_EXPLORE]
                 if sc.estimate_ms <= ESTIMATE_SLACK * self.best_ms and (ev := self.timed(sc))]
        if not times:  # none worth scheduling: a score no better than the best so far
            return ESTIMATE_SLACK * fresh[0].estimate_ms if fresh else float("inf")
        self.best_ms = min(self.best_ms, *times)
        return min(times)

    def explore(self, ordering: Sequence[str], ms: Sequence[int]) -> dict[int, float]:
        """Per microbatch count, the score of the DP's layouts of ``ordering``."""
        form = canonical(self.problem.labels, ordering) if self.problem.labels else None
        if form is not None and (form, tuple(ms)) in self.forms:
            return dict(self.forms[form, tuple(ms)])  # an equivalent ordering (``symmetry``)
        scores = {}
        base = OrderingTables(self.problem, ordering, self.cache)
        for m in ms:
            tables = base.for_microbatches(m)
            most = self.max_replicas
            if self.problem.min_rows > 1:  # wider stages leave a replica too few rows
                fit = self.problem.batch_size // m // self.problem.min_rows
                most = min(most or fit, fit)
            if most:
                _limit_replicas(tables, most)
            tau0 = tables.min_bottleneck()
            if tau0 == float("inf"):
                continue
            scores[m] = self.consider(tables.layouts([tau0 * g for g in TAU_GRID],
                                                     self.max_stages))
            self.scores[(tuple(ordering), m)] = scores[m]
        self.outcome.orderings_tried += 1
        if form is not None:
            self.forms[form, tuple(ms)] = dict(scores)
        return scores

    def local_search(self, start: tuple, seed: int, deadline: float) -> None:
        """Host-block moves of the best ordering, kept when their score is better."""
        best_score, incumbent, scores = start
        good_ms = sorted(scores, key=scores.__getitem__)[:3]
        rng = random.Random(seed)
        for _ in range(LOCAL_SEARCH_ROUNDS):
            improved = False
            for cand in neighbours(self.problem.cm, incumbent, rng, NEIGHBOURS_PER_ROUND):
                if time.process_time() > deadline:
                    self.outcome.timed_out = True
                    return
                score = min(self.explore(cand, good_ms).values(), default=float("inf"))
                if score < best_score - 1e-9:
                    best_score, incumbent, improved = score, cand, True
            if not improved:
                return

    def on_finer_units(self, final_problem: Problem) -> tuple[_Search, Problem]:
        """The search moved onto finer units: every allowed cut within a unit of a cut of
        the ``REFINE_AROUND`` fastest layouts so far becomes a unit boundary
        (``finer_units``), the ``REFINED_PAIRS`` best (ordering, microbatch count) pairs
        are explored again there, and the best layouts so far join the new pool
        unchanged. Returns the new state and ``final_problem`` on the new units."""
        ranked = sorted((ev for ev in self.quick.values() if ev is not None), key=fastest_first)
        best = [ev.layout for ev in _distinct(self.problem, ranked, lambda ev: ev.makespan_ms)]
        fine_final = finer_units(final_problem, best[:REFINE_AROUND])
        fine = fine_final
        if self.problem is not final_problem:
            fine = copy.copy(fine_final)
            fine.tie_sync = self.problem.tie_sync
        state = _Search(fine, self.policies, self.max_stages, self.max_replicas)
        state.outcome = self.outcome
        pool = sorted((sc for sc in self.screened.values() if sc is not None),
                      key=lambda sc: (sc.estimate_ms, len(sc.layout.stages), sc.layout.key))
        state.consider([on_units(ev.layout, self.problem, fine) for ev in ranked[:TOP_FOR_LIST]]
                       + [on_units(sc.layout, self.problem, fine) for sc in pool[:TOP_FOR_LIST]])
        for ordering, m in sorted(self.scores, key=self.scores.__getitem__)[:REFINED_PAIRS]:
            state.explore(ordering, [m])
        return state, fine_final

    def scheduled(self, final_problem: Problem) -> list[Evaluated]:
        """The best layouts by estimate list-scheduled, the best of those fully scheduled
        on ``final_problem`` (ties summed as it says), fastest first."""
        pool = sorted((sc for sc in self.screened.values() if sc is not None),
                      key=lambda sc: (sc.estimate_ms, len(sc.layout.stages), sc.layout.key))
        for sc in _distinct(self.problem, pool, lambda sc: sc.estimate_ms)[:TOP_FOR_LIST]:
            self.timed(sc)
        ranked = sorted((ev for ev in self.quick.values() if ev is not None), key=fastest_first)
        final = []
        for ev in _distinct(self.problem, ranked, lambda ev: ev.makespan_ms)[:TOP_FOR_SCHEDULING]:
            same = final_problem is self.problem
            full = evaluate(final_problem, ev.layout, full=True, policies=self.policies,
                            screened=self.screened[ev.layout.key] if same else None)
            if full is not None:
                full.layout = ev.layout
                final.append(full)
        final.sort(key=fastest_first)
        return final


def fastest_first(ev: Evaluated) -> tuple:
    """Sort key of timed layouts: fastest, then fewer stages, then the layout (deterministic)."""
    return ev.makespan_ms, len(ev.layout.stages), ev.layout.key


def boundary_moves(layout: Layout, steps: Sequence[int] = REFINE_STEPS) -> list[Layout]:
    """Layouts with one boundary between neighbouring stages moved by one of ``steps``
    units either way (devices and microbatches kept; no stage left empty)."""
    out = []
    stages = layout.stages
    for i in range(len(stages) - 1):
        left, right = stages[i], stages[i + 1]
        for step in steps:
            for cut in (left.stop - step, left.stop + step):
                if left.start < cut < right.stop:
                    moved = (*stages[:i], replace(left, stop=cut), replace(right, start=cut),
                             *stages[i + 2:])
                    out.append(Layout(moved, layout.microbatches, layout.origin))
    return out


def shift_moves(layout: Layout) -> list[Layout]:
    """Layouts with one unit passed between two stages that are not neighbours: every
    boundary between them moves by one, so the stages in between keep their sizes."""
    stages = layout.stages
    cuts = [st.start for st in stages] + [stages[-1].stop]
    out = []
    for i in range(len(stages)):
        for j in range(len(stages)):
            if abs(i - j) < 2:
                continue
            lo, hi, step = (i + 1, j, 1) if j > i else (j + 1, i, -1)  # cuts lo..hi move
            moved = cuts[:lo] + [c + step for c in cuts[lo:hi + 1]] + cuts[hi + 1:]
            if all(a < b for a, b in zip(moved, moved[1:])):
                out.append(Layout(tuple(replace(st, start=moved[k], stop=moved[k + 1])
                                        for k, st in enumerate(stages)),
                                  layout.microbatches, layout.origin))
    return out


def device_swaps(problem: Problem, layout: Layout) -> list[Layout]:
    """Layouts with two devices of different stages swapped, or a device of a stage swapped
    for one the layout leaves idle (stages, shares' order and microbatches kept); on a
    uniform cluster one of each class of swaps its symmetry makes alike."""
    stage_of = {d: s for s, st in enumerate(layout.stages) for d in st.devices}
    idle = [d for d in problem.devices if d not in stage_of]
    used = [d for st in layout.stages for d in st.devices]
    out = []
    for n, a in enumerate(used):
        for b in [*used[n + 1:], *idle]:
            if stage_of[a] == stage_of.get(b):
                continue
            swap = {a: b, b: a}
            out.append(Layout(tuple(replace(st, devices=tuple(swap.get(d, d) for d in st.devices))
                                    for st in layout.stages), layout.microbatches, layout.origin))
    if problem.labels is None:
        return out
    # on a uniform cluster, one swap of each class that the cluster's symmetry maps onto
    # each other (a stage's device for any idle device of one host, say) (``symmetry``)
    forms: dict[tuple, Layout] = {}
    for lay in out:
        forms.setdefault(_form(problem, lay), lay)
    return list(forms.values())


def _form(problem: Problem, layout: Layout) -> tuple:
    """A layout's stages with its devices renamed by ``symmetry.canonical``."""
    return (tuple((st.start, st.stop, len(st.devices)) for st in layout.stages),
            canonical(problem.labels, [d for st in layout.stages for d in st.devices]))


def refine(problem: Problem, ev: Evaluated, policies: Sequence[Policy],
           budget: list[int], deadline: float = float("inf")) -> tuple[Evaluated, bool]:
    """Hill-climb ``ev``'s stage boundaries on the scheduled time (best move per round).

    The DP places boundaries by its closed-form stage costs; the scheduler sees fill,
    drain and links queueing, so moving a boundary by a unit often helps. A round
    schedules the ``boundary_moves`` and keeps the best if it is faster; when none is,
    the ``shift_moves`` (a unit passed between stages further apart, which no single
    boundary move reaches without first making things worse). Every scheduled neighbour
    takes its stages x microbatches from ``budget[0]`` (shared by the candidates refined,
    so the work is bounded and deterministic): O(rounds x stages^2) schedulings, at most
    ``budget / (stages x microbatches)``; a neighbourhood that does not fit what is left
    of the budget is skipped, and none is scheduled once ``time.process_time()`` has passed
    ``deadline``. Returns the best layout found and whether the deadline cut the climb.
    """
    best = ev
    for _ in range(REFINE_ROUNDS):
        for neighbourhood in (boundary_moves, shift_moves):
            moves = neighbourhood(best.layout)
            cost = len(moves) * len(ev.layout.stages) * ev.layout.microbatches
            if time.process_time() > deadline:
                return best, True
            if not moves or cost > budget[0]:
                continue
            budget[0] -= cost
            top = _best_move(problem, moves, policies)
            if top is not None and top.makespan_ms < best.makespan_ms - 1e-9:
                best = top
                break
        else:
            return best, False
    return best, False


def _best_move(problem: Problem, moves: Sequence[Layout], policies: Sequence[Policy]
               ) -> Evaluated | None:
    """The fastest of ``moves`` by their best schedule. Each move is first timed by one
    list schedule (``screen_schedule``) and only the ``SCREENED_MOVES`` fastest by it get
    every schedule: the climbs are the largest part of the search, and a move that one
    list schedule ranks below the third seldom wins on every schedule
    (docs/planners/pipeline.md says where this was measured)."""
    if len(moves) <= SCREENED_MOVES:
        timed = [x for lay in moves
                 if (x := evaluate(problem, lay, full=True, policies=policies)) is not None]
        return min(timed, key=fastest_first, default=None)
    quick = []
    for lay in moves:
        sc = screen(problem, lay)
        if sc is not None and (t := screen_schedule(sc.costs, policies)) is not None:
            quick.append((t, lay.key, sc))
    quick.sort(key=lambda x: (x[0], x[1]))
    timed = [x for _, _, sc in quick[:SCREENED_MOVES]
             if (x := evaluate(problem, sc.layout, full=True, policies=policies, screened=sc))]
    return min(timed, key=fastest_first, default=None)


def screen_schedule(costs: StageCosts, policies: Sequence[Policy]) -> float | None:
    """One list schedule's makespan (backwards first, split where that can help), or None
    when it deadlocks or the list scheduler is not allowed (every move then counts)."""
    if Policy.LIST not in policies:
        return 0.0
    try:
        return run(costs, Policy.LIST, backward_first=True, split=True).makespan_ms
    except ValueError:
        return None


def finer_units(problem: Problem, layouts: Sequence[Layout], reach: int = 1) -> Problem:
    """``problem`` with every allowed cut within ``reach`` units of a stage boundary of
    ``layouts`` made a unit boundary (the other boundaries kept)."""
    marks = set(problem.bounds.tolist())
    allowed = problem.allowed
    for layout in layouts:
        for stage in layout.stages[1:]:
            lo = problem.bounds[max(stage.start - reach, 0)]
            hi = problem.bounds[min(stage.start + reach, problem.n)]
            marks.update(allowed[(allowed >= lo) & (allowed <= hi)].tolist())
    return problem.with_bounds(sorted(marks))


def on_units(layout: Layout, coarse: Problem, fine: Problem) -> Layout:
    """``layout`` (on ``coarse``'s units) on ``fine``'s, whose boundaries include coarse's."""
    def unit(u: int) -> int:
        return fine.unit_at(int(coarse.bounds[u]))

    return Layout(tuple(replace(st, start=unit(st.start), stop=unit(st.stop))
                        for st in layout.stages), layout.microbatches, layout.origin)


def _limit_replicas(tables, most: int) -> None:
    """Leave ``tables`` no stage on more than ``most`` devices (their cost made infinite)."""
    wide = tables.base.size > most  # [run start, run end]
    tables.need = np.where(wide[None, None], np.inf, tables.need)


def _distinct(problem: Problem, items: list, score) -> list:
    """Drop layouts that differ only by which equal devices they use (they time identically)."""
    out, seen = [], set()
    for item in items:
        lay = item.layout
        sig = (round(score(item), 6), lay.microbatches,
               tuple((s.start, s.stop, _types(problem, s.devices)) for s in lay.stages))
        if sig not in seen:
            seen.add(sig)
            out.append(item)
    return out


def _types(problem: Problem, devices: Sequence[str]) -> tuple[int, ...]:
    return tuple(sorted(int(problem.type_of[problem.device_index[d]]) for d in devices))
