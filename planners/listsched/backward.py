"""The rest of a list-scheduled training step once its forwards are placed: backwards,
gradient AllReduces of split ops and shared (tied) weights, and optimizer updates.

Each device runs its backwards after its last forward, in the reverse of its
op order (``OpSchedule.order``: what the simulator does with it); a backward also
waits for the gradients of its consumers. Ops with no parameters at or above
them have no backward. A split op with parameters AllReduces its gradient over
its devices after its last backward, or, when it is in a gradient bucket (op
indices of ops split alike, synchronised together), its bucket does after the
bucket's last backward (one collective at a time per device); each device then
updates all the parameters it holds. Times come from the shared cost model.

Complexity: O(U log U + E) plus one AllReduce cost per split op or bucket.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .resources import Links
from .schedule import OpSchedule


@dataclass(slots=True)
class DeviceClock:
    """Per device: when its compute is next free (``free``), when its collectives are
    (``stream``), when all its gradients are in (``done``), and the parameter bytes it
    updates (``params``)."""

    free: list[float]
    stream: list[float]
    done: list[float]
    params: list[float]


def backward_pass(sched: OpSchedule, links: Links | None = None,
                  buckets: Sequence[Sequence[int]] = ()) -> None:
    """Time the backwards, gradient AllReduces and optimizer updates of a placed forward pass
    (see the module docstring). Sets the backward tasks' times and ``makespan_ms``."""
    sg = sched.sg
    links = links or Links(sg.n_links)
    keyed = _plan_order(sched)
    clock = DeviceClock(free=[0.0] * sg.D, stream=[0.0] * sg.D, done=[], params=[0.0] * sg.D)
    for u in keyed:
        clock.free[sched.device[u]] = max(clock.free[sched.device[u]], sched.finish[u])
    _backwards(sched, links, keyed, clock.free, _untied_ms(sched))
    clock.done = list(clock.free)
    _split_syncs(sched, buckets, clock)
    for u in range(sg.U):
        clock.params[sched.device[u]] += sg.param_bytes[u]
    _tie_syncs(sched, clock)
    sched.makespan_ms = _updates(sched, clock)


def _plan_order(sched: OpSchedule) -> list[int]:
    """The units in the plan's op order (by the earliest start of each op's replicas)."""
    sg, start, finish = sched.sg, sched.start, sched.finish
    op_key = {i: (min(start[u] for u in units), min(finish[u] for u in units), units[0])
              for i, units in enumerate(sg.units_of_op)}
    return sorted(range(sg.U), key=lambda u: op_key[sg.unit_op[u]])


def _untied_ms(sched: OpSchedule) -> list[float]:
    """Per unit, the backward time its op no longer spends: the owner of a tied weight
    whose sharer runs on another device no longer sums the two gradients in its backward
    (the AllReduce does), as the simulator lowers it."""
    sg, device = sched.sg, sched.device
    untie = [0.0] * sg.U
    for owner, sharer, _ in sg.ties:
        own = {device[u] for u in sg.units_of_op[owner]}
        if {device[u] for u in sg.units_of_op[sharer]} - own:
            for u in sg.units_of_op[owner]:
                untie[u] = max(untie[u], sg.cm.tie_sum_ms(sg.op_ids[owner], sg.devices[device[u]]))
    return untie


def _backwards(sched: OpSchedule, links: Links, keyed: list[int], free: list[float],
               untie: list[float]) -> None:
    """Each backward in reverse plan order, after its consumers' gradients arrive."""
    sg, device, start, finish = sched.sg, sched.device, sched.start, sched.finish
    U = sg.U
    for u in reversed(keyed):
        if not sg.rg[u]:
            continue
        d = device[u]
        ready = finish[u]
        remote: dict[int, list[float]] = {}  # consumer device -> [gradients ready, bytes]
        for s, nbytes in sg.succ[u]:
            src = device[s]
            if src == d or nbytes <= 0:
                ready = max(ready, finish[U + s])
                continue
            entry = remote.setdefault(src, [0.0, 0.0])
            entry[0] = max(entry[0], finish[U + s])
            entry[1] = max(entry[1], nbytes)
        for src, (at, nbytes) in sorted(remote.items(), key=lambda kv: kv[1][0]):
            ready = max(ready, links.send(sg, src, d, at, nbytes))
        t = U + u
        begin = max(ready, free[d])
        start[t], finish[t] = begin, begin + max(0.0, sg.bwd[u][d] - untie[u])
        free[d] = finish[t]


def _split_syncs(sched: OpSchedule, buckets: Sequence[Sequence[int]], clock: DeviceClock) -> None:
    """The gradient AllReduces of split ops with parameters and of ``buckets``, each when
    its last backward ends, one at a time per device."""
    sg, device, finish = sched.sg, sched.device, sched.finish
    U = sg.U
    bucketed = {i for bucket in buckets for i in bucket}
    syncs = [[i] for i, units in enumerate(sg.units_of_op)
             if len(units) > 1 and sg.param_bytes[units[0]] > 0 and i not in bucketed]
    syncs += [list(bucket) for bucket in buckets if bucket]
    timed = sorted((max(finish[U + u] for i in ops for u in sg.units_of_op[i]), k)
                   for k, ops in enumerate(syncs))
    for ready, k in timed:
        units = sg.units_of_op[syncs[k][0]]
        nbytes = sum(sg.param_bytes[sg.units_of_op[i][0]] for i in syncs[k])
        devs = [device[u] for u in units]
        begin = max([ready, *(clock.stream[d] for d in devs)])
        end = begin + sg.cm.allreduce_ms([sg.devices[d] for d in devs], nbytes)
        for d in devs:
            clock.stream[d] = end
            clock.done[d] = max(clock.done[d], end)


def _tie_syncs(sched: OpSchedule, clock: DeviceClock) -> None:
    """Tied weights used on another device than their owner's: a copy there, summed by an
    AllReduce after both backwards (as the simulator and the runtime do)."""
    sg, device, finish = sched.sg, sched.device, sched.finish
    U = sg.U
    for owner, sharer, nbytes in sg.ties:
        units = (*sg.units_of_op[owner], *sg.units_of_op[sharer])
        held = {device[u] for u in units}
        if len(held) < 2:
            continue
        owners = {device[u] for u in sg.units_of_op[owner]}
        begin = max([max(finish[U + u] for u in units), *(clock.stream[d] for d in held)])
        end = begin + sg.cm.allreduce_ms([sg.devices[d] for d in sorted(held)], nbytes)
        for d in held:
            clock.stream[d] = end
            clock.done[d] = max(clock.done[d], end)
            if d not in owners:
                clock.params[d] += nbytes


def _updates(sched: OpSchedule, clock: DeviceClock) -> float:
    """Each device's optimizer update (and gradient zeroing) after its gradients are in;
    returns when the last one ends."""
    sg, cm = sched.sg, sched.sg.cm
    makespan = 0.0
    for d in range(sg.D):
        end = clock.done[d]
        if clock.params[d] > 0:
            end += (cm.update_ms(clock.params[d], sg.devices[d], sg.optimizer)
                    + cm.upkeep_ms(clock.params[d], sg.devices[d], 0))  # zeroing; adding: in bwd
        makespan = max(makespan, end)
    return makespan
