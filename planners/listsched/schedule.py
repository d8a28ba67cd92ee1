"""A list schedule of one training step, and the plan parts (groups, order) made from it."""

from __future__ import annotations

from dataclasses import dataclass

from dl_nfv.artifacts import Group, SyncMethod

from .stepgraph import Split, StepGraph


@dataclass(slots=True)
class OpSchedule:
    """Devices, start and finish times of every task of one step, and what bound each start.

    ``device[u]`` is the device index of unit ``u``; tasks ``0..U-1`` are the
    forwards and ``U..2U-1`` the backwards of the units. A device runs its
    forwards in start order, then its backwards in the reverse of that order,
    then its optimizer update - the way the simulator runs a plan's ``order``.
    ``makespan_ms`` is the scheduler's own estimate (links booked in
    scheduling order, not simulated): finished candidates are compared by the
    simulator, not by this number.
    """

    sg: StepGraph
    algorithm: str
    device: list[int]
    start: list[float]
    finish: list[float]
    makespan_ms: float = 0.0

    def order(self) -> dict[str, tuple[str, ...]]:
        """Each device's op order, by earliest start.

        A split op is ordered everywhere by its earliest replica, so that all
        devices' orders follow one global order of ops that respects the data
        edges (no device order can then contradict another's through a split
        op).
        """
        sg = self.sg
        key: dict[int, tuple[float, float, int]] = {}
        for i, units in enumerate(sg.units_of_op):
            key[i] = (min(self.start[u] for u in units), min(self.finish[u] for u in units),
                      units[0])
        out: dict[str, tuple[str, ...]] = {}
        for j, name in enumerate(sg.devices):
            ops = sorted({sg.unit_op[u] for u in range(sg.U) if self.device[u] == j},
                         key=key.__getitem__)
            if ops:
                out[name] = tuple(sg.op_ids[i] for i in ops)
        return out


def new_schedule(sg: StepGraph, algorithm: str) -> OpSchedule:
    n = 2 * sg.U
    return OpSchedule(sg, algorithm, [-1] * sg.U, [0.0] * n, [0.0] * n)


def plan_groups(sched: OpSchedule, *, merge_splits: bool = False
                ) -> tuple[list[Group], dict[str, tuple[str, ...]], list[str]]:
    """Groups, per-device order and notes of a schedule.

    Unsplit ops share one group per device (``sync: none``). Every split op is
    a group of that one op over its devices with its batch shares, AllReduce
    of its gradients when it has parameters, and a ``note`` saying how it was
    split; with ``merge_splits`` the ops split the same way share one group
    (one gradient synchronisation for all of them, as in data parallelism).
    """
    sg = sched.sg
    per_device: dict[int, list[str]] = {}
    by_split: dict[Split, list[str]] = {}
    for i, units in enumerate(sg.units_of_op):
        op_id = sg.op_ids[i]
        if op_id in sg.splits:
            by_split.setdefault(sg.splits[op_id], []).append(op_id)
        else:
            per_device.setdefault(sched.device[units[0]], []).append(op_id)
    groups = [Group(id=f"on:{sg.devices[j]}", ops=tuple(ops), devices=(sg.devices[j],),
                    sync=SyncMethod.NONE)
              for j, ops in sorted(per_device.items())]
    notes: list[str] = []
    for n, (split, ops) in enumerate(by_split.items()):
        k = len(split.devices)
        shares = ", ".join(f"{d}={s:.3g}" for d, s in zip(split.devices, split.shares))
        members = [ops] if merge_splits else [[op] for op in ops]
        for member in members:
            has_params = any(sg.param_bytes[sg.units_of_op[sg.cm.op_index[o]][0]] > 0 for o in member)
            if merge_splits:
                note = f"{len(member)} ops replicated {k}-way (data parallel); shares {shares}"
            else:
                note = f"op {member[0]!r} split {k}-way on the batch dimension; shares {shares}"
            groups.append(Group(
                id=f"replicated{n}" if merge_splits else f"split:{member[0]}", ops=tuple(member),
                devices=split.devices, batch_shares=split.shares,
                sync=SyncMethod.ALLREDUCE if has_params else SyncMethod.NONE, note=note))
            notes.append(note)
    return groups, sched.order(), notes
