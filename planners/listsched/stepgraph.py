"""The training step as list schedulers see it: units, tasks, their costs on every device.

A *unit* is one op on one device: an op that is not split is one unit; an op
split k ways over the batch is k units, each pinned to its device and holding
the batch interval ``[lo, hi)``. Data moves between two units in proportion to
the overlap of their batch intervals. Every unit has a forward task and, when
it or an op it depends on has parameters, a backward task.

Costs come from the shared ``CostModel`` only: op times per device type
(scaled by batch share, launch overhead unscaled) and the affine transfer
coefficients of every ordered device pair (``CostModel.transfer_affine``).
Colocation groups of the op graph (``OpGraph.colocation``) are carried per
unit: the schedulers put the unpinned units of one group on one device.

Building a ``StepGraph`` is O(ops x devices + edges).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dl_nfv.artifacts import Optimizer
from dl_nfv.planners.colocation import group_of
from dl_nfv.simulator.costs import CostModel, scale_table

GIB = 2**30


class MemoryShortfall(Exception):
    """No allowed device has room for a unit; names the op and how much is missing."""

    def __init__(self, op_id: str, need_bytes: float, device: str, free_bytes: float,
                 capacity_bytes: float):
        self.op_id = op_id
        self.need_bytes = need_bytes
        self.device = device
        self.free_bytes = free_bytes
        self.capacity_bytes = capacity_bytes
        super().__init__(self.describe())

    @property
    def shortfall_bytes(self) -> float:
        return self.need_bytes - self.free_bytes

    def describe(self) -> str:
        return (f"op {self.op_id!r} needs {self.need_bytes / GIB:.3f} GiB (parameters, gradients, "
                f"optimizer state and activations) but fits on no device: the most room is "
                f"{self.free_bytes / GIB:.3f} GiB left of {self.capacity_bytes / GIB:.2f} GiB on "
                f"{self.device!r} (short by {self.shortfall_bytes / GIB:.3f} GiB)")


@dataclass(frozen=True, slots=True)
class Split:
    """An op split over the batch: ``devices[i]`` computes ``shares[i]`` of it."""

    devices: tuple[str, ...]
    shares: tuple[float, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitLayout:
    """The units of a step graph: which op each is, its batch interval and its pinned device
    (-1: free), and the units of every op (in the cost model's op order)."""

    unit_op: list[int]
    lo: list[float]
    hi: list[float]
    pin: list[int]
    units_of_op: list[list[int]]


def unit_layout(cm: CostModel, devices: Sequence[str], splits: Mapping[str, Split],
                topo_ops: Sequence[int]) -> UnitLayout:
    """One unit per unsplit op, one per replica of a split op, in topological order."""
    dev_index = {d: j for j, d in enumerate(devices)}
    layout = UnitLayout(unit_op=[], lo=[], hi=[], pin=[],
                        units_of_op=[[] for _ in range(len(cm.op_ids))])
    for i in topo_ops:
        split = splits.get(cm.op_ids[i])
        parts = ([(dev_index[d], s) for d, s in zip(split.devices, split.shares)]
                 if split else [(-1, 1.0)])
        acc = 0.0
        for k, (j, share) in enumerate(parts):
            layout.units_of_op[i].append(len(layout.unit_op))
            layout.unit_op.append(i)
            layout.lo.append(acc)
            acc = 1.0 if k == len(parts) - 1 else acc + share
            layout.hi.append(acc)
            layout.pin.append(j)
    return layout


class StepGraph:
    """The units and tasks of one training step, with their costs on every device.

    Parameters
    ----------
    cm : CostModel
        The shared cost model of the graph and cluster.
    devices : sequence of str
        The devices a schedule may use (names, in this order).
    splits : mapping of op id to Split, optional
        Ops split over the batch, each replica pinned to its device.
    optimizer : Optimizer
        The optimizer whose step and state the schedule counts.
    """

    def __init__(self, cm: CostModel, devices: Sequence[str], *,
                 splits: Mapping[str, Split] | None = None, optimizer: Optimizer = Optimizer.SGD,
                 topological_ids: Sequence[str] | None = None):
        self.cm = cm
        self.devices = list(devices)
        self.splits = dict(splits or {})
        self.optimizer = optimizer
        self.D = len(self.devices)
        self.op_ids = cm.op_ids
        topo_ops = [cm.op_index[o] for o in (topological_ids or cm.graph.topological_ids())]
        layout = unit_layout(cm, self.devices, self.splits, topo_ops)
        self.units_of_op = layout.units_of_op
        self.U = len(layout.unit_op)
        self.unit_op, self.lo, self.hi, self.pin = layout.unit_op, layout.lo, layout.hi, layout.pin
        self.share = [h - l_ for l_, h in zip(self.lo, self.hi)]
        self._costs(topo_ops)
        self._memory()
        self._edges()
        self._transfers()
        self._colocation()

    # ------------------------------------------------------------- building
    def _costs(self, topo_ops: Sequence[int]) -> None:
        """Forward and backward times of every unit on every device ([U][D])."""
        cm = self.cm
        cols = [cm.device_type_index[d] for d in self.devices]
        cells = np.ix_(np.asarray(self.unit_op), cols)
        share = np.asarray(self.share)[:, None]
        # a unit's time at its share, and the part of it that does not shrink with the batch
        fwd_fixed, bwd_fixed = cm.fwd_fixed_by_type[cells], cm.bwd_fixed_by_type[cells]
        self.fwd_fixed, self.bwd_fixed = fwd_fixed.tolist(), bwd_fixed.tolist()
        self.fwd = scale_table(cm.fwd_ms_by_type[cells], fwd_fixed, share).tolist()
        bwd = scale_table(cm.bwd_ms_by_type[cells], bwd_fixed, share).tolist()
        # an op has a backward when it or an op it depends on has parameters (as simulated)
        needs = [False] * len(self.op_ids)
        preds_of: list[list[int]] = [[] for _ in range(len(self.op_ids))]
        for e in cm.graph.edges:
            preds_of[cm.op_index[e.dst]].append(cm.op_index[e.src])
        for i in topo_ops:
            needs[i] = cm.param_bytes[i] > 0 or any(needs[p] for p in preds_of[i])
        self.rg = [needs[i] for i in self.unit_op]
        bwd = [row if g else [0.0] * self.D for row, g in zip(bwd, self.rg)]
        params = cm.param_bytes[np.asarray(self.unit_op)]
        # a backward also adds the op's weight gradients into their buckets
        add = [cm.accumulate_ms_per_byte(d) for d in self.devices]
        self.bwd = [[ms + float(g) * a for ms, a in zip(row, add)] if g > 0 else row
                    for row, g in zip(bwd, params)]
        self.param_bytes = params.tolist()

    def _memory(self) -> None:
        """Static bytes (parameters, gradients, optimizer state, resident memory) and stashed
        activation bytes of every unit, and the tied weights by op index."""
        cm = self.cm
        units = np.asarray(self.unit_op)
        params = cm.param_bytes[units]
        # tied weights: (owner op index, sharing op index, bytes), from the cost model's
        self.ties = [(cm.op_index[owner], cm.op_index[sharer], nbytes)
                     for _, owner, sharer, nbytes in cm.ties]
        self.static_bytes = (params * (2.0 + self.optimizer.state_factor)
                             + cm.resident_bytes[units]).tolist()
        self.act_bytes = (cm.output_bytes[units] * np.asarray(self.share)).tolist()

    def _edges(self) -> None:
        """Unit edges: data moves between replicas in proportion to their batch overlap."""
        cm, lo, hi = self.cm, self.lo, self.hi
        self.succ: list[list[tuple[int, float]]] = [[] for _ in range(self.U)]
        self.pred: list[list[tuple[int, float]]] = [[] for _ in range(self.U)]
        for e in cm.graph.edges:
            src, dst = self.units_of_op[cm.op_index[e.src]], self.units_of_op[cm.op_index[e.dst]]
            split = self.splits.get(e.src)
            if split is not None and split == self.splits.get(e.dst):
                pairs = zip(src, dst)  # split alike: replica i feeds replica i only
            else:
                pairs = ((a, b) for a in src for b in dst)
            for a, b in pairs:
                overlap = min(hi[a], hi[b]) - max(lo[a], lo[b])
                if overlap <= 1e-12:
                    continue
                nbytes = e.bytes * overlap
                self.succ[a].append((b, nbytes))
                self.pred[b].append((a, nbytes))

    def _transfers(self) -> None:
        """The affine transfer model per ordered device pair, read from the cost model, and
        the directed links each route holds while it carries a transfer."""
        D, cm = self.D, self.cm
        self.lat = [[0.0] * D for _ in range(D)]
        self.per_byte = [[0.0] * D for _ in range(D)]
        self.route_links: list[list[tuple[int, ...]]] = [[() for _ in range(D)] for _ in range(D)]
        link_ids: dict[tuple[str, str], int] = {}
        for a, da in enumerate(self.devices):
            for b, db in enumerate(self.devices):
                if a != b:
                    self.lat[a][b], self.per_byte[a][b] = cm.transfer_affine(da, db)
                    self.route_links[a][b] = tuple(link_ids.setdefault(hop, len(link_ids))
                                                   for hop in cm.cluster.route(da, db).hops)
        self.n_links = len(link_ids)

    def _colocation(self) -> None:
        """``group[u]``: the colocation group of unit ``u``'s op, -1 for none or for a pinned
        unit (a replica of a split op, whose device is fixed); ``group_bytes[g]``: the
        memory the group's free units need on their one device."""
        owner = group_of(self.cm.graph)
        self.group = [owner.get(self.op_ids[i], -1) if self.pin[u] < 0 else -1
                      for u, i in enumerate(self.unit_op)]
        self.group_bytes: dict[int, float] = {}
        for u, g in enumerate(self.group):
            if g >= 0:
                self.group_bytes[g] = (self.group_bytes.get(g, 0.0) + self.static_bytes[u]
                                       + self.act_bytes[u])

    # ------------------------------------------------------------ helpers
    def comm_ms(self, a: int, b: int, nbytes: float) -> float:
        if a == b or nbytes <= 0:
            return 0.0
        return self.lat[a][b] + nbytes * self.per_byte[a][b]

    def task_succs(self, t: int) -> list[tuple[int, float]]:
        """Successor tasks of task ``t`` with the bytes each receives from it."""
        U = self.U
        if t < U:
            return [*self.succ[t], *([(U + t, 0.0)] if self.rg[t] else [])]
        return [(U + a, b) for a, b in self.pred[t - U] if self.rg[a]]

    def mean_costs(self, allowed: Sequence[int]) -> tuple[list[float], float, float]:
        """Mean compute time of every task over ``allowed`` devices (pinned units: their own
        device), and the mean latency and ms per byte over ordered pairs of allowed devices."""
        cols = list(allowed)
        fwd = np.asarray(self.fwd)[:, cols].mean(axis=1)
        bwd = np.asarray(self.bwd)[:, cols].mean(axis=1)
        w = [*fwd.tolist(), *bwd.tolist()]
        for u, j in enumerate(self.pin):
            if j >= 0:
                w[u], w[self.U + u] = self.fwd[u][j], self.bwd[u][j]
        pairs = [(a, b) for a in cols for b in cols if a != b]
        if not pairs:
            return w, 0.0, 0.0
        lat = sum(self.lat[a][b] for a, b in pairs) / len(pairs)
        per_byte = sum(self.per_byte[a][b] for a, b in pairs) / len(pairs)
        return w, lat, per_byte
