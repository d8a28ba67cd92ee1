"""The pipeline planning problem as arrays over one topological order of the ops.

A stage is a contiguous range ``[a, b)`` of positions in ``Problem.order`` (a
topological order of the op graph), so every partition into ranges respects
the DAG: data only flows from a stage to a later one. Everything a planner
asks about a range is O(1) from prefix sums:

* compute: per device type, the forward and backward time of the range split
  into a part that does not shrink with the batch (the cost model's fixed part) and a part
  that does (``fixed + scalable x fraction``, exactly ``CostModel.ops_ms``), and the part
  of the backward that computes input gradients;
* parameters and stashed activation bytes of the range;
* ``cut_bytes[i]``: the bytes that cross the boundary before position ``i``,
  counted as the simulator sends them (one tensor per producing op and
  consuming stage, the largest edge);
* ``ties``: tied weights (an op using a parameter another op owns) as
  ``(parameter, owner position, sharing position, bytes)``.

Ops that need no gradient get no backward time: the cost model's ``needs_grad``,
the rule the simulator lowers by.

Positions count *units*, runs of consecutive ops of the order between two
``bounds``. A cut is only ever allowed where it keeps every colocation group
(``OpGraph.colocation``) on one side (``allowed``), so without groups every op is a
unit. Graphs with more allowed cuts than ``max_units`` are coarsened: at most
``max_units`` units of about equal work, each boundary moved to the allowed cut
carrying the fewest bytes nearby. ``with_bounds`` gives the same problem on other
units (any allowed cuts) from the op-level tables kept in it, which the search uses
to make the units finer around the cuts its best layouts chose (``search.finer_units``).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Sequence
from functools import cached_property, partial

import numpy as np

from dl_nfv.artifacts import OpGraph, Optimizer, TieSync, Topology, fingerprint
from dl_nfv.planners.colocation import allowed_cuts
from dl_nfv.planners.runnable import min_slice_rows
from dl_nfv.simulator.costs import CostModel

from .symmetry import collective_key

MAX_UNITS = 96


class Problem:
    """Prefix-sum tables of one op graph on one cluster.

    Parameters
    ----------
    graph, topology
        The artifacts to plan for.
    cost_model : CostModel, optional
        Shared with the simulator calls of the same planner run.
    optimizer : Optimizer
        Decides the optimizer-state bytes per parameter byte.
    tie_sync : TieSync
        How the plans made on it sum tied weights split across stages (the pipeline
        planner exchanges them where it can; the baselines AllReduce them).
    order : sequence of op ids, optional
        The topological order positions count (default: ``graph.topological_ids()``); a
        planner whose stages are not ranges of the default order passes one in which they are.

    Construction is O(ops x device types + edges x ops).
    """

    def __init__(self, graph: OpGraph, topology: Topology, cost_model: CostModel | None = None,
                 optimizer: Optimizer = Optimizer.SGD, max_units: int = MAX_UNITS,
                 tie_sync: TieSync = TieSync.ALLREDUCE, order: Sequence[str] | None = None):
        self.graph = graph
        self.tie_sync = tie_sync
        self.topology = topology
        self.cm = cm = cost_model or CostModel(graph, topology)
        self.default_cost_model = cost_model is None  # the graph and topology decide it
        if self.labels is not None and cm.group_class is None:
            # AllReduce costs built once per class of device sets (exact: ``symmetry``)
            cm.group_class = partial(collective_key, cm, self.labels)
        self.optimizer = optimizer
        self.state_factor = optimizer.state_factor
        self.order: list[str] = list(order) if order is not None else graph.topological_ids()
        self.pos = {op: i for i, op in enumerate(self.order)}
        self.n = len(self.order)
        self.batch_size = graph.model.batch_size
        self.devices: tuple[str, ...] = cm.cluster.device_names
        idx = np.array([cm.op_index[o] for o in self.order], dtype=np.int64)
        fwd = cm.fwd_ms_by_type[idx]
        self.needs_grad = cm.needs_grad  # op -> its backward runs: the simulator's rule
        needs = cm.bwd_runs[idx]
        bwd = cm.bwd_ms_by_type[idx] * needs[:, None]
        self.fwd_ms = fwd  # [ops, types], in this order
        self.bwd_ms = bwd
        # batch-independent parts (the cost model's), so t(f) = fixed + (t - fixed) f
        self.fwd_fixed_ms = cm.fwd_fixed_by_type[idx]
        self.bwd_fixed_ms = cm.bwd_fixed_by_type[idx] * needs[:, None]
        # of that, a tied weight's owner's summing of the weight's gradients
        self.tie_sum_ms = cm.tie_sum_by_type[idx] * needs[:, None]

        def split(t, fixed):
            return _prefix(fixed.T), _prefix((t - fixed).T)

        self.f_fixed, self.f_scal = split(fwd, self.fwd_fixed_ms)  # [types, n+1]
        self.b_fixed, self.b_scal = split(bwd, self.bwd_fixed_ms)
        # of the backward, the part that computes input gradients (a split backward's I)
        share = cm.bwd_input_share[idx][:, None]
        self.bi_fixed, self.bi_scal = split(bwd * share, self.bwd_fixed_ms * share)
        # ops whose backward defers nothing (no weight gradients, or the split not
        # profiled): their adding into buckets stays in the I too, as in the simulator
        whole = share[:, 0] >= 1.0
        self.whole_op = {op: bool(w) for op, w in zip(self.order, whole)}
        self.whole_param_prefix = _prefix((cm.param_bytes[idx] * whole)[None, :])[0]
        self.param_prefix = _prefix(cm.param_bytes[idx][None, :])[0]
        self.out_prefix = _prefix(cm.output_bytes[idx][None, :])[0]
        self.resident_prefix = _prefix(cm.resident_bytes[idx][None, :])[0]
        self.cut_bytes = self._cuts()
        # the op-level prefix sums, which ``with_bounds`` slices again
        self._fine = {name: getattr(self, name) for name in _PREFIXED}
        # cuts that keep every colocation group in one stage (all of them, without groups)
        self.allowed = np.flatnonzero(allowed_cuts(graph, self.order))
        self.bounds = self.allowed
        if len(self.allowed) - 1 > max_units:
            self.bounds = self._coarsen(max_units)
        self._slice(self.bounds)
        self.tie_owner = {name: owner for name, owner, _, _ in cm.ties}  # parameter -> op
        self.type_of = np.array([cm.device_type_index[d] for d in self.devices], dtype=np.int64)
        self.memory_bytes = np.array([cm.memory_bytes(d) for d in self.devices], dtype=np.float64)
        self.device_index = {d: i for i, d in enumerate(self.devices)}
        self.cache: dict = {}  # memoised per-range results of the planner's helpers

    # ----------------------------------------------------------------- set-up
    def _cuts(self) -> np.ndarray:
        """Bytes crossing each boundary (one tensor per producing op: its largest edge)."""
        n, pos = self.n, self.pos
        out: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for e in self.graph.edges:
            out[pos[e.src]].append((pos[e.dst], e.bytes))
        cut = np.zeros(n + 1)
        for u, dsts in out.items():
            # boundary i (u < i <= v) carries the largest edge from u to a position >= i
            dsts.sort()
            suffix_max = 0
            best = {}
            for v, nbytes in reversed(dsts):
                suffix_max = max(suffix_max, nbytes)
                best[v] = suffix_max
            lo = u + 1
            for v, _ in dsts:
                if v >= lo:
                    cut[lo:v + 1] += best[v]
                    lo = v + 1
        return cut

    def _coarsen(self, units: int) -> np.ndarray:
        """Unit boundaries among the ``allowed`` cuts: equal-work targets, each moved to the
        cut carrying the fewest bytes within reach."""
        allowed = self.allowed
        per_op = (self.fwd_ms + self.bwd_ms).max(axis=1)
        work = np.cumsum(np.concatenate([[0.0], per_op]))[allowed]
        total, last = work[-1], len(allowed) - 1
        window = max(1, last // (4 * units))
        picks = [0]
        for k in range(1, units):
            target = int(np.searchsorted(work, total * k / units)) if total > 0 else round(k * last / units)
            lo, hi = max(picks[-1] + 1, target - window), min(last - 1, target + window)
            if lo > hi:
                continue
            picks.append(min(range(lo, hi + 1),
                             key=lambda i: (self.cut_bytes[allowed[i]], abs(i - target), i)))
        picks.append(last)
        return allowed[sorted(set(picks))]

    def _slice(self, bounds: np.ndarray) -> None:
        """Make units of the op positions between consecutive ``bounds``."""
        cols = np.asarray(bounds, dtype=np.int64)
        self.bounds = cols
        for name in _PREFIXED:
            fine = self._fine[name]
            setattr(self, name, fine[:, cols] if fine.ndim == 2 else fine[cols])
        self.n = len(cols) - 1
        # tied weights as (owner unit, sharing unit, bytes), from the cost model's list
        unit = np.searchsorted(cols, np.arange(len(self.order)), side="right") - 1
        self.ties: list[tuple[str, int, int, float]] = [
            (name, int(unit[self.pos[owner]]), int(unit[self.pos[sharer]]), nbytes)
            for name, owner, sharer, nbytes in self.cm.ties]
        self.cache = {}

    @cached_property
    def edge_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The graph's edges as (source position, destination position, bytes) arrays."""
        edges = self.graph.edges
        return (np.array([self.pos[e.src] for e in edges], dtype=np.int64),
                np.array([self.pos[e.dst] for e in edges], dtype=np.int64),
                np.array([float(e.bytes) for e in edges]))

    @cached_property
    def fingerprints(self) -> tuple[str, str]:
        """The sha256 of the graph and of the topology (a plan records them)."""
        return fingerprint(self.graph), fingerprint(self.topology)

    @cached_property
    def labels(self) -> dict[str, tuple[str, str]] | None:
        """``device -> (leaf, host)`` on a uniform cluster, else None (``symmetry``)."""
        from .symmetry import uniform_labels

        return uniform_labels(self.topology)

    @cached_property
    def min_rows(self) -> int:
        """The fewest rows a replica's slice of a microbatch may hold (``min_slice_rows``)."""
        return min_slice_rows(self.graph)

    @property
    def coarsened(self) -> bool:
        """Whether some unit holds ops that a cut could separate."""
        return len(self.bounds) < len(self.allowed)

    def with_bounds(self, bounds: Sequence[int]) -> Problem:
        """A copy whose units are the op positions between ``bounds`` (increasing, from 0
        to the op count, each a cut ``allowed``); the op-level tables are shared."""
        out = copy.copy(self)
        out._slice(np.asarray(sorted(set(int(b) for b in bounds)), dtype=np.int64))
        return out

    def unit_at(self, position: int) -> int:
        """The unit whose first op is at op ``position`` (a unit boundary)."""
        return int(np.searchsorted(self.bounds, position))

    # ---------------------------------------------------------------- queries
    def params(self, a: int, b: int) -> float:
        return float(self.param_prefix[b] - self.param_prefix[a])

    def static_bytes(self, a: int, b: int) -> float:
        """Parameters, gradients and optimizer state of range ``[a, b)`` on one replica, plus
        its ops' resident footprints (``Op.resident_bytes``)."""
        resident = float(self.resident_prefix[b] - self.resident_prefix[a])
        return self.params(a, b) * (2.0 + self.state_factor) + resident

    def activation_bytes(self, a: int, b: int) -> float:
        """Full-batch outputs of range ``[a, b)`` plus what it receives (stashed per microbatch)."""
        received = self.cut_bytes[a] if a > 0 else 0.0
        return float(self.out_prefix[b] - self.out_prefix[a] + received)

    def times(self, a: int, b: int, device: str, fraction: float) -> tuple[float, float]:
        """(forward, backward) ms of range ``[a, b)`` on ``device`` at ``fraction`` of the batch."""
        t = self.type_of[self.device_index[device]]
        f = self.f_fixed[t, b] - self.f_fixed[t, a] + (self.f_scal[t, b] - self.f_scal[t, a]) * fraction
        bw = self.b_fixed[t, b] - self.b_fixed[t, a] + (self.b_scal[t, b] - self.b_scal[t, a]) * fraction
        return float(f), float(bw)

    def input_ms(self, a: int, b: int, device: str, fraction: float) -> float:
        """Of the backward ``times`` gives, the ms that compute input gradients (by FLOPs,
        ``CostModel.bwd_input_share``)."""
        t = self.type_of[self.device_index[device]]
        return float(self.bi_fixed[t, b] - self.bi_fixed[t, a]
                     + (self.bi_scal[t, b] - self.bi_scal[t, a]) * fraction)

    def pair_bytes(self, bounds: Sequence[int]) -> dict[tuple[int, int], float]:
        """Full-batch bytes from stage s to stage t (s < t) for stage boundaries ``bounds``.

        ``bounds`` = [0, b1, ..., n] in positions; one tensor per producing op and
        consuming stage (its largest edge), as the simulator sends it.
        """
        op_bounds = self.bounds[np.asarray(bounds)]
        src, dst, nbytes = self.edge_arrays
        s = np.searchsorted(op_bounds[1:], src, side="right")
        t = np.searchsorted(op_bounds[1:], dst, side="right")
        best: dict[tuple[int, int], float] = {}
        for k in np.flatnonzero(s != t).tolist():
            key = (int(src[k]), int(t[k]))
            best[key] = max(best.get(key, 0.0), float(nbytes[k]))
        stage_of = np.searchsorted(op_bounds[1:], np.arange(len(self.order)), side="right")
        out: dict[tuple[int, int], float] = defaultdict(float)
        for (u, t_), size in best.items():
            out[(int(stage_of[u]), t_)] += size
        return dict(out)

    def stage_ops(self, a: int, b: int) -> tuple[str, ...]:
        """The op ids of positions ``[a, b)``."""
        return tuple(self.order[self.bounds[a]:self.bounds[b]])


_PREFIXED = ("f_fixed", "f_scal", "b_fixed", "b_scal", "bi_fixed", "bi_scal", "param_prefix",
             "whole_param_prefix", "out_prefix", "resident_prefix", "cut_bytes")


def _prefix(rows: np.ndarray) -> np.ndarray:
    out = np.zeros((rows.shape[0], rows.shape[1] + 1))
    np.cumsum(rows, axis=1, out=out[:, 1:])
    return out
