"""Lowering of what moves between devices: activations between groups and gradients.

The communication half of ``lower.py``'s ``_Lowering`` (a mixin on it: the state it
reads, the task graph ``tg``, the replicas ``groups``, the unit tables ``F``/``B``, is
built there). What it lowers (docs/simulator.md has the full list and the reasons):

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
  A tied weight shared beyond its owner's group is summed over every holder (one
  AllReduce, or an exchange with ``tie_sync: exchange``). Then one optimizer
  update per device (PS groups update on the servers).
* **Replicas.** ``_Groups`` lays out each group's replicas on their batch
  intervals; the pairs whose intervals overlap are the pairs that exchange data.
* **Resources.** A transfer or collective holds the links of its route (ids
  given as routes are met); a host-driven participant of a collective (a CPU
  device), and a host-driven sender of a point-to-point transfer (``_p2p``), also
  holds that device's collective stream, recorded as ``-1 - device`` until
  ``build`` maps it.
"""

from __future__ import annotations

from collections import defaultdict

from dl_nfv.artifacts import Compression, Plan, SyncMethod, TieSync

from .tasks import TaskKind

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


class _Communication:
    """Transfers, gradient synchronisation and the link resources they hold."""

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
            # (a unit of several ops can need a gradient where the unit it feeds does not)
            rg = self.unit_rg[ua] and self.unit_rg[ub]
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
                fwd_ms, res_f, recv_f = self._p2p(da, db, size)
                if rg:
                    bwd_ms, res_b, recv_b = self._p2p(db, da, size)
                for m in range(M):
                    t = tg.add_comm(TaskKind.TRANSFER, res_f, fwd_ms, size, (ua, "F", m, size, da, db))
                    if tg.host_driven[da]:  # it holds the sender's stream (``_p2p``)
                        self._stream_tasks.append(t)
                    depend(fa + m, t)
                    for fb in fbs:
                        depend(t, fb + m)
                    tg.duration_ms[fbs[0] + m] += recv_f
                    self.transfers_out[(ua, ra, m)].append(t)
                    releasers = [(B[ub][rb] if self.unit_rg[ub] else F[ub][rb]) + m
                                 for ub in consumers]
                    self.received.append((db, t, size, releasers, m))
                    if rg:
                        tb = tg.add_comm(TaskKind.TRANSFER, res_b, bwd_ms, size,
                                         (ua, "B", m, size, db, da))
                        if tg.host_driven[db]:
                            self._stream_tasks.append(tb)
                        for bb in bbs:
                            depend(bb + m, tb)
                        depend(tb, ba + m)
                        tg.duration_ms[ba + m] += recv_b

    def _p2p(self, src: int, dst: int, nbytes: float) -> tuple[float, tuple[int, ...], float]:
        """One point-to-point message of ``nbytes`` from ``src`` to ``dst``: the transfer's
        ms, the resources it holds, and the CPU ms its receiver spends on it.

        The runtime posts every receive ahead and sends without blocking, so no end waits
        for the other's compute: a CPU sender writes the message on its own core (the
        transfer holds that core for the link time, and no less than the sender's
        ``message_cpu_ms``), and a CPU receiver's collective-library thread reads it on
        the receiver's core, charged to the task that consumes it (``message_cpu_ms``
        again). Elsewhere the transfer holds its route alone."""
        tg, cm = self.tg, self.cm
        a, b = self.device_names[src], self.device_names[dst]
        ms = cm.transfer_ms(a, b, nbytes)
        held = self._route(src, dst)
        if tg.host_driven[src]:
            ms = max(ms, cm.message_cpu_ms(a, nbytes))
            held += (-1 - src,)
        return ms, held, cm.message_cpu_ms(b, nbytes) if tg.host_driven[dst] else 0.0

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

    # ------------------------------------------------------------ updates
    def _updates(self, chains: dict[int, list[int]]) -> None:
        """One optimizer update per device that updates parameters or waits for a
        gradient, after what ``_gradients`` gathered for it; last in the device's chain
        where it has one."""
        plan, tg, M, U = self.plan, self.tg, self.M, len(self.members)
        n_dev = len(self.device_names)
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
