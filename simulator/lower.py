"""Lowering: a ``plan`` on an op graph and a cluster becomes a ``TaskGraph``.

What a plan turns into (docs/simulator.md has the full list and the reasons):

* **Units.** Every op is a unit, except that ops named together in
  ``fusion.op_groups`` form one fused unit timed by ``CostModel.fused_ms``.
* **Replicas.** Each device of a group is a replica that holds its batch
  share; its interval of the batch is the cumulative share ``[lo, hi)``. With a
  pipeline every stage runs ``microbatches`` microbatches of ``1/microbatches``.
* **Compute.** Per replica and microbatch: one forward task per unit and one
  backward task per unit that needs a gradient (an op needs one when it, or an
  op it depends on, has parameters). Times come from ``CostModel.op_ms`` at the
  replica's batch fraction.
* **Data.** An edge inside a group links the same replica's tasks. An edge
  between groups becomes a transfer between every pair of replicas whose batch
  intervals overlap, carrying the overlap's share of the bytes (one transfer
  per producing op and consuming device, however many consumers there are);
  the backward pass sends the activation gradient back the same way.
* **Gradients.** Per group: AllReduce (``group.collective``) of its parameter
  bytes, one per ``fusion.gradient_buckets`` bucket (started when the bucket's
  ops finished their backward on every replica and microbatch) plus one for the
  rest; or PS push / server update / pull via ``ps_servers``; or nothing. With
  ``compression: sfb`` a matmul op whose sufficient-factor exchange is cheaper
  than its AllReduce (by the cost model) is all-gathered and recomputed instead.
  Then one optimizer update per device (PS groups update on the servers).
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
    TieSync,
    Topology,
)

from .costs import CostModel
from .tasks import TaskGraph, TaskKind

ELEMENT_BYTES = {"float32": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8}


class _Groups:
    """Per group: its replicas (global ids), their devices, shares and batch intervals."""

    def __init__(self, plan: Plan, dev_index: dict[str, int]):
        self.ids = [g.id for g in plan.groups]
        self.replicas: list[list[int]] = []
        self.rep_device: list[int] = []
        self.rep_share: list[float] = []
        self.rep_interval: list[tuple[float, float]] = []
        self.rep_local: list[int] = []
        for g in plan.groups:
            reps = []
            lo = 0.0
            for k, (d, s) in enumerate(zip(g.devices, g.shares)):
                r = len(self.rep_device)
                self.rep_device.append(dev_index[d])
                self.rep_share.append(s)
                self.rep_interval.append((lo, lo + s))
                self.rep_local.append(k)
                lo += s
                reps.append(r)
            self.replicas.append(reps)

    def overlaps(self, ga: int, gb: int) -> list[tuple[int, int, float]]:
        """Replica pairs ``(ra, rb, overlap)`` of groups ``ga`` and ``gb`` whose intervals meet."""
        out = []
        for ra in self.replicas[ga]:
            lo_a, hi_a = self.rep_interval[ra]
            for rb in self.replicas[gb]:
                lo_b, hi_b = self.rep_interval[rb]
                o = min(hi_a, hi_b) - max(lo_a, lo_b)
                if o > 1e-12:
                    out.append((ra, rb, o))
        return out


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


class _Lowering:
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
        unit_of: dict[str, int] = {}
        members: list[list[str]] = []
        fused: list[bool] = []
        if plan.fusion is not None:  # (check_fusion has vetted its ops and groups)
            for ops in plan.fusion.op_groups:
                if len(ops) < 2:
                    continue
                u = len(members)
                members.append(sorted(ops, key=pos.__getitem__))
                fused.append(True)
                for op in ops:
                    unit_of[op] = u
        for op in topo:
            if op not in unit_of:
                unit_of[op] = len(members)
                members.append([op])
                fused.append(False)
        # unit DAG, checked acyclic (fusing a->b->c without b is a cycle)
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
            stuck = next(u for u in range(n_units) if indeg[u] > 0 and fused[u])
            raise BadInput(f"plan fusion op group {members[stuck]} forms a cycle with the ops "
                           f"between them; a fused kernel cannot both feed and wait for them")
        self.unit_pos = [0] * n_units
        for i, u in enumerate(order):
            self.unit_pos[u] = i
        self.unit_order = order
        self.unit_of = unit_of
        self.members = members
        self.fused = fused
        self.unit_group = [self.op_group[m[0]] for m in members]
        # an op needs a gradient when it or an ancestor has parameters
        self.needs_grad = needs = self.cm.needs_grad
        self.unit_rg = [any(needs[o] for o in m) for m in members]
        self.unit_edges = sorted(uedges)

    # ------------------------------------------------------------- resources
    def _link_id(self, hop: tuple[str, str]) -> int:
        i = self._links.get(hop)
        if i is None:
            i = self._links[hop] = len(self._link_names)
            self._link_names.append(hop)
        return i

    def _route(self, a: int, b: int) -> tuple[int, ...]:
        key = (a, b)
        res = self._route_res.get(key)
        if res is None:
            route = self.cluster.route(self.device_names[a], self.device_names[b])
            res = self._route_res[key] = tuple(self._link_id(h) for h in route.hops)
        return res

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
            if self.fused[u]:
                rg_ops = [o for o in ops if self.needs_grad[o]]
                for rep in reps:
                    name = self.device_names[groups.rep_device[rep]]
                    frac = groups.rep_share[rep] / M
                    f_times.append(self.cm.fused_ms(ops, name, "fwd", frac))
                    b_times.append(self.cm.fused_ms(rg_ops, name, "bwd", frac) if rg_ops else 0.0)
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
        """The runtime's CPU per unit action (``CostModel.unit_action_ms``) on every replica
        and microbatch of a group: the runtime runs a group's ops as one unit (a pipeline
        stage, the whole model) with one forward and one backward action each, so its first
        unit's forward task and its first backward task carry it."""
        tg, groups, M = self.tg, self.groups, self.M
        first_f: dict[int, int] = {}
        first_b: dict[int, int] = {}
        for u in self.unit_order:
            first_f.setdefault(self.unit_group[u], u)
            if self.unit_rg[u]:
                first_b.setdefault(self.unit_group[u], u)
        for g, u in first_f.items():
            for rep in groups.replicas[g]:
                ms = self.cm.unit_action_ms(self.device_names[groups.rep_device[rep]])
                if ms <= 0:
                    continue
                for table, unit in ((self.F, u), (self.B, first_b.get(g))):
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

    def _bucket_bytes(self, ops) -> tuple[float, set[str]]:
        """What a backward of ``ops`` does with weight gradients: how many bytes it adds
        into its buckets (its own parameters; the copy of a tied weight held beyond its
        owner's group, ``_split_ties``), and which of its ops own a tied weight they no
        longer sum in the graph: profiled in one process, autograd sums the uses'
        gradients before accumulating (``CostModel.tie_sum_ms``, timed in the owner's
        backward); split across groups, the AllReduce or the exchange sums them instead."""
        index, mine = self.cm.ops_by_id, set(ops)
        added = float(sum(index[o].param_bytes for o in ops))
        unsummed: set[str] = set()
        for _, owner, nbytes, sharers, _, _ in self._split_ties():
            added += nbytes * sum(s in mine for s in sharers)
            if owner in mine:
                unsummed.add(owner)
        return added, unsummed

    # --------------------------------------------------------------- data
    def _data_edges(self) -> None:
        tg, M, groups = self.tg, self.M, self.groups
        F, B = self.F, self.B
        depend = tg.depend
        succ, ndeps = tg.succ, tg.ndeps
        mbs = range(M)
        # consumers of each op's output on the same replica (memory releasers) and outgoing
        # transfers are gathered here for _memory
        self.local_consumers: dict[int, list[int]] = defaultdict(list)  # unit -> consumer units
        # (unit, replica) -> tasks (base ids, + microbatch) that also read its output
        self.more_readers: dict[tuple[int, int], list[int]] = defaultdict(list)
        for ua, ub in self.unit_edges:
            if self.unit_group[ua] != self.unit_group[ub]:
                continue
            self.local_consumers[ua].append(ub)
            rg = self.unit_rg[ua]
            Fb, Ba, Bb = F[ub], B[ua], B[ub]
            for rep, fa in F[ua].items():
                fb = Fb[rep]
                for m in mbs:
                    succ[fa + m].append(fb + m)
                    ndeps[fb + m] += 1
                if rg:
                    ba, bb = Ba[rep], Bb[rep]
                    for m in mbs:
                        succ[bb + m].append(ba + m)
                        ndeps[ba + m] += 1
        # cross-group data: one transfer per (producing op, consuming group, replica pair, mb)
        cross: dict[tuple[str, int], list] = {}
        for e in self.graph.edges:
            ua, ub = self.unit_of[e.src], self.unit_of[e.dst]
            ga, gb = self.unit_group[ua], self.unit_group[ub]
            if ga == gb:
                continue
            entry = cross.setdefault((e.src, gb), [0, set()])
            entry[0] = max(entry[0], e.bytes)
            entry[1].add(ub)
        # (unit, replica, microbatch) -> transfers that send its output
        self.transfers_out: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        self.received: list[tuple[int, int, float, list[int], int]] = []
        overlap_cache: dict[tuple[int, int], list] = {}
        for (src, gb), (nbytes, consumers) in sorted(cross.items(), key=lambda kv: (
                self.unit_pos[self.unit_of[kv[0][0]]], kv[0][1])):
            ua = self.unit_of[src]
            ga = self.unit_group[ua]
            consumers = sorted(consumers, key=self.unit_pos.__getitem__)
            rg = self.unit_rg[ua]
            key = (ga, gb)
            pairs = overlap_cache.get(key)
            if pairs is None:
                pairs = overlap_cache[key] = groups.overlaps(ga, gb)
            for ra, rb, o in pairs:
                da, db = groups.rep_device[ra], groups.rep_device[rb]
                fa = F[ua][ra]
                fbs = [F[ub][rb] for ub in consumers]
                bbs = [B[ub][rb] for ub in consumers if self.unit_rg[ub]]
                ba = B[ua].get(ra)
                size = nbytes * o / M
                if da == db or size <= 0:
                    # same device: the consumer reads the producer's buffer; nothing to move
                    # (an edge of no bytes is an order, not a transfer: it holds no link)
                    for m in range(M):
                        for fb in fbs:
                            depend(fa + m, fb + m)
                        if rg:
                            for bb in bbs:
                                depend(bb + m, ba + m)
                    if da == db:
                        self.more_readers[(ua, ra)].extend(
                            (B[ub][rb] if self.unit_rg[ub] else F[ub][rb]) for ub in consumers)
                    continue
                hosts = tuple(-1 - d for d in (da, db) if tg.host_driven[d])
                fwd_ms = (self.cm.host_transfer_ms if hosts else self.cm.transfer_ms)(
                    self.device_names[da], self.device_names[db], size)
                res_f = self._route(da, db) + hosts
                res_b = self._route(db, da) + hosts if rg else ()
                for m in range(M):
                    t = tg.add_comm(TaskKind.TRANSFER, res_f, fwd_ms, size, (ua, "F", m, size, da, db))
                    if hosts:
                        self._stream_tasks.append(t)
                    depend(fa + m, t)
                    for fb in fbs:
                        depend(t, fb + m)
                    self.transfers_out[(ua, ra, m)].append(t)
                    releasers = [(B[ub][rb] if self.unit_rg[ub] else F[ub][rb]) + m
                                 for ub in consumers]
                    self.received.append((db, t, size, releasers, m))
                    if rg:
                        tb = tg.add_comm(TaskKind.TRANSFER, res_b, fwd_ms, size,
                                         (ua, "B", m, size, db, da))
                        if hosts:
                            self._stream_tasks.append(tb)
                        for bb in bbs:
                            depend(bb + m, tb)
                        depend(tb, ba + m)

    # ---------------------------------------------------------- gradients
    def _gradients(self) -> None:
        plan, tg, cm, groups = self.plan, self.tg, self.cm, self.groups
        index = self.cm.ops_by_id
        buckets_of: dict[int, list[list[str]]] = defaultdict(list)
        bucketed: set[str] = set()
        if plan.fusion is not None:
            for bucket in plan.fusion.gradient_buckets:
                if bucket:
                    buckets_of[self.op_group[bucket[0]]].append(list(bucket))
                    bucketed.update(bucket)
        # per device: the tasks its optimizer update waits for, and the parameter bytes it updates
        self.update_deps: dict[int, list[int]] = defaultdict(list)
        self.update_bytes: dict[int, float] = defaultdict(float)
        self.update_extra_ms: dict[int, float] = defaultdict(float)  # tie exchanges' sums
        self.grad_bytes: dict[int, float] = defaultdict(float)  # gradient buckets per device
        self.static: list[float] = [0.0] * len(self.device_names)
        self.server_updates: list[int] = []
        sf = plan.optimizer.state_factor
        U = len(self.members)
        tied_out = self._tied(sf)  # owner op -> bytes synchronised by a tie's own AllReduce
        for gi, g in enumerate(plan.groups):
            reps = groups.replicas[gi]
            param_ops = [op for op in g.ops if index[op].param_bytes > 0]
            total = float(sum(index[op].param_bytes for op in param_ops))
            devs = [groups.rep_device[r] for r in reps]
            resident = float(sum(index[op].resident_bytes for op in g.ops))
            for d in devs:
                self.grad_bytes[d] += total
                self.static[d] += resident  # held by every replica whatever its batch share
            if g.sync == SyncMethod.PS:
                self._ps(gi, g, param_ops, total)
                continue
            for d in devs:
                self.static[d] += total * (2.0 + sf)
                self.update_bytes[d] += total
            if not param_ops:
                continue
            if g.sync == SyncMethod.NONE or len(devs) == 1:
                for r in reps:
                    self.update_deps[groups.rep_device[r]].extend(
                        self._backward_tasks(param_ops, [r]))
                continue
            names = [self.device_names[d] for d in devs]
            streams = tuple(-1 - d for d in devs)
            plain_ops = [op for op in param_ops if op not in bucketed]
            if g.compression == Compression.SFB:
                plain_ops = self._sfb(gi, g, plain_ops, names, streams, U)
                for bucket in buckets_of.get(gi, []):
                    kept = set(self._sfb(gi, g, bucket, names, streams, U))
                    bucket[:] = [op for op in bucket if op in kept]
            buckets = [b for b in buckets_of.get(gi, []) if b]
            rest = [op for op in plain_ops if op not in bucketed]
            if rest:
                buckets.append(rest)
            for k, bucket in enumerate(buckets):
                nbytes = float(sum(index[op].param_bytes - tied_out.get(op, 0) for op in bucket))
                if nbytes <= 0:
                    continue
                ms = cm.allreduce_ms(names, nbytes, g.collective)
                label = f"{g.id}" + (f" bucket {k}" if len(buckets) > 1 else "")
                links = cm.collective_link_bytes("allreduce", names, nbytes, algorithm=g.collective)
                t = tg.add_comm(TaskKind.ALLREDUCE, self._held(links) + streams, ms, nbytes,
                                (label, f"{len(names)} devices of {g.id}", links))
                self._stream_tasks.append(t)
                for dep in self._backward_tasks(bucket, reps):
                    tg.depend(dep, t)
                for d in devs:
                    self.update_deps[d].append(t)

    def _backward_tasks(self, ops, reps) -> list[int]:
        """Backward tasks of ``ops`` on replicas ``reps`` (of their group), every microbatch."""
        units = sorted({self.unit_of[o] for o in ops})
        w_of = self.w_of
        return [w_of.get(self.B[u][r] + m, self.B[u][r] + m) for u in units if self.unit_rg[u]
                for r in reps for m in range(self.M)]

    def _split_ties(self) -> list[tuple[str, str, float, list[str], list[int], list[int]]]:
        """The tied weights lowered as held beyond their owner's group, computed once:
        ``(parameter, owner op, bytes, sharing ops, holder devices, extra holders)`` for
        every weight an op of another group shares, unless its owner's group synchronises
        by PS or no sharer runs on a device the owner's group does not."""
        if self._ties is not None:
            return self._ties
        groups, group_of = self.groups, self.op_group
        shared: dict[str, list] = {}
        for name, owner, sharer, nbytes in self.cm.ties:
            if group_of[owner] != group_of[sharer]:
                shared.setdefault(name, [owner, nbytes, []])[2].append(sharer)
        self._ties = []
        for name, (owner, nbytes, sharers) in sorted(shared.items()):
            go = group_of[owner]
            own = [groups.rep_device[r] for r in groups.replicas[go]]
            holders = list(dict.fromkeys(
                own + [groups.rep_device[r] for s in sharers for r in groups.replicas[group_of[s]]]))
            extra = [d for d in holders if d not in own]
            if extra and self.plan.groups[go].sync != SyncMethod.PS:
                self._ties.append((name, owner, nbytes, sharers, holders, extra))
        return self._ties

    def _tied(self, sf: float) -> dict[str, float]:
        """Tied weights held beyond their owner's group (``_split_ties``).

        Every device that runs the owner or a sharing op holds the parameter and
        its gradient; they are summed over all of them by one AllReduce (after
        every holder's backward of those ops), and each holder updates its copy.
        Returns owner op -> bytes taken out of its group's own synchronisation.
        """
        tg, cm, groups = self.tg, self.cm, self.groups
        out: dict[str, float] = defaultdict(float)
        for name, owner, nbytes, sharers, holders, extra in self._split_ties():
            for d in extra:
                self.static[d] += nbytes * (2.0 + sf)
                self.update_bytes[d] += nbytes
                self.grad_bytes[d] += nbytes
            out[owner] += nbytes
            owner_reps = groups.replicas[self.op_group[owner]]
            sharer_reps = [groups.replicas[self.op_group[s]] for s in sharers]
            devices_of = [[self.device_names[groups.rep_device[r]] for r in reps]
                          for reps in (owner_reps, *sharer_reps)]
            if self.plan.tie_sync == TieSync.EXCHANGE and cm.exchangeable(
                    owner, devices_of[0], devices_of[1:]):
                # each sends when its group's last backward is done (as the runtime does,
                # after its step's tasks)
                owner_group = self.plan.groups[self.op_group[owner]]
                sharer_group = self.plan.groups[self.op_group[sharers[0]]]
                self._exchange(name, nbytes, cm.tie_rows[owner], holders[0], extra[0],
                               self._backward_tasks(owner_group.ops, owner_reps),
                               self._backward_tasks(sharer_group.ops, sharer_reps[0]))
                continue
            names = [self.device_names[d] for d in holders]
            deps = self._backward_tasks([owner], owner_reps)
            for s, reps in zip(sharers, sharer_reps):
                deps += self._backward_tasks([s], reps)
            ms = cm.allreduce_ms(names, nbytes)
            links = cm.collective_link_bytes("allreduce", names, nbytes)
            t = tg.add_comm(TaskKind.ALLREDUCE, self._held(links) + tuple(-1 - d for d in holders),
                            ms, nbytes, (f"tied {name}", f"{len(names)} devices", links))
            self._stream_tasks.append(t)
            for dep in deps:
                tg.depend(dep, t)
            for d in holders:
                self.update_deps[d].append(t)
        return out

    def _exchange(self, name: str, nbytes: float, rows: float, owner: int, sharer: int,
                  owner_deps: list[int], sharer_deps: list[int]) -> None:
        """A tie summed by exchange (``TieSync.EXCHANGE``): the sharer's dense gradient goes
        to the owner after the sharer's last backward, the owner's non-zero rows go back
        after the owner's; each device adds what it receives before its update."""
        tg, cm = self.tg, self.cm
        for src, dst, size, deps, what in ((sharer, owner, nbytes, sharer_deps, "dense"),
                                           (owner, sharer, rows, owner_deps, "rows")):
            hosts = tuple(-1 - d for d in (src, dst) if tg.host_driven[d])
            ms = (cm.host_transfer_ms if hosts else cm.transfer_ms)(
                self.device_names[src], self.device_names[dst], size)
            t = tg.add_comm(TaskKind.TRANSFER, self._route(src, dst) + hosts, ms, size,
                            (f"tied {name} {what}", "F", 0, size, src, dst))
            if hosts:
                self._stream_tasks.append(t)
            for dep in deps:
                tg.depend(dep, t)
            self.update_deps[dst].append(t)
            self.update_extra_ms[dst] += cm.exchange_add_ms(self.device_names[dst], size)

    def _held(self, link_bytes: dict) -> tuple[int, ...]:
        """Resource ids of the links a collective loads (it holds exactly those)."""
        return tuple(sorted(self._link_id(h) for h, nbytes in link_bytes.items() if nbytes > 0))

    def _ps(self, gi, g, param_ops, total) -> None:
        tg, cm, groups = self.tg, self.cm, self.groups
        optimizer = self.plan.optimizer
        reps = groups.replicas[gi]
        devs = [groups.rep_device[r] for r in reps]
        servers = [self.dev_index[s] for s in g.ps_servers]
        shard = total / len(servers)
        for d in devs:
            self.static[d] += total * 2.0  # parameters and gradients; the state lives on servers
        for s in servers:
            # parameter shard, aggregation buffer, state
            self.static[s] += shard * (2.0 + optimizer.state_factor)
        if not param_ops:
            return
        workers = [self.device_names[d] for d in devs]
        server_names = list(g.ps_servers)
        push_ms, pull_ms = cm.ps_phases_ms(workers, server_names, total)
        streams = tuple(-1 - d for d in sorted(set(devs) | set(servers)))
        where = f"{len(workers)} workers, {len(servers)} servers of {g.id}"
        push_links = cm.collective_link_bytes("ps-push", workers, total, servers=server_names)
        pull_links = cm.collective_link_bytes("ps-pull", workers, total, servers=server_names)
        push = tg.add_comm(TaskKind.PS_PUSH, self._held(push_links) + streams, push_ms,
                           total * len(workers), (g.id, where, push_links))
        pull = tg.add_comm(TaskKind.PS_PULL, self._held(pull_links) + streams, pull_ms,
                           total * len(workers), (g.id, where, pull_links))
        self._stream_tasks.extend((push, pull))
        for dep in self._backward_tasks(param_ops, reps):
            tg.depend(dep, push)
        for s in servers:
            ms = cm.update_ms(shard, self.device_names[s], optimizer)
            t = tg.add_compute(TaskKind.UPDATE, s, ms, -1, (f"{g.id} shard",))
            self.server_updates.append(t)
            tg.depend(push, t)
            tg.depend(t, pull)
        for d in devs:
            self.update_deps[d].append(pull)

    def _sfb(self, gi, g, ops, names, streams, U) -> list[str]:
        """Give each op whose sufficient factors beat its AllReduce an all-gather + recompute.

        The choice compares the factor all-gather plus the slowest replica's
        gradient recomputation with the AllReduce of the op's gradient alone.
        Returns the ops left for AllReduce.
        """
        tg, cm, groups = self.tg, self.cm, self.groups
        elem = ELEMENT_BYTES.get(self.graph.model.dtype, 4)
        reps = groups.replicas[gi]
        kept = []
        for op in ops:
            gather_ms = cm.sfb_op_ms(op, names, elem_bytes=elem)
            if gather_ms is None:
                kept.append(op)
                continue
            recompute = [cm.sfb_recompute_ms(op, self.device_names[groups.rep_device[r]],
                                             groups.rep_share[r]) for r in reps]
            plain_ms = cm.allreduce_ms(names, float(cm.param_bytes[cm.op_index[op]]), g.collective)
            if gather_ms + max(recompute) >= plain_ms:
                kept.append(op)
                continue
            nbytes = cm.sfb_factor_bytes(op)
            links = cm.collective_link_bytes("allgather", names, nbytes / len(names))
            t = tg.add_comm(TaskKind.ALLGATHER, self._held(links) + streams, gather_ms, nbytes,
                            (f"{op} factors", f"{len(names)} devices of {g.id}", links))
            self._stream_tasks.append(t)
            for dep in self._backward_tasks([op], reps):
                tg.depend(dep, t)
            for r, ms in zip(reps, recompute):
                d = groups.rep_device[r]
                rc = tg.add_compute(TaskKind.RECOMPUTE, d, ms, 3 * U - 1, (op,))
                tg.depend(t, rc)
                self.update_deps[d].append(rc)
        return kept

    # -------------------------------------------------------------- order
    def _orders(self) -> None:
        plan, tg, M, groups = self.plan, self.tg, self.M, self.groups
        U = len(self.members)
        n_dev = len(self.device_names)
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
            pipe = plan.pipeline
            stage_group = [self.group_index[s] for s in pipe.stages]
            stage_units: dict[tuple[int, int], list[int]] = {}
            for device in self.device_names:
                d = self.dev_index[device]
                actions = pipe.actions(device)
                if not actions:
                    continue
                chain = chains[d] = []
                for a in actions:
                    gi = stage_group[a.stage]
                    r = rep_of[(gi, d)]
                    units = stage_units.get((gi, d))
                    if units is None:
                        units = stage_units[(gi, d)] = units_on(gi, d)
                    if a.op == "F":
                        chain.extend(self.F[u][r] + a.microbatch for u in units)
                    elif a.op == "W":
                        w_of = self.w_of
                        chain.extend(w_of[b] for u in reversed(units)
                                     if self.unit_rg[u] and (b := self.B[u][r] + a.microbatch) in w_of)
                    else:  # B, or I (whose W comes later)
                        chain.extend(self.B[u][r] + a.microbatch for u in reversed(units)
                                     if self.unit_rg[u])
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
        # optimizer updates: one per device, last in its chain
        self.updates: dict[int, int] = {}
        for d in range(n_dev):
            nbytes = self.update_bytes.get(d, 0.0)
            deps = self.update_deps.get(d)
            if nbytes <= 0 and not deps:
                continue
            name = self.device_names[d]
            # (the buckets are zeroed here; each backward added into them: _compute_tasks)
            ms = (self.cm.update_ms(nbytes, name, plan.optimizer)
                  + self.cm.upkeep_ms(self.grad_bytes.get(d, 0.0), name, 0)
                  + self.update_extra_ms.get(d, 0.0))
            t = tg.add_compute(TaskKind.UPDATE, d, ms, 3 * U * M, ("",))
            self.updates[d] = t
            for dep in deps or ():
                tg.depend(dep, t)
            if d in chains:
                chains[d].append(t)
        priority, succ, ndeps = tg.priority, tg.succ, tg.ndeps
        for chain in chains.values():
            for k, t in enumerate(chain):
                priority[t] = k
            for a, b in zip(chain, chain[1:]):
                succ[a].append(b)
                ndeps[b] += 1
        self.chains = chains

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
