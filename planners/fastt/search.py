"""FastT's search: list-scheduling candidates scored by the simulator, data-parallel starts,
unreplication and critical-path splits.

``Context`` holds what every candidate shares (graph, cluster, cost model,
memory caps); ``Candidate`` is one finished schedule with its simulated
iteration time. ``recipes`` lists the list schedulers tried and
``best_candidates`` runs them, simulating only the best by their own estimate;
``data_parallel_starts`` are the replicated candidates, ``dereplicate_search``
runs some of their ops whole, and ``split_search`` splits ops on the simulated
critical path of a placement over the batch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dl_nfv.artifacts import Fusion, Group, InfeasiblePlan, OpGraph, Optimizer, Plan, Topology
from dl_nfv.simulator import simulate
from dl_nfv.simulator.costs import CostModel, scale_by_batch
from dl_nfv.simulator.tasks import TaskKind

from ..base import device_speeds, gradient_buckets, integer_shares
from ..listsched import (
    MemoryShortfall,
    OpSchedule,
    Split,
    StepGraph,
    cpop_pins,
    downward_ranks,
    etf_schedule,
    list_schedule,
    plan_groups,
    upward_ranks,
)
from ..runnable import batch_norm_rows

BUCKET_BYTES = 25 * 2**20
MEMORY_RETRIES = 3
# Baechi's rules ("sct": its favourite-child LP, solved by PuLP/CBC; "topo") are candidates
# for graphs up to this size, where a candidate simulation is cheap
BAECHI_MAX_OPS = 800
# candidates simulated: the best by the list schedulers' estimate, within WINDOW of it
SIMULATED_CANDIDATES = 4
SIMULATED_STARTS = 2
WINDOW = 0.05
UNREPLICATE_TRIES = 8
SPLIT_OPS_PER_ROUND = 6


@dataclass(frozen=True, slots=True)
class Recipe:
    """How a schedule is (re)built: the list scheduler and the devices it may use."""

    name: str
    kind: str  # "heft", "cpop", "etf", "sct" (etf with favourite children) or "topo"
    allowed: tuple[int, ...]
    lookahead: bool = False


@dataclass(slots=True)
class Candidate:
    """A finished schedule, the plan parts made from it, and its simulated iteration time."""

    recipe: Recipe
    splits: dict[str, Split]
    schedule: OpSchedule
    groups: list[Group]
    order: dict[str, tuple[str, ...]]
    notes: list[str]
    fusion: Fusion | None
    iteration_ms: float
    result: object = field(repr=False, default=None)
    data_parallel: bool = False


class Context:
    """What every candidate of one planning run shares."""

    def __init__(self, graph: OpGraph, topology: Topology, cm: CostModel, *,
                 memory_fraction: float, planner: str = "fastt",
                 optimizer: Optimizer = Optimizer.SGD):
        self.graph = graph
        self.optimizer = optimizer
        self.topology = topology
        self.cm = cm
        self.planner = planner
        self.devices = list(cm.cluster.device_names)
        self.D = len(self.devices)
        self.capacity = [cm.memory_bytes(d) * memory_fraction for d in self.devices]
        # drafts are simulated without fingerprint checks; ``finish`` stamps the real ones
        self.graph_sha256 = self.topology_sha256 = "0" * 64
        self.batch_size = graph.model.batch_size
        self.topological_ids = graph.topological_ids()
        self.base = StepGraph(cm, self.devices, topological_ids=self.topological_ids,
                              optimizer=optimizer)
        self.speeds = device_speeds(cm, self.devices)
        # the rows a replica's slice must hold: batch norms with one value per channel need 2
        self.rows_needed = batch_norm_rows(graph)
        self.min_rows = max(self.rows_needed.values(), default=1)
        self.simulations = 0

    def colocated_with(self, op_id: str) -> tuple[str, ...]:
        """The ops of ``op_id``'s colocation group (just ``op_id`` when it is in none)."""
        return next((group for group in self.graph.colocation if op_id in group), (op_id,))

    def step_graph(self, splits: Mapping[str, Split]) -> StepGraph:
        if not splits:
            return self.base
        return StepGraph(self.cm, self.devices, splits=splits, topological_ids=self.topological_ids,
                         optimizer=self.optimizer)

    # ------------------------------------------------------------- schedules
    def buckets(self, splits: Mapping[str, Split]) -> list[list[int]]:
        """Gradient buckets of the ops replicated alike (data-parallel starts), as op indices."""
        by_split: dict[Split, list[str]] = {}
        for op_id in self.topological_ids:
            if op_id in splits:
                by_split.setdefault(splits[op_id], []).append(op_id)
        index = self.cm.op_index
        return [[index[o] for o in bucket] for ops in by_split.values() if len(ops) > 1
                for bucket in gradient_buckets(self.graph, ops, BUCKET_BYTES)]

    def schedule(self, recipe: Recipe, splits: Mapping[str, Split],
                 capacity: Sequence[float] | None = None, *,
                 data_parallel: bool = False) -> OpSchedule:
        """Run ``recipe`` on the step graph with ``splits``; raises ``MemoryShortfall``.

        With ``data_parallel`` the ops split alike are synchronised in buckets,
        as the plan will say."""
        sg = self.step_graph(splits)
        capacity = list(capacity or self.capacity)
        if data_parallel:
            return list_schedule(sg, upward_ranks(sg, recipe.allowed), allowed=recipe.allowed,
                                 capacity_bytes=capacity, algorithm=recipe.name,
                                 buckets=self.buckets(splits))
        if recipe.kind == "etf":
            return etf_schedule(sg, allowed=recipe.allowed, capacity_bytes=capacity,
                                algorithm=recipe.name)
        if recipe.kind == "topo":
            from ..baechi import topo_schedule

            return topo_schedule(sg, capacity)[0]
        if recipe.kind == "sct":
            from ..baechi import favourite_children

            favourite, _ = favourite_children(sg)
            return etf_schedule(sg, allowed=recipe.allowed, capacity_bytes=capacity,
                                favourite=favourite, algorithm=recipe.name)
        up = upward_ranks(sg, recipe.allowed)
        if recipe.kind == "cpop":
            down = downward_ranks(sg, recipe.allowed)
            pins, _ = cpop_pins(sg, recipe.allowed, up, down)
            return list_schedule(sg, [a + b for a, b in zip(up, down)], allowed=recipe.allowed,
                                 capacity_bytes=capacity, pins=pins, algorithm=recipe.name)
        return list_schedule(sg, up, allowed=recipe.allowed, capacity_bytes=capacity,
                             lookahead=recipe.lookahead, algorithm=recipe.name)

    def draft(self, groups, order, notes=(), fusion=None) -> Plan:
        return Plan(planner=self.planner, graph_sha256=self.graph_sha256,
                    topology_sha256=self.topology_sha256, batch_size=self.batch_size,
                    optimizer=self.optimizer, groups=tuple(groups), order=dict(order),
                    notes=tuple(notes), fusion=fusion)

    def score(self, recipe: Recipe, splits: Mapping[str, Split], schedule: OpSchedule, *,
              data_parallel: bool = False) -> tuple[Candidate, object]:
        """Simulate a schedule; returns the candidate and the simulation result."""
        groups, order, notes = plan_groups(schedule, merge_splits=data_parallel)
        fusion = None
        if data_parallel:
            # replicas run the graph's topological order (backwards in reverse), so the
            # gradient buckets fill in the order the backward pass produces them
            placed = {op: g.devices for g in groups for op in g.ops}
            order = {d: tuple(o for o in self.topological_ids if d in placed[o]) for d in order}
            merged = [g for g in groups if len(g.devices) > 1 and len(g.ops) > 1]
            buckets = tuple(b for g in merged
                            for b in gradient_buckets(self.graph, g.ops, BUCKET_BYTES))
            fusion = Fusion(gradient_buckets=buckets) if buckets else None
        result = simulate(self.draft(groups, order, notes, fusion), self.graph, self.topology,
                          cost_model=self.cm, check_fingerprints=False)
        self.simulations += 1
        cand = Candidate(recipe, dict(splits), schedule, groups, order, notes, fusion,
                         result.iteration_ms, result, data_parallel)
        return cand, result

    def build(self, recipe: Recipe, splits: Mapping[str, Split] | None = None, *,
              data_parallel: bool = False, schedule: OpSchedule | None = None) -> Candidate:
        """Schedule (unless ``schedule`` is given) and simulate; on a simulated memory
        overflow, tighten that device's cap and re-schedule (a few times).

        Raises ``MemoryShortfall`` when the schedule cannot be made to fit.
        """
        splits = dict(splits or {})
        capacity = list(self.capacity)
        for _ in range(MEMORY_RETRIES + 1):
            if schedule is None:
                schedule = self.schedule(recipe, splits, capacity, data_parallel=data_parallel)
            cand, result = self.score(recipe, splits, schedule, data_parallel=data_parallel)
            if result.feasible:
                return cand
            for device, _, shortfall in result.overflows:
                j = self.devices.index(device)
                capacity[j] = max(0.0, capacity[j] - 1.05 * shortfall)
            schedule = None
        device, _, shortfall = max(result.overflows, key=lambda o: o[2])
        j = self.devices.index(device)
        raise MemoryShortfall(f"(all ops of {device!r})", self.capacity[j] + shortfall, device,
                              self.capacity[j], self.capacity[j])

    def fits_on(self, allowed: Sequence[int]) -> bool:
        """Whether the whole model's memory is at most the total capacity of ``allowed``."""
        base = self.base
        need = sum(base.static_bytes) + sum(base.act_bytes)
        return need <= sum(self.capacity[j] for j in allowed)


def best_candidates(ctx: Context, tries: Sequence[tuple[Recipe, Mapping[str, Split]]], *,
                    data_parallel: bool = False, simulate_top: int, window: float
                    ) -> tuple[list[Candidate], list[MemoryShortfall], list[str]]:
    """Schedule every (recipe, splits); simulate the best by the schedulers' own estimate
    (which books links and gradient syncs as the simulator does, so it ranks candidates
    closely): at most ``simulate_top``, and only those within ``window`` (a fraction) of the
    best estimate.

    Returns the simulated candidates, the memory shortfalls met, and one note per try.
    """
    scheduled: list[tuple[float, int, Recipe, Mapping[str, Split], OpSchedule]] = []
    shortfalls: list[MemoryShortfall] = []
    notes: list[str] = []
    for k, (recipe, splits) in enumerate(tries):
        if not data_parallel and not ctx.fits_on(recipe.allowed):
            notes.append(f"{recipe.name}: skipped, the model does not fit on its devices")
            continue
        try:
            sched = ctx.schedule(recipe, splits, data_parallel=data_parallel)
        except MemoryShortfall as exc:
            shortfalls.append(exc)
            notes.append(f"{recipe.name}: out of memory ({exc.op_id!r} fits nowhere)")
            continue
        scheduled.append((sched.makespan_ms, k, recipe, splits, sched))
    scheduled.sort(key=lambda item: item[:2])
    out: list[Candidate] = []
    seen: dict[tuple, str] = {}  # placement and order -> the recipe that made it first
    rank = 0
    for estimate, _, recipe, splits, sched in scheduled:
        text = f"{recipe.name}: estimated {estimate:.3f} ms"
        key = (tuple(sorted(splits.items())), tuple(sched.device),
               tuple(sorted(range(len(sched.start)), key=lambda t: (sched.start[t], t))))
        if key in seen:  # several rules often build the same schedule: simulate it once
            notes.append(text + f", the same plan as {seen[key]}")
            continue
        seen[key] = recipe.name
        rank += 1
        if rank <= simulate_top and estimate <= scheduled[0][0] * (1 + window):
            try:
                cand = ctx.build(recipe, splits, data_parallel=data_parallel, schedule=sched)
                out.append(cand)
                text += f", simulated {cand.iteration_ms:.3f} ms"
            except MemoryShortfall as exc:
                shortfalls.append(exc)
                text += ", overflows memory when simulated"
        notes.append(text)
    return out, shortfalls, notes


# ------------------------------------------------------------------ recipes
def recipes(ctx: Context) -> list[Recipe]:
    """The list schedulers FastT tries: HEFT (with and without backward look-ahead), CPOP and
    earliest-task-first on every device (on graphs of up to ``BAECHI_MAX_OPS`` ops also with
    SCT's favourite children, which keep a child on its parent's device when the LP
    relaxation says its transfer is on the critical path, and Baechi's topological fill),
    and HEFT on the fastest devices
    only (1, 2, 4, ... of them, and the fastest device's host) - spreading ops over slow
    devices or slow links does not always pay. No one list-scheduling rule dominates the
    others on every graph, so the simulator picks.
    """
    all_devices = tuple(range(ctx.D))
    out = [Recipe("heft", "heft", all_devices), Recipe("heft-lookahead", "heft", all_devices, True),
           Recipe("cpop", "cpop", all_devices), Recipe("etf", "etf", all_devices)]
    if len(ctx.graph.ops) <= BAECHI_MAX_OPS:  # one more simulation each; an LP for sct
        out += [Recipe("sct", "sct", all_devices), Recipe("topo", "topo", all_devices)]
    by_speed = sorted(all_devices, key=lambda j: (-ctx.speeds[j], j))
    subsets: list[tuple[int, ...]] = []
    size = 1
    while size < ctx.D:
        subsets.append(tuple(sorted(by_speed[:size])))
        size *= 2
    host = ctx.cm.cluster.device(ctx.devices[by_speed[0]]).host
    same_host = tuple(j for j in all_devices if ctx.cm.cluster.device(ctx.devices[j]).host == host)
    if 1 < len(same_host) < ctx.D:
        subsets.append(same_host)
    seen = {all_devices}
    for subset in subsets:
        if subset not in seen:
            seen.add(subset)
            out.append(Recipe(f"heft@{len(subset)}-fastest" if subset != same_host else
                              f"heft@host-{host}", "heft", subset))
    return out


def data_parallel_starts(ctx: Context, max_split: int) -> list[tuple[str, dict[str, Split]]]:
    """Data-parallel starts: every op replicated with batch shares by device speed, over the
    ``max_split`` fastest devices, the fastest 2, 4, ... of them, and the fastest device's
    host - FastT's mixed data/model parallelism at its data-parallel end. (Replicas scale
    every op by their share, as data parallelism does, whatever its ``splittable_dims``.)"""
    by_speed = sorted(range(ctx.D), key=lambda j: (-ctx.speeds[j], j))
    subsets: list[tuple[str, list[int]]] = [("data-parallel start", by_speed[:max_split])]
    size = 2
    while size < min(max_split, ctx.D):
        subsets.append((f"data-parallel on {size} fastest", by_speed[:size]))
        size *= 2
    host = ctx.cm.cluster.device(ctx.devices[by_speed[0]]).host
    same_host = [j for j in by_speed if ctx.cm.cluster.device(ctx.devices[j]).host == host]
    subsets.append((f"data-parallel on host {host}", same_host[:max_split]))
    out: list[tuple[str, dict[str, Split]]] = []
    seen: set[Split] = set()
    for name, devices in subsets:
        devices = sorted(devices)
        kept = sample_counts(ctx.batch_size, devices, ctx.speeds, ctx.min_rows)
        if len(kept) < 2:
            continue
        split = Split(tuple(ctx.devices[j] for j, _ in kept), _shares([c for _, c in kept]))
        if split not in seen:
            seen.add(split)
            out.append((name, {op.id: split for op in ctx.graph.ops}))
    return out


def sample_counts(batch_size: int, devices: Sequence[int], weights: Sequence[float],
                  min_rows: int) -> list[tuple[int, int]]:
    """(device, samples) of the devices that get at least ``min_rows`` samples when the
    batch is split in proportion to ``weights`` (largest remainder); a device that would get
    fewer is left out (the lightest first) and the batch split again over the rest."""
    devices = list(devices)
    while devices:
        counts = integer_shares(batch_size, [weights[j] for j in devices])
        short = [(weights[j], -k) for k, (j, c) in enumerate(zip(devices, counts)) if 0 < c < min_rows]
        if not short:
            return [(j, c) for j, c in zip(devices, counts) if c > 0]
        del devices[-min(short)[1]]
    return []


def _shares(counts: Sequence[int]) -> tuple[float, ...]:
    total = sum(counts)
    shares = [c / total for c in counts]
    return (*shares[:-1], 1.0 - sum(shares[:-1]))


# ------------------------------------------------------------ op splitting
def critical_ops(cand: Candidate) -> list[str]:
    """Ops with a forward or backward on the simulated critical path (first to last)."""
    result = cand.result
    tg = result.tasks
    seen: dict[str, None] = {}
    for t in result.critical_path_tasks:
        if tg.kind[t] in (TaskKind.FORWARD, TaskKind.BACKWARD):
            name = tg.unit_names[tg.info[t][0]]
            if "+" not in name:
                seen.setdefault(name)
    return list(seen)


def split_for(ctx: Context, sched: OpSchedule, op_id: str, k: int) -> Split | None:
    """A k-way batch split of ``op_id``: its current device plus the k-1 devices where the op
    is cheapest to run after receiving its input; integer sample shares by the op's speed on
    each device. None when the batch is too small for k replicas."""
    sg = sched.sg
    i = ctx.cm.op_index[op_id]
    unit = sg.units_of_op[i][0]
    home = sched.device[unit]
    in_bytes = sum(b for _, b in sg.pred[unit])
    cost = {d: sg.fwd[unit][d] + sg.bwd[unit][d] for d in range(sg.D)}
    others = sorted((d for d in range(sg.D) if d != home),
                    key=lambda d: (cost[d] + sg.comm_ms(home, d, in_bytes), d))
    chosen = sorted([home, *others[:k - 1]])
    if len(chosen) < k:
        return None
    counts = integer_shares(ctx.batch_size, [1.0 / max(cost[d], 1e-9) for d in chosen])
    if min(counts) < ctx.rows_needed.get(op_id, 1):  # every replica trains some (enough) rows
        return None
    return Split(tuple(sg.devices[d] for d in chosen), _shares(counts))


def promising_splits(ctx: Context, sched: OpSchedule, op_id: str, k_max: int,
                     keep: int = 2) -> list[Split]:
    """The ``keep`` k-way splits (k = 2..``k_max``) that shorten the op's own span most.

    The span of a split op is its slowest replica's forward and backward plus
    the scatter of its input and the gather of its output (each way, both
    passes) and the AllReduce of its gradient; only splits shorter than the
    unsplit op are kept. Re-scheduling then decides.
    """
    sg = sched.sg
    cm = ctx.cm
    unit = sg.units_of_op[cm.op_index[op_id]][0]
    home = sched.device[unit]
    in_bytes = sum(b for _, b in sg.pred[unit])
    out_bytes = max((b for _, b in sg.succ[unit]), default=0.0)
    params = sg.param_bytes[unit]
    whole = sg.fwd[unit][home] + sg.bwd[unit][home]
    scored: list[tuple[float, int, Split]] = []
    for k in range(2, k_max + 1):
        split = split_for(ctx, sched, op_id, k)
        if split is None:
            continue
        span = 0.0
        for name, share in zip(split.devices, split.shares):
            d = sg.devices.index(name)
            work = sum(scale_by_batch(t[unit][d], fixed[unit][d], share)
                       for t, fixed in ((sg.fwd, sg.fwd_fixed), (sg.bwd, sg.bwd_fixed)))
            move = 2 * (sg.comm_ms(home, d, in_bytes * share) + sg.comm_ms(d, home, out_bytes * share))
            span = max(span, work + move)
        if params > 0:
            span += cm.allreduce_ms(list(split.devices), params)
        if span < whole:
            scored.append((span, k, split))
    return [split for _, _, split in sorted(scored, key=lambda x: x[:2])[:keep]]


def split_search(ctx: Context, start: Candidate, *, max_split: int, rounds: int,
                 ops_per_round: int, deadline: float) -> tuple[Candidate, list[str]]:
    """Split critical-path ops over the batch while the simulated iteration time falls.

    Each round takes the splittable ops on the current simulated critical
    path that are in no colocation group, longest first; for each, re-runs the candidate's list scheduler with
    the most promising k-way splits (k = 2..``max_split``, screened by
    ``promising_splits``), and keeps the best only if the *simulated*
    iteration time falls. Stops after
    ``rounds`` rounds, a round without improvement, or at ``deadline``
    (``time.process_time()`` seconds; a try is not started when the previous one,
    repeated, would end past it). Never returns a slower candidate.
    """
    current = start
    log: list[str] = []
    if ctx.D < 2 or start.data_parallel:
        return current, log
    k_max = min(max_split, ctx.D, ctx.batch_size)
    if k_max < 2:
        return current, log
    # a colocated op stays whole: split alone, it would leave its group's device
    colocated = {op for group in ctx.graph.colocation for op in group}
    splittable = {op.id for op in ctx.graph.ops if op.splittable_dims and op.id not in colocated}
    last_try = 0.0  # CPU seconds of the latest try: none starts that would end past deadline
    for r in range(rounds):
        sg = current.schedule.sg
        ops = [o for o in critical_ops(current) if o in splittable and o not in current.splits]
        work = {o: max(sg.fwd[u][current.schedule.device[u]] + sg.bwd[u][current.schedule.device[u]]
                       for u in sg.units_of_op[ctx.cm.op_index[o]]) for o in ops}
        ops = sorted(ops, key=lambda o: (-work[o], o))[:ops_per_round]
        improved = False
        for op_id in ops:
            began = time.process_time()
            if began + last_try > deadline:  # the next try would end past the time limit
                log.append(f"split search stopped at its time limit in round {r + 1}")
                return current, log
            best: tuple[OpSchedule, dict[str, Split]] | None = None
            for split in promising_splits(ctx, current.schedule, op_id, k_max):
                splits = {**current.splits, op_id: split}
                try:
                    sched = ctx.schedule(current.recipe, splits)
                except MemoryShortfall:
                    continue
                bar = best[0].makespan_ms if best else current.schedule.makespan_ms
                if sched.makespan_ms < bar * (1 - 1e-9):
                    best = (sched, splits)
            last_try = time.process_time() - began
            if best is None:
                continue
            cand, result = ctx.score(current.recipe, best[1], best[0])
            last_try = time.process_time() - began
            if result.feasible and cand.iteration_ms < current.iteration_ms * (1 - 1e-9):
                k = len(best[1][op_id].devices)
                log.append(f"round {r + 1}: split {op_id!r} {k}-way: {current.iteration_ms:.3f} -> "
                           f"{cand.iteration_ms:.3f} ms")
                current = cand
                improved = True
        if not improved:
            break
    return current, log


def dereplicate_search(ctx: Context, start: Candidate, *, tries: int, deadline: float
                       ) -> tuple[Candidate, list[str]]:
    """From a data-parallel start, run whole on one device the ops whose gradient
    synchronisation costs more than the compute a replica spends on them.

    Candidates are ops with parameters, by decreasing ratio of their
    AllReduce time over the replicas to their per-replica compute; each (with
    the rest of its colocation group, which must stay with it) is tried
    unreplicated (placed by HEFT, its activations gathered to it and
    scattered back), simulated only when the scheduler's estimate falls, and
    kept only if the simulated iteration time falls.
    Returns the best candidate and a log. O(``tries`` x (schedule + simulation)).
    """
    current, log = start, []
    if not start.splits:
        return current, log
    sg, cm = start.schedule.sg, ctx.cm
    ratio: dict[str, float] = {}
    for op_id, split in start.splits.items():
        units = sg.units_of_op[cm.op_index[op_id]]
        params = sg.param_bytes[units[0]]
        if params <= 0:
            continue
        compute = max(sg.fwd[u][sg.pin[u]] + sg.bwd[u][sg.pin[u]] for u in units)
        ratio[op_id] = cm.allreduce_ms(list(split.devices), params) / max(compute, 1e-6)
    ranked = sorted((o for o in ratio if ratio[o] > 0.5), key=lambda o: (-ratio[o], o))[:tries]
    last_try = 0.0
    for op_id in ranked:
        began = time.process_time()
        if began + last_try > deadline:
            log.append("unreplication stopped at its time limit")
            break
        whole = ctx.colocated_with(op_id)
        splits = {o: s for o, s in current.splits.items() if o not in whole}
        try:
            sched = ctx.schedule(current.recipe, splits, data_parallel=True)
        except MemoryShortfall:
            continue
        if sched.makespan_ms >= current.schedule.makespan_ms:
            continue  # screened out by the scheduler's own (bucket-aware) estimate
        try:
            cand = ctx.build(current.recipe, splits, data_parallel=True, schedule=sched)
        except MemoryShortfall:
            continue
        last_try = time.process_time() - began
        if cand.iteration_ms < current.iteration_ms * (1 - 1e-9):
            group = f" with its colocation group of {len(whole)}" if len(whole) > 1 else ""
            log.append(f"{op_id!r}{group} runs unreplicated: {current.iteration_ms:.3f} -> "
                       f"{cand.iteration_ms:.3f} ms")
            current = cand
    return current, log


def search(ctx: Context, *, split_critical: bool, max_split: int, split_rounds: int,
           deadline: float) -> tuple[Candidate, list[str]]:
    """FastT's whole search (see the package docstring); returns the best candidate and notes,
    the first saying what was kept.

    Raises ``InfeasiblePlan`` naming the op that fits nowhere when no list schedule fits.
    """
    candidates, shortfalls, tried = best_candidates(
        ctx, [(r, {}) for r in recipes(ctx)], simulate_top=SIMULATED_CANDIDATES, window=WINDOW)
    if not candidates:
        raise InfeasiblePlan(f"{ctx.planner}: {shortfalls[0].describe()}")
    best = min(candidates, key=lambda c: c.iteration_ms)
    dp_tries = [(Recipe(name, "heft", tuple(range(ctx.D))), splits)
                for name, splits in data_parallel_starts(ctx, max_split)] if split_critical else []
    starts, dp_notes = [], []
    if dp_tries:  # the start over every device (dp's plan) is always simulated
        first, _, dp_notes = best_candidates(ctx, dp_tries[:1], data_parallel=True,
                                             simulate_top=1, window=float("inf"))
        rest, _, more = best_candidates(ctx, dp_tries[1:], data_parallel=True,
                                        simulate_top=SIMULATED_STARTS - 1, window=WINDOW)
        starts, dp_notes = first + rest, dp_notes + more
    notes = [f"list scheduling: {best.recipe.name} kept; " + "; ".join(tried + dp_notes)]
    start = min(starts, key=lambda c: c.iteration_ms) if starts else None
    if start is not None:
        start, log = dereplicate_search(ctx, start, tries=UNREPLICATE_TRIES, deadline=deadline)
        notes += log
    if split_critical and split_rounds > 0:
        best, log = split_search(ctx, best, max_split=max_split, rounds=split_rounds,
                                 ops_per_round=SPLIT_OPS_PER_ROUND, deadline=deadline)
        notes += log
    if start is not None and start.iteration_ms < best.iteration_ms:
        best = start
        notes.append(f"{best.recipe.name} beats the best placement; kept")
    notes += best.notes
    kept = f"kept: {best.recipe.name}"
    whole = len(ctx.graph.ops) - len(best.splits)
    if best.data_parallel and whole:
        kept += f" with {whole} op{'s' if whole > 1 else ''} unreplicated"
    if not best.data_parallel and best.splits:
        n = len(best.splits)
        kept += f" with {n} critical-path split{'s' if n > 1 else ''}"
    notes.append(f"{ctx.simulations} candidate simulations")
    return best, [kept, *notes]

