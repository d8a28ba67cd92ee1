"""Lowering: a ``plan`` on an op graph and a cluster becomes a ``TaskGraph``.

What a plan turns into (docs/simulator.md has the full list and the reasons):

* **Units.** Every op is a unit, except that ops named together in
  ``fusion.op_groups`` form one fused unit timed by ``CostModel.fused_ms``, and an
  op placement's runtime units (``units.placement_units_of``) are one unit each,
  timed as the sum of their ops: the runtime receives all of a unit's inputs
  before it runs it and sends its outputs when it ends.
* **Replicas.** Each device of a group is a replica that holds its batch
  share; its interval of the batch is the cumulative share ``[lo, hi)``. With a
  pipeline every stage runs ``microbatches`` microbatches of ``1/microbatches``.
* **Compute.** Per replica and microbatch: one forward task per unit and one
  backward task per unit that needs a gradient (an op needs one when it, or an
  op it depends on, has parameters). Times come from ``CostModel.op_ms`` at the
  replica's batch fraction.
* **Data and gradients** (``lower_comm.py``). Transfers between the replicas of
  groups whose batch intervals overlap, gradient synchronisation (AllReduce per
  bucket, PS, sufficient factors, tied weights), then one optimizer update per
  device (PS groups update on the servers).
* **Split backwards.** Where a pipeline schedule runs a microbatch's backward as
  ``I`` then ``W``, each unit's backward task keeps the input-gradient share of its
  time (``CostModel.bwd_input_share``), which the stage before waits for, and a
  weight-gradient task after it takes the rest; gradient synchronisation and the
  release of stashed activations wait for the W.
* **Order.** A device with a pipeline schedule or an entry in ``plan.order``
  runs its compute tasks exactly in that order (chained); other devices pick
  the ready task of highest default priority: forward in topological order,
  then backward in reverse topological order, then the update.
"""

from __future__ import annotations

import heapq
from collections import defaultdict

from dl_nfv.artifacts import (
    BadInput,
    Compression,
    OpGraph,
    Plan,
    SyncMethod,
    Topology,
)

from .costs import CostModel
from .lower_comm import ELEMENT_BYTES, _Communication, _Groups
from .tasks import TaskGraph, TaskKind
from .units import placement_units_of

__all__ = ["ELEMENT_BYTES", "check_fusion", "lower"]



def lower(plan: Plan, graph: OpGraph, topology: Topology, cost_model: CostModel) -> TaskGraph:
    """Lower ``plan`` into a task graph (see the module docstring for the semantics).

    Parameters
    ----------
    plan, graph, topology
        Artifacts already checked by ``validate_against``.
    cost_model
        Times of every task.

    Returns
    -------
    TaskGraph

    Raises
    ------
    BadInput
        For a plan field the simulator does not model (named in the message),
        an ``order`` that does not list exactly a device's ops, a fusion op
        group spanning groups or forming a cycle.

    Complexity: O((ops + edges) x replicas x microbatches + collectives x devices).
    """
    return _Lowering(plan, graph, topology, cost_model).build()


def check_fusion(plan: Plan, graph: OpGraph) -> None:
    """Raise ``BadInput`` naming the first way ``plan.fusion`` does not fit ``graph``.

    A fused op group names ops of the graph, all of one plan group, that form a
    connected subgraph (through the graph's edges between them), and the fused units
    leave the graph acyclic: no path leaves a group and re-enters it, and no two groups
    wait on each other. A gradient bucket names ops of the graph, all of one plan group
    (an op without parameters adds nothing to it); a group with any bucket has every op
    with parameters in one. (A gradient in two buckets is refused when the plan loads.)
    O(ops + edges).
    """
    fusion = plan.fusion
    if fusion is None:
        return
    index = graph.index
    group_of = {op: g.id for g in plan.groups for op in g.ops}
    adjacent: dict[str, list[str]] = defaultdict(list)
    for e in graph.edges:
        adjacent[e.src].append(e.dst)
        adjacent[e.dst].append(e.src)
    unit_of: dict[str, int] = {}
    for k, ops in enumerate(fusion.op_groups):
        where = f"plan fusion.op_groups[{k}]"
        absent = [op for op in ops if op not in index]
        if absent:
            raise BadInput(f"{where} names op {absent[0]!r}, which the graph "
                           f"{graph.model.name!r} does not have")
        gs = sorted({group_of[op] for op in ops})
        if len(gs) > 1:
            raise BadInput(f"{where} fuses ops of groups {gs}; a fused kernel must run in one group")
        unit_of.update((op, k) for op in ops)
    _check_fused_acyclic(graph, fusion.op_groups, unit_of)
    for k, ops in enumerate(fusion.op_groups):
        if not ops:
            continue
        inside, seen, todo = set(ops), {ops[0]}, [ops[0]]
        while todo:
            for nb in adjacent[todo.pop()]:
                if nb in inside and nb not in seen:
                    seen.add(nb)
                    todo.append(nb)
        if len(seen) < len(inside):
            apart = next(op for op in ops if op not in seen)
            raise BadInput(f"plan fusion.op_groups[{k}] fuses {apart!r}, which no edge between "
                           f"the group's ops joins to {ops[0]!r}; a fused kernel holds adjacent ops")
    bucketed: set[str] = set()
    for k, bucket in enumerate(fusion.gradient_buckets):
        where = f"plan fusion.gradient_buckets[{k}]"
        for op in bucket:
            if op not in index:
                raise BadInput(f"{where} names op {op!r}, which the graph {graph.model.name!r} "
                               f"does not have")
        gs = sorted({group_of[op] for op in bucket})
        if len(gs) > 1:
            raise BadInput(f"{where} mixes ops of groups {gs}; a bucket is synchronised over "
                           f"one group's devices")
        bucketed.update(bucket)
    in_buckets = {group_of[op] for op in bucketed}
    for g in plan.groups:
        loose = [op for op in g.ops if index[op].param_bytes > 0 and op not in bucketed] \
            if g.id in in_buckets else []
        if loose:
            raise BadInput(f"plan fusion.gradient_buckets: op {loose[0]!r} of group {g.id!r} has "
                           f"parameters but is in no bucket, while the group's other gradients "
                           f"are bucketed")


def _check_fused_acyclic(graph: OpGraph, op_groups, unit_of: dict[str, int]) -> None:
    """``BadInput`` naming a fused op group that sits on a cycle of the unit graph (ops
    outside every group are units of their own), by Kahn's algorithm."""
    unit = {op.id: unit_of.get(op.id, f"op {op.id}") for op in graph.ops}
    blocked = graph.blocked_units(unit)
    if blocked:
        k = min(u for u in blocked if isinstance(u, int))
        raise BadInput(f"plan fusion.op_groups[{k}] {list(op_groups[k])} forms a cycle with the "
                       f"ops between them (a path leaves the group and re-enters it, or two "
                       f"groups wait on each other); a fused kernel cannot both feed and wait "
                       f"for them")


def _unit_graph(graph: OpGraph, pieces: list[list[str]], runs: dict[str, tuple[str, int]],
                pos: dict[str, int]):
    """Units of ``pieces`` (a piece joins the unit of its run in ``runs``, keyed by its
    first op): ``(unit_of, members, parts, unit edges, topological order of units)``, or
    None when the units wait on each other in a cycle. O(ops + edges + units log units)."""
    unit_of: dict[str, int] = {}
    members: list[list[str]] = []
    parts: list[list[list[str]]] = []
    unit_of_run: dict[tuple[str, int], int] = {}
    for piece in sorted(pieces, key=lambda ops: pos[ops[0]]):
        run = runs.get(piece[0])
        u = unit_of_run.get(run) if run is not None else None
        if u is None:
            u = len(members)
            members.append([])
            parts.append([])
            if run is not None:
                unit_of_run[run] = u
        members[u].extend(piece)
        parts[u].append(piece)
        unit_of.update((op, u) for op in piece)
    for m in members:
        m.sort(key=pos.__getitem__)
    n_units = len(members)
    uedges: set[tuple[int, int]] = set()
    for e in graph.edges:
        ua, ub = unit_of[e.src], unit_of[e.dst]
        if ua != ub:
            uedges.add((ua, ub))
    indeg = [0] * n_units
    out: list[list[int]] = [[] for _ in range(n_units)]
    for ua, ub in sorted(uedges):
        out[ua].append(ub)
        indeg[ub] += 1
    first = [pos[m[0]] for m in members]
    heap = [(first[u], u) for u in range(n_units) if indeg[u] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, u = heapq.heappop(heap)
        order.append(u)
        for v in out[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, (first[v], v))
    if len(order) < n_units:
        return None
    return unit_of, members, parts, uedges, order


class _Lowering(_Communication):
    def __init__(self, plan: Plan, graph: OpGraph, topology: Topology, cm: CostModel):
        self.plan = plan
        self.graph = graph
        self.cm = cm
        self.cluster = cm.cluster
        names = list(plan.devices)
        self.dev_index = {d: i for i, d in enumerate(names)}
        self.device_names = names
        self.M = plan.pipeline.microbatches if plan.pipeline else 1
        self.groups = _Groups(plan, self.dev_index)
        self.group_index = {g.id: i for i, g in enumerate(plan.groups)}
        self.op_group = {op: self.group_index[g.id] for g in plan.groups for op in g.ops}
        self._links: dict[tuple[str, str], int] = {}
        self._route_res: dict[tuple[int, int], tuple[int, ...]] = {}
        self._link_names: list[tuple[str, str]] = []
        # (group, device, microbatch) whose backward the pipeline schedule splits (I, then W)
        self.split: set[tuple[int, int, int]] = set()
        if plan.pipeline is not None:
            stage_group = [self.group_index[sid] for sid in plan.pipeline.stages]
            for device in plan.pipeline.schedule:
                d = self.dev_index.get(device)
                for a in plan.pipeline.actions(device) if d is not None else ():
                    if a.op == "I":
                        self.split.add((stage_group[a.stage], d, a.microbatch))
        self.w_of: dict[int, int] = {}  # a split backward's task -> its W task

    # ------------------------------------------------------------------ units
    def _units(self) -> None:
        graph, plan = self.graph, self.plan
        topo = self.cm.topological_ids
        pos = {op: i for i, op in enumerate(topo)}
        # pieces: a fused op group (``plan.fusion.op_groups``) or a single op
        fused: set[str] = set()
        pieces: list[list[str]] = []
        if plan.fusion is not None:  # (check_fusion has vetted its ops and groups)
            for ops in plan.fusion.op_groups:
                if len(ops) < 2:
                    continue
                fused.update(ops)
                pieces.append(sorted(ops, key=pos.__getitem__))
        pieces.extend([op] for op in topo if op not in fused)
        runs = self._runtime_units(pieces, pos)
        built = _unit_graph(graph, pieces, runs, pos)
        if built is None:  # (check_fusion and placement_units rule this out)
            raise BadInput("plan fusion op groups form a cycle with the ops between them; a "
                           "fused kernel cannot both feed and wait for them")
        unit_of, members, parts, uedges, order = built
        n_units = len(members)
        self.unit_pos = [0] * n_units
        for i, u in enumerate(order):
            self.unit_pos[u] = i
        self.unit_order = order
        self.unit_of = unit_of
        self.members = members
        self.parts = parts
        self.unit_group = [self.op_group[m[0]] for m in members]
        # an op needs a gradient when it or an ancestor has parameters
        self.needs_grad = needs = self.cm.needs_grad
        self.unit_rg = [any(needs[o] for o in m) for m in members]
        self.unit_edges = sorted(uedges)

    def _runtime_units(self, pieces: list[list[str]],
                       pos: dict[str, int]) -> dict[str, tuple[str, int]]:
        """First op of a piece -> the runtime unit it runs in, for an op placement whose
        units (``units.placement_units_of``) hold whole pieces; empty otherwise (every piece
        is then a unit of its own). A runtime unit receives all its inputs before it starts
        and sends its outputs when it ends, so the simulator runs it as one task. A unit
        that spans groups of the same devices and shares is cut where the group changes,
        in the order its devices run it (``plan.order``, else topological; the simulator's
        replicas belong to one group), which keeps the units acyclic."""
        plan = self.plan
        if plan.pipeline is not None or len(plan.groups) < 2:
            return {}
        run_of = placement_units_of(plan, self.graph)
        in_run: dict[str, list[list[str]]] = defaultdict(list)
        for piece in pieces:
            found = {run_of.get(op) for op in piece}
            if len(found) > 1:  # a fused group across runtime units: keep ops apart
                return {}
            run = found.pop()
            if run is not None:
                in_run[run].append(piece)
        runs: dict[str, tuple[str, int]] = {}
        for run, members in in_run.items():
            device = plan.groups[self.op_group[members[0][0]]].devices[0]
            where = {op: i for i, op in enumerate(plan.order.get(device, ()))} or pos
            cut, group = 0, None
            for piece in sorted(members, key=lambda ops: min(where[o] for o in ops)):
                g = self.op_group[piece[0]]
                if group is not None and g != group:
                    cut += 1
                group = g
                runs[piece[0]] = (run, cut)
        return runs

    # ----------------------------------------------------------------- build
    def build(self) -> TaskGraph:
        self._check_supported()
        self._units()
        groups = self.groups
        n_dev = len(self.device_names)
        # resources: links get ids as routes are met; collective streams are appended last,
        # so they are given ids after building (offset fixed up at the end).
        tg = TaskGraph(self.device_names, [], 0)
        tg.microbatches = self.M
        tg.unit_names = ["+".join(m) if len(m) <= 3 else f"{m[0]}+..+{m[-1]} ({len(m)} ops)"
                         for m in self.members]
        tg.replica_device = list(groups.rep_device)
        tg.group_ids = list(groups.ids)
        tg.host_driven = [self.cluster.device(d).type.kind.value == "cpu" for d in self.device_names]
        self.tg = tg
        self._stream_tasks: list[int] = []
        self._ties: list | None = None  # _split_ties, computed once

        self._compute_tasks()
        self._charge_actions()
        self._charge_loss()
        self._data_edges()
        self._gradients()
        self._orders()
        self._memory()

        links = list(self._link_names)
        n_links = len(links)
        tg.n_links = n_links
        tg.resource_names = [*links, *(f"{d} collectives" for d in self.device_names)]
        # collective streams were recorded as -1 - device; map them after the links
        res = tg.resources
        for t in self._stream_tasks:
            res[t] = tuple(r if r >= 0 else n_links + (-1 - r) for r in res[t])
        for d in range(n_dev):
            tg.capacity_bytes[d] = self.cluster.device(self.device_names[d]).memory_bytes
        return tg

    def _check_supported(self) -> None:
        plan = self.plan
        if plan.pipeline is not None:
            staged = set(plan.pipeline.stages)
            loose = [g.id for g in plan.groups if g.id not in staged]
            if loose:
                raise BadInput(f"plan group {loose[0]!r} is not a pipeline stage; the simulator "
                               f"models pipelines whose stages hold every group")
        for device, ops in plan.order.items():
            on_device = [op for g in plan.groups if device in g.devices for op in g.ops]
            if len(ops) != len(on_device):
                missing = sorted(set(on_device) - set(ops))
                raise BadInput(f"plan order of {device!r} lists {len(ops)} of the "
                               f"{len(on_device)} ops that run there (missing {missing[0]!r}); "
                               f"an order must list every op of the device")
        check_fusion(plan, self.graph)
        for g in plan.groups:
            if g.compression == Compression.SFB and g.sync != SyncMethod.ALLREDUCE:
                raise BadInput(f"plan group {g.id!r}: compression 'sfb' is modelled with sync "
                               f"'allreduce' only, not {g.sync.value!r}")

    # ------------------------------------------------------------ compute
    def _unit_times(self, rep: int) -> tuple[list[float], list[float]]:
        """Forward and backward time of every unit of the replica's group (per microbatch)."""
        cm, groups = self.cm, self.groups
        device = self.device_names[groups.rep_device[rep]]
        frac = groups.rep_share[rep] / self.M
        key = (cm.device_type_index[device], frac)
        cache = self._time_cache
        tables = cache.get(key)
        if tables is None:
            f, b = cm.scaled_tables(key[0], frac)
            tables = cache[key] = (f.tolist(), b.tolist())
        return tables

    def _compute_tasks(self) -> None:
        """Forward and backward tasks of every unit, replica and microbatch, in bulk.

        The tasks of unit ``u`` are contiguous: forward of replica ``rep`` (the
        k-th replica of its group) and microbatch ``m`` is ``F[u][rep] + m`` with
        ``F[u][rep] = base + k * M``; backward likewise. Lists are extended in
        bulk rather than task by task, since lowering dominates a simulation.
        """
        tg, M, groups = self.tg, self.M, self.groups
        self._time_cache: dict = {}
        op_index = self.cm.op_index
        n_units = len(self.members)
        self.F: list[dict[int, int]] = [dict() for _ in range(n_units)]  # unit -> rep -> base id
        self.B: list[dict[int, int]] = [dict() for _ in range(n_units)]
        U3 = 3 * n_units
        kind, device, res, dur = tg.kind, tg.device, tg.resources, tg.duration_ms
        prio, succ, ndeps, nbytes, info = tg.priority, tg.succ, tg.ndeps, tg.nbytes, tg.info
        mbs = range(M)
        for u in self.unit_order:
            g = self.unit_group[u]
            ops = self.members[u]
            reps = groups.replicas[g]
            pos = self.unit_pos[u]
            n = len(reps) * M
            f_times, b_times = [], []
            if len(ops) > 1:  # the sum of its pieces: fused groups and single ops
                for rep in reps:
                    f_ms = b_ms = 0.0
                    ftab, btab = self._unit_times(rep)
                    name = self.device_names[groups.rep_device[rep]]
                    frac = groups.rep_share[rep] / M
                    for piece in self.parts[u]:
                        if len(piece) == 1:  # (an op that needs no gradient runs no backward)
                            f_ms += ftab[op_index[piece[0]]]
                            b_ms += btab[op_index[piece[0]]] if self.needs_grad[piece[0]] else 0.0
                            continue
                        rg_ops = [o for o in piece if self.needs_grad[o]]
                        f_ms += self.cm.fused_ms(piece, name, "fwd", frac)
                        b_ms += self.cm.fused_ms(rg_ops, name, "bwd", frac) if rg_ops else 0.0
                    f_times.append(f_ms)
                    b_times.append(b_ms)
            else:
                i = op_index[ops[0]]
                for rep in reps:
                    ftab, btab = self._unit_times(rep)
                    f_times.append(ftab[i])
                    b_times.append(btab[i])
            raw_b = b_times
            # each backward adds the unit's weight gradients into their buckets
            added, unsummed = self._bucket_bytes(ops)
            if added > 0 or unsummed:
                cm = self.cm
                names = [self.device_names[groups.rep_device[rep]] for rep in reps]
                b_times = [max(0.0, ms + added * cm.accumulate_ms_per_byte(d)
                               - sum(cm.tie_sum_ms(o, d) for o in unsummed))
                           for ms, d in zip(b_times, names)]
            devs = [groups.rep_device[rep] for rep in reps]
            infos = [(u, rep, m) for rep in reps for m in mbs]
            base_f = len(kind)
            Fu = self.F[u]
            for k, rep in enumerate(reps):
                Fu[rep] = base_f + k * M
            kind.extend([TaskKind.FORWARD] * n)
            res.extend([()] * n)
            nbytes.extend([0.0] * n)
            ndeps.extend([0] * n)
            succ.extend([[] for _ in range(n)])
            info.extend(infos)
            if M == 1:
                device.extend(devs)
                dur.extend(f_times)
                prio.extend([pos] * n)
            else:
                for d, ms in zip(devs, f_times):
                    device.extend([d] * M)
                    dur.extend([ms] * M)
                    prio.extend(range(pos, pos + U3 * M, U3))
            if not self.unit_rg[u]:
                continue
            base_b = len(kind)
            Bu = self.B[u]
            for k, rep in enumerate(reps):
                Bu[rep] = base_b + k * M
            kind.extend([TaskKind.BACKWARD] * n)
            res.extend([()] * n)
            nbytes.extend([0.0] * n)
            ndeps.extend([1] * n)  # its own forward
            succ.extend([[] for _ in range(n)])
            info.extend(infos)
            if M == 1:
                device.extend(devs)
                dur.extend(b_times)
                prio.extend([U3 - n_units - pos] * n)
            else:
                for d, ms in zip(devs, b_times):
                    device.extend([d] * M)
                    dur.extend([ms] * M)
                    prio.extend(range(U3 - n_units - pos, U3 - n_units - pos + U3 * M, U3))
            for k in range(n):
                succ[base_f + k].append(base_b + k)
            if self.split:
                self._split_backwards(u, g, reps, devs, raw_b, b_times, base_b)

    def _charge_actions(self) -> None:
        """The runtime's CPU per unit action on every replica and microbatch of each of its
        units, on a unit's first forward task and its first backward task. A pipeline stage
        or the whole model is its group's one unit and pays ``CostModel.unit_action_ms``
        per action (measured on two units: with the step's upkeep that does not grow with
        the units). An op placement runs each run of ops as one unit
        (``units.placement_units_of``), and each pays ``CostModel.op_action_ms`` per action
        (what one more action costs alone), where the profile measured it; where it did not,
        its groups pay as a stage does."""
        tg, groups, M, names = self.tg, self.groups, self.M, self.device_names
        placement = self.plan.pipeline is None and len(self.plan.groups) > 1
        per_op = {d: self.cm.op_action_ms(d) for d in names} if placement else {}
        if per_op and all(ms is not None for ms in per_op.values()):
            fee = per_op
            unit_of = placement_units_of(self.plan, self.graph)
        else:
            fee = {d: self.cm.unit_action_ms(d) for d in names}
            unit_of = self.op_group
        if not any(ms > 0 for ms in fee.values()):
            return  # (GPUs, profiles without the figure: nothing to charge)
        first_f: dict = {}
        first_b: dict = {}
        for u in self.unit_order:
            key = unit_of.get(self.members[u][0])
            if key is None:  # an input of a placement: no action of its own
                continue
            first_f.setdefault(key, u)
            if self.unit_rg[u]:
                first_b.setdefault(key, u)
        for key, u in first_f.items():
            for rep in groups.replicas[self.unit_group[u]]:
                ms = fee[names[groups.rep_device[rep]]]
                if ms <= 0:
                    continue
                for table, unit in ((self.F, u), (self.B, first_b.get(key))):
                    if unit is not None and rep in table[unit]:
                        for m in range(M):
                            tg.duration_ms[table[unit][rep] + m] += ms

    def _charge_loss(self) -> None:
        """The loss (``CostModel.loss_ms``) on every replica and microbatch of the unit that
        ends the model (the last unit holding an op whose output nothing reads), at the
        replica's share of the microbatch, on its forward task: the runtime computes the loss
        right after that unit's forward."""
        tg, groups, M = self.tg, self.groups, self.M
        read = {e.src for e in self.graph.edges}
        ends = [u for u in self.unit_order if any(o not in read for o in self.members[u])]
        if not ends:
            return
        u = ends[-1]
        for rep, base in self.F[u].items():
            ms = self.cm.loss_ms(self.device_names[groups.rep_device[rep]],
                                 groups.rep_share[rep] / M)
            for m in range(M):
                tg.duration_ms[base + m] += ms

    def _split_backwards(self, u: int, g: int, reps: list[int], devs: list[int],
                         raw_b: list[float], b_times: list[float], base_b: int) -> None:
        """Backwards the schedule splits (``I`` then ``W``): the unit's backward task keeps
        the input-gradient share of its time (``CostModel.bwd_input_share``, by FLOPs), which
        the stage before waits for, and a weight-gradient task after it takes the rest,
        with adding the weight gradients into their buckets. A unit whose backward is all
        input gradients (no weights, or the split not profiled) gets no W."""
        M, tg, cm = self.M, self.tg, self.cm
        ops = self.members[u]
        for k, (rep, d) in enumerate(zip(reps, devs)):
            mbs = [m for m in range(M) if (g, d, m) in self.split]
            if not mbs:
                continue
            if len(ops) == 1:
                share = float(cm.bwd_input_share[cm.op_index[ops[0]]])
            else:  # a fused unit: its ops' shares weighted by their backward times
                j = cm.device_type_index[self.device_names[d]]
                idx = [cm.op_index[o] for o in ops]
                times = cm.bwd_ms_by_type[idx, j]
                share = float((cm.bwd_input_share[idx] * times).sum() / max(times.sum(), 1e-12))
            if share >= 1.0:  # no weight gradients (or the split not profiled): no W
                continue
            i_ms = min(raw_b[k] * share, b_times[k])
            w_ms = b_times[k] - i_ms
            for m in mbs:
                b = base_b + k * M + m
                tg.duration_ms[b] = i_ms
                w = tg.add_compute(TaskKind.BACKWARD, d, w_ms, tg.priority[b], (u, rep, m, "W"))
                tg.depend(b, w)
                self.w_of[b] = w

    # -------------------------------------------------------------- order
    def _orders(self) -> None:
        plan, tg, M, groups = self.plan, self.tg, self.M, self.groups
        chains: dict[int, list[int]] = {}
        rep_of: dict[tuple[int, int], int] = {}  # (group, device) -> replica
        for gi, reps in enumerate(groups.replicas):
            for r in reps:
                rep_of[(gi, groups.rep_device[r])] = r
        op_pos = {}
        for device, ops in plan.order.items():
            op_pos[self.dev_index[device]] = {op: i for i, op in enumerate(ops)}

        def units_on(gi: int, d: int) -> list[int]:
            units = [u for u in self.unit_order if self.unit_group[u] == gi]
            where = op_pos.get(d)
            if where is not None:
                units.sort(key=lambda u: min(where[o] for o in self.members[u]))
            return units

        if plan.pipeline is not None:
            self._turn_cache: dict[tuple[int, int], float] = {}
            pipe = plan.pipeline
            stage_group = [self.group_index[s] for s in pipe.stages]
            stage_units: dict[tuple[int, int], list[int]] = {}
            for device in self.device_names:
                d = self.dev_index[device]
                actions = pipe.actions(device)
                if not actions:
                    continue
                chain = chains[d] = []
                last = None  # the device's last action: (stage, forward?), None after a W
                for a in actions:
                    gi = stage_group[a.stage]
                    r = rep_of[(gi, d)]
                    units = stage_units.get((gi, d))
                    if units is None:
                        units = stage_units[(gi, d)] = units_on(gi, d)
                    begins = len(chain)
                    if a.op == "F":
                        chain.extend(self.F[u][r] + a.microbatch for u in units)
                    elif a.op == "W":
                        w_of = self.w_of
                        chain.extend(w_of[b] for u in reversed(units)
                                     if self.unit_rg[u] and (b := self.B[u][r] + a.microbatch) in w_of)
                    else:  # B, or I (whose W comes later)
                        chain.extend(self.B[u][r] + a.microbatch for u in reversed(units)
                                     if self.unit_rg[u])
                    if len(chain) > begins:
                        now = None if a.op == "W" else (a.stage, a.op == "F")
                        if now is not None and now == last:  # no turn: the op times hold one
                            self._take_off(chain[begins:], self._turn_ms(gi, d, now[1]))
                        last = now
        for d, where in op_pos.items():
            if d in chains:
                continue
            chain = chains[d] = []
            gis = [gi for gi in range(len(groups.replicas)) if (gi, d) in rep_of]
            units = sorted((u for gi in gis for u in self.unit_order if self.unit_group[u] == gi),
                           key=lambda u: min(where[o] for o in self.members[u]))
            for m in range(M):
                for u in units:
                    chain.append(self.F[u][rep_of[(self.unit_group[u], d)]] + m)
            for m in range(M):
                for u in reversed(units):
                    if self.unit_rg[u]:
                        chain.append(self.B[u][rep_of[(self.unit_group[u], d)]] + m)
        self._charge_cold(chains)
        self._updates(chains)
        priority, succ, ndeps = tg.priority, tg.succ, tg.ndeps
        for chain in chains.values():
            for k, t in enumerate(chain):
                priority[t] = k
            for a, b in zip(chain, chain[1:]):
                succ[a].append(b)
                ndeps[b] += 1
        self.chains = chains

    def _charge_cold(self, chains: dict[int, list[int]]) -> None:
        """Each device's first forward task and first backward task of the step pay what the
        step's other work (the last step's update and collectives) left cold, for the ops the
        device runs (``CostModel.cold_ms``): the op times come from passes right after a
        pass of their own size."""
        info = self.graph.profile
        if info is None or not (info.cold_fwd_ms or info.cold_bwd_ms):
            return  # (not measured: GPUs, older profiles)
        tg, groups = self.tg, self.groups
        ops_on = defaultdict(list)  # device -> the ops it runs (a unit's once per device)
        for u in self.unit_order:
            for d in {groups.rep_device[r] for r in groups.replicas[self.unit_group[u]]}:
                ops_on[d].extend(self.members[u])
        unordered = defaultdict(list)  # devices without an order: by priority, as run
        for t, d in enumerate(tg.device):
            if d not in chains and tg.kind[t] in (TaskKind.FORWARD, TaskKind.BACKWARD):
                unordered[d].append(t)
        for d, chain in [*chains.items(), *((d, sorted(ts, key=tg.priority.__getitem__))
                                             for d, ts in unordered.items())]:
            extra = dict(zip((TaskKind.FORWARD, TaskKind.BACKWARD),
                             self.cm.cold_ms(self.device_names[d], ops_on[d])))
            for t in chain:
                ms = extra.pop(tg.kind[t], None)
                if ms:
                    tg.duration_ms[t] += ms
                if not extra:
                    break

    def _take_off(self, tasks: list[int], ms: float) -> None:
        """``ms`` less on ``tasks``, from the first on, none below 0."""
        duration = self.tg.duration_ms
        for t in tasks:
            if ms <= 0:
                return
            cut = min(ms, duration[t])
            duration[t] -= cut
            ms -= cut

    def _turn_ms(self, gi: int, d: int, forward: bool) -> float:
        """What an action of the stage of group ``gi`` on device ``d`` that does not turn
        between forward and backward takes less than its op times, which hold a turn (they
        come from forward-then-backward steps): the stage's share of a turn
        (``CostModel.turn_ms``), at most the action's batch-independent time (what a turn
        finds cold is what the ops touch whatever the batch; so a stage's microbatches never
        cost less than its ops at the whole batch once). An action does not turn where the
        device's action before it ran the same stage in the same direction: a GPipe stage's
        forwards and backwards after its first, a 1F1B stage's warm-up forwards and
        cool-down backwards (docs/cost-model.md, "Turns"). A split backward's weight
        gradients (``W``) neither take it nor leave the next action warm."""
        cache = self._turn_cache
        if (gi, d) not in cache:
            ops = [o for u in self.unit_order if self.unit_group[u] == gi for o in self.members[u]]
            name = self.device_names[d]
            turn = self.cm.turn_ms(name, ops)
            fwd_fixed, bwd_fixed = self.cm.fixed_ms(ops, name)
            cache[(gi, d)] = (min(turn, fwd_fixed), min(turn, bwd_fixed))
        return cache[(gi, d)][0 if forward else 1]

    # ------------------------------------------------------------- memory
    def _memory(self) -> None:
        tg, M, groups = self.tg, self.M, self.groups
        index = self.cm.ops_by_id
        F, B = self.F, self.B
        out_bytes = [float(sum(index[o].output_bytes for o in m)) for m in self.members]
        outs = self.transfers_out
        buf_alloc, buf_device, buf_bytes = tg.buf_alloc, tg.buf_device, tg.buf_bytes
        buf_rel = tg.buf_releasers
        for u in range(len(self.members)):
            size_full = out_bytes[u]
            if size_full <= 0:
                continue
            consumers = self.local_consumers.get(u, ())
            for rep, fa in F[u].items():
                d = groups.rep_device[rep]
                size = size_full * groups.rep_share[rep] / M
                bases = [(B[v][rep] if self.unit_rg[v] else F[v][rep]) for v in consumers]
                bases.extend(self.more_readers.get((u, rep), ()))
                if self.unit_rg[u]:
                    bases.append(B[u][rep])
                if size <= 0:
                    continue
                buf_alloc.extend(range(fa, fa + M))
                buf_device.extend([d] * M)
                buf_bytes.extend([size] * M)
                if M == 1:
                    rel = bases
                    rel.extend(outs.get((u, rep, 0), ()))
                    buf_rel.append(rel or [fa])
                    continue
                for m in range(M):
                    rel = [b + m for b in bases]
                    rel.extend(outs.get((u, rep, m), ()))
                    buf_rel.append(rel or [fa + m])
        for d, t, size, releasers, _ in self.received:
            tg.add_buffer(d, size, t, releasers)
        if self.w_of:  # a split backward's activations stay until its weight gradients
            w_of = self.w_of
            tg.buf_releasers = [[w_of.get(t, t) for t in rel] for rel in tg.buf_releasers]
        tg.static_bytes = list(self.static)
