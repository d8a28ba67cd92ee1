"""Forward and backward of units, exchanging activations and gradients with peer ranks.

Every plan the runtime executes is a set of *units* (``partition.Unit``), each
placed on one device or replicated over several with batch shares, and a list
of actions per device: forward or backward of a unit on a microbatch. Data
parallelism is one replicated unit; a pipeline has one unit per stage; op
placement has one unit per op.

Rows. A step's global batch is cut into ``microbatches`` equal microbatches;
within a microbatch, replica ``i`` of a unit holds rows ``split_rows(rows,
shares)[i]``. A value that crosses from unit P to unit C moves between the
replicas whose rows overlap (the plan's rule): a device receives, once per
value and microbatch, the rows that the consumer units it hosts need, from
each producer replica that holds some of them, and sends gradients back the
same way. A value that does not follow the batch (fixed shape) comes from the
producer replica on the same device, else from replica 0.

Autograd is cut at unit boundaries: a unit's inputs are leaves, and its
backward is ``torch.autograd.backward(outputs, output_grads)``; the leaves'
``.grad`` are the gradients sent back. A backward split in two (pipeline
actions ``I`` and ``W``) computes the leaves' gradients first, keeping the
gradients that reach the nodes before the weights
(``torch.distributed.pipelining``'s ``stage_backward_input``), and the
weights' gradients later from those (``_weight_gradients``). Each slice's loss is weighted by its
rows over the global batch, so the gradients, summed over replicas and
microbatches, are those of the full-batch mean loss.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.autograd.graph import GradientEdge
from torch.autograd.profiler import record_function
from torch.distributed.pipelining._backward import stage_backward_input

from .comm import Comm, tag_of
from .model import split_rows, take_rows
from .partition import Partition


@dataclass(frozen=True)
class Placement:
    """Where a unit runs: its replica devices and their batch shares."""

    devices: tuple[str, ...]
    shares: tuple[float, ...]


@dataclass(frozen=True)
class _Route:
    """One value's rows ``[lo, hi)`` (of a microbatch) from producer replica ``part`` to ``dst``."""

    src: str
    dst: str
    lo: int
    hi: int
    part: int


@dataclass
class _Saved:
    leaves: dict[str, torch.Tensor]
    outputs: list[torch.Tensor]
    loss: torch.Tensor | None
    lo: int
    hi: int


class UnitRunner:
    """Runs this device's unit actions; owns the per-step buffers of values and gradients."""

    def __init__(self, partition: Partition, placements: Mapping[str, Placement], *,
                 device: str, rank_of: Mapping[str, int], microbatches: int, batch_size: int,
                 comm: Comm, loss_fn: Callable[[Any, Any], torch.Tensor]):
        self.p = partition
        self.placements = dict(placements)
        self.device = device
        self.rank_of = dict(rank_of)
        self.microbatches = microbatches
        self.batch_size = batch_size
        self.mb_rows = batch_size // microbatches
        self.comm = comm
        self.loss_fn = loss_fn
        self.rows = {uid: split_rows(self.mb_rows, pl.shares) for uid, pl in self.placements.items()}
        self.value_index = {v: i for i, v in enumerate(sorted(partition.values))}
        self.routes = {v: self._routes(v) for v in partition.values}
        # how many units on this device consume each value (gradients are sent after the last)
        self.local_consumers = {v: sum(1 for c in cs if self._runs(c))
                                for v, cs in partition.consumers.items()}
        self.unit_time_ms: dict[tuple[str, str], list[float]] = defaultdict(list)
        # the receives of the last schedule begun: every step of a run begins the same one
        self._posts: tuple[tuple, list[tuple]] = ((), [])
        self._reset()

    # ---------------------------------------------------------------- geometry
    def _runs(self, uid: str) -> bool:
        """True if this device holds a non-empty replica of ``uid``."""
        rows = self.my_rows(uid)
        return rows is not None and rows[1] > rows[0]

    def _empty(self, uid: str) -> bool:
        """True if this device holds a replica of ``uid`` with no rows (it runs nothing)."""
        rows = self.my_rows(uid)
        return rows is not None and rows[1] <= rows[0]

    def my_rows(self, uid: str) -> tuple[int, int] | None:
        devices = self.placements[uid].devices
        if self.device not in devices:
            return None
        return self.rows[uid][devices.index(self.device)]

    def _hull(self, value: str, device: str) -> tuple[int, int] | None:
        """Rows of ``value`` that units on ``device`` consume (within a microbatch)."""
        spans = [self.rows[c][self.placements[c].devices.index(device)]
                 for c in self.p.consumers.get(value, ()) if device in self.placements[c].devices]
        spans = [s for s in spans if s[1] > s[0]]
        if not spans:
            return None
        return min(s[0] for s in spans), max(s[1] for s in spans)

    def _routes(self, value: str) -> list[_Route]:
        producer = self.p.producer[value]
        if producer is None:
            return []
        info = self.p.values[value]
        pdev = self.placements[producer].devices
        prow = self.rows[producer]
        out = []
        targets = dict.fromkeys(d for c in self.p.consumers[value] for d in self.placements[c].devices)
        for dst in targets:
            hull = self._hull(value, dst)
            if hull is None:
                continue
            if not info.batched:
                part = pdev.index(dst) if dst in pdev else 0
                out.append(_Route(pdev[part], dst, 0, 0, part))
                continue
            for part, (src, (lo, hi)) in enumerate(zip(pdev, prow)):
                lo, hi = max(lo, hull[0]), min(hi, hull[1])
                if lo < hi:
                    out.append(_Route(src, dst, lo, hi, part))
        return out

    # ----------------------------------------------------------------- buffers
    def _reset(self) -> None:
        self.inputs: tuple = ()
        self.target: Any = None
        self.loss_sum = 0.0
        self._saved: dict[tuple[str, int], _Saved] = {}
        self._produced: dict[tuple[str, int], tuple[torch.Tensor, int]] = {}  # (value, mb) -> (out, lo)
        self._received: dict[tuple[str, int], tuple[torch.Tensor, int]] = {}  # hull tensor, hull lo
        self._grads: dict[tuple[str, int], tuple[torch.Tensor, int]] = {}  # hull-sized grad, hull lo
        self._pending: dict[tuple[str, int], int] = {}
        # (unit, mb) -> what a split backward's W computes the weight gradients from
        self._deferred: dict[tuple[str, int], Callable[[], None]] = {}

    def begin_step(self, inputs: tuple, target: Any,
                   actions: Sequence[tuple[str, str, int]] = ()) -> None:
        """Start a step; post every receive that ``actions`` (this device's schedule of the
        step) will make (``Comm.post``). The receives of a schedule are worked out once: a
        placement's walk over its actions' values and routes took a rank 30-50 us a step."""
        self._reset()
        self.inputs = inputs
        self.target = target
        schedule = tuple(actions)
        if schedule != self._posts[0]:
            self._posts = (schedule, list(self.receives(schedule)))
        for shape, dtype, src, tag in self._posts[1]:
            self.comm.post(shape, dtype, src, tag)

    def receives(self, actions: Sequence[tuple[str, str, int]]) -> Iterator[tuple]:
        """``(shape, dtype, source rank, tag)`` of every receive ``actions`` make, in the
        order they make them: a forward receives its inputs' rows from remote producers
        (once per value and microbatch), a backward (``B`` or ``I``) its outputs'
        gradients from remote consumers."""
        seen: set[tuple[str, int]] = set()
        for phase, uid, mb in actions:
            rows = self.my_rows(uid)
            if phase == "W" or rows is None or rows[1] <= rows[0]:
                continue
            if phase == "F":
                for v in self.p.units[uid].inputs:
                    if self.p.producer.get(v) is None or (v, mb) in seen:
                        continue
                    seen.add((v, mb))
                    for r in self.routes[v]:
                        if r.dst == self.device and r.src != self.device:
                            yield self._receive(v, mb, r, backward=False)
                continue
            me = self.placements[uid].devices.index(self.device)
            for v in self.p.units[uid].outputs:
                if not self.p.values[v].requires_grad:
                    continue
                for r in self.routes.get(v, ()):
                    if r.src == self.device and r.part == me and r.dst != self.device:
                        yield self._receive(v, mb, r, backward=True)

    def _receive(self, value: str, mb: int, r: _Route, *, backward: bool) -> tuple:
        """``(shape, dtype, source rank, tag)`` of the receive of route ``r``'s rows of
        ``value`` on microbatch ``mb``: the value from its producer replica, or (``backward``)
        its gradient from the consumer's device."""
        info = self.p.values[value]
        tag = tag_of(self.value_index[value], mb, backward, r.part)
        if backward:
            shape = info.shape(r.hi - r.lo) if info.batched else info.shape_per_rows
            return shape, info.dtype, self.rank_of[r.dst], tag
        return info.shape(r.hi - r.lo), info.dtype, self.rank_of[r.src], tag

    def end_step(self) -> float:
        """Drain the sends of the step; returns the step's weighted loss on this rank."""
        self.comm.drain()
        unclaimed = self.comm.unclaimed()
        if unclaimed:
            src, tag = unclaimed[0]
            raise RuntimeError(f"the schedule of {self.device!r} made no receive of tag {tag} "
                               f"from rank {src}, posted for it")
        if self._saved or self._deferred:
            left = ", ".join(f"{u} mb{m}" for u, m in [*self._saved, *self._deferred])
            raise RuntimeError(f"the schedule of {self.device!r} ran no backward (or no W) "
                               f"for {left}")
        loss = self.loss_sum
        self._reset()
        return loss

    def _rows_of(self, value: str, lo: int, hi: int, tensor: torch.Tensor, base: int) -> torch.Tensor:
        info = self.p.values[value]
        if not info.batched:
            return tensor
        k = info.rows_factor
        return tensor.narrow(info.batch_dim, (lo - base) * k, (hi - lo) * k)

    def _value(self, value: str, mb: int) -> tuple[torch.Tensor, int]:
        """The hull of ``value`` for this device (received or local), and its first row."""
        key = (value, mb)
        if key in self._received:
            return self._received[key]
        info = self.p.values[value]
        pieces = []
        for r in self.routes[value]:
            if r.dst != self.device:
                continue
            if r.src == self.device:
                out, base = self._produced[key]
                pieces.append(self._rows_of(value, r.lo, r.hi, out, base).detach())
            else:
                pieces.append(self.comm.recv(*self._receive(value, mb, r, backward=False)))
        hull = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=info.batch_dim)
        lo = min((r.lo for r in self.routes[value] if r.dst == self.device), default=0)
        self._received[key] = (hull, lo)
        return hull, lo

    # ----------------------------------------------------------------- actions
    @contextmanager
    def _action(self, name: str) -> Iterator[None]:
        """A compute action: a range in the ``--trace`` and a span of the step's timeline."""
        with span(name), self.comm.timeline.span("compute", name):
            yield

    def forward(self, uid: str, mb: int) -> None:
        with self._action(f"forward {uid} mb{mb}"):
            self._forward(uid, mb)

    def backward(self, uid: str, mb: int, *, split: bool = False) -> None:
        """The backward (``B``), or with ``split`` its input gradients alone (``I``)."""
        with self._action(f"backward {uid} mb{mb}"):
            self._backward(uid, mb, split)

    def weights(self, uid: str, mb: int) -> None:
        """The weight gradients of a split backward (``W``)."""
        deferred = self._deferred.pop((uid, mb), None)
        if deferred is None:
            if self._empty(uid):
                return
            raise RuntimeError(f"W of unit {uid!r} mb{mb} on {self.device!r} before its I")
        with self._action(f"weight gradients {uid} mb{mb}"):
            t0, w0 = time.perf_counter(), self.comm.wait_ms
            deferred()
            self._time(uid, "W", t0, w0)

    def _forward(self, uid: str, mb: int) -> None:
        rows = self.my_rows(uid)
        if rows is None:
            raise RuntimeError(f"device {self.device!r} runs no replica of unit {uid!r}")
        lo, hi = rows
        if hi <= lo:
            return
        t0, w0 = time.perf_counter(), self.comm.wait_ms
        unit = self.p.units[uid]
        start = mb * self.mb_rows
        leaves: dict[str, torch.Tensor] = {}
        args = []
        for v in unit.inputs:
            if self.p.producer.get(v) is None:  # a model input: every rank has the batch
                index = self.p.input_names.index(v)
                args.append(self.inputs[index][start + lo:start + hi])
                continue
            hull, base = self._value(v, mb)
            leaf = self._rows_of(v, lo, hi, hull, base).detach()
            info = self.p.values[v]
            if info.requires_grad:
                leaf.requires_grad_(True)
            leaves[v] = leaf
            args.append(leaf)
        outs = unit.module(*args)
        crossing = list(outs[:len(unit.outputs)])
        loss = None
        if uid == self.p.loss_unit:
            by_name = dict(zip(self.p.output_leaves(), outs[len(unit.outputs):]))
            output = fx.node.map_aggregate(self.p.output_spec,
                                           lambda v: by_name[v] if isinstance(v, str) else v)
            target = take_rows(self.target, start + lo, start + hi)
            loss = self.loss_fn(output, target) * ((hi - lo) / self.batch_size)
            self.loss_sum += float(loss.detach())
        me = self.placements[uid].devices.index(self.device)
        for v, out in zip(unit.outputs, crossing):
            self._produced[(v, mb)] = (out, lo)
            for r in self.routes.get(v, ()):
                if r.src == self.device and r.part == me and r.dst != self.device:
                    piece = self._rows_of(v, r.lo, r.hi, out, lo)
                    self.comm.isend(piece, self.rank_of[r.dst],
                                    tag_of(self.value_index[v], mb, False, r.part))
        self._saved[(uid, mb)] = _Saved(leaves, crossing, loss, lo, hi)
        self._time(uid, "F", t0, w0)

    def _backward(self, uid: str, mb: int, split: bool = False) -> None:
        saved = self._saved.pop((uid, mb), None)
        if saved is None:
            if self._empty(uid):
                return  # nothing ran forward
            raise RuntimeError(f"backward of unit {uid!r} mb{mb} on {self.device!r} before its forward")
        t0, w0 = time.perf_counter(), self.comm.wait_ms
        unit = self.p.units[uid]
        me = self.placements[uid].devices.index(self.device)
        roots: list[torch.Tensor] = []
        grads: list[torch.Tensor | None] = []
        if saved.loss is not None:
            roots.append(saved.loss)
            grads.append(None)
        for v, out in zip(unit.outputs, saved.outputs):
            if not self.p.values[v].requires_grad:
                continue  # consumers send no gradient for it either
            grad = self._output_grad(v, mb, out, saved.lo, saved.hi, me)
            if out.requires_grad:
                roots.append(out)
                grads.append(grad)
        leaves = [leaf for leaf in saved.leaves.values() if leaf.requires_grad]
        if split and roots and leaves:
            weights = [p for p in unit.parameters() if p.requires_grad]
            _, groups = stage_backward_input(roots, grads, leaves, iter(weights))
            self._deferred[(uid, mb)] = lambda: _weight_gradients(groups)
        elif split:  # no input needs a gradient (the first stage): all of it waits for the W
            self._deferred[(uid, mb)] = lambda: roots and torch.autograd.backward(roots, grads)
        elif roots:
            torch.autograd.backward(roots, grads)
        for v, leaf in saved.leaves.items():
            if leaf.requires_grad:
                self._input_grad(v, mb, leaf, saved.lo, saved.hi)
        self._time(uid, "I" if split else "B", t0, w0)

    def _output_grad(self, v: str, mb: int, out: torch.Tensor, lo: int, hi: int,
                     me: int) -> torch.Tensor:
        """The gradient of output ``v``: local consumers' part plus what remote ones send."""
        info = self.p.values[v]
        grad = torch.zeros_like(out)
        local = self._grads.get((v, mb))
        if local is not None:
            g, base = local
            if info.batched:
                a, b = max(lo, base), min(hi, base + g.shape[info.batch_dim] // info.rows_factor)
                if a < b:
                    self._rows_of(v, a, b, grad, lo).add_(self._rows_of(v, a, b, g, base))
            else:
                grad.add_(g)
        for r in self.routes.get(v, ()):
            if r.src == self.device and r.part == me and r.dst != self.device:
                piece = self.comm.recv(*self._receive(v, mb, r, backward=True))
                self._rows_of(v, r.lo, r.hi, grad, lo).add_(piece)
        return grad

    def _input_grad(self, v: str, mb: int, leaf: torch.Tensor, lo: int, hi: int) -> None:
        key = (v, mb)
        hull, base = self._received[key]
        if key not in self._grads:
            self._grads[key] = (torch.zeros_like(hull), base)
            self._pending[key] = self.local_consumers[v]
        g, _ = self._grads[key]
        if leaf.grad is not None:
            self._rows_of(v, lo, hi, g, base).add_(leaf.grad)
        self._pending[key] -= 1
        if self._pending[key] == 0:  # every unit here that consumed v is done: send gradients back
            for r in self.routes[v]:
                if r.dst == self.device and r.src != self.device:
                    self.comm.isend(self._rows_of(v, r.lo, r.hi, g, base), self.rank_of[r.src],
                                    tag_of(self.value_index[v], mb, True, r.part))

    def _time(self, uid: str, phase: str, t0: float, w0: float) -> None:
        elapsed = (time.perf_counter() - t0) * 1e3
        self.unit_time_ms[(uid, phase)].append(max(elapsed - (self.comm.wait_ms - w0), 0.0))


def _weight_gradients(groups: list[dict]) -> None:
    """The weight gradients of a split backward from what ``stage_backward_input`` kept:
    per group of weights, the gradients that reached the nodes between the unit's inputs
    and those weights, run back to the weights with ``torch.autograd.backward`` (so they
    accumulate into ``.grad`` and its hooks fire, as in a whole backward). Where a group
    has several such nodes, each is held to its kept gradient, so that what flows into it
    from another is not counted twice (as ``stage_backward_weight`` does)."""
    for group in groups:
        edges, grads, handles = [], [], []
        kept = group.get("grads") or [()] * len(group["intermediates"])
        for node_grads, node in zip(kept, group["intermediates"]):
            for i, grad in enumerate(node_grads):
                if grad is not None:
                    edges.append(GradientEdge(node, i))
                    grads.append(grad)
            if len(group["intermediates"]) > 1:
                handles.append(node.register_prehook(lambda _, kept=node_grads: kept))
        try:
            if edges:
                torch.autograd.backward(edges, grads,
                                        inputs=[GradientEdge(acc, 0) for acc in group["params"]])
        finally:
            for handle in handles:
                handle.remove()


def span(name: str) -> AbstractContextManager:
    """A named range in the ``--trace`` of a run (``record_function``), named as the
    simulator names its tasks; free when no profiler runs (a check of 0.2 us, where an
    idle ``record_function`` costs 10)."""
    return record_function(name) if torch._C._autograd._profiler_enabled() else nullcontext()


def accumulations(runner: UnitRunner, actions: Sequence[tuple[str, str, int]]) -> dict[int, int]:
    """Parameter id -> backward passes that accumulate into it on this rank in one step."""
    counts: dict[int, int] = defaultdict(int)
    for phase, uid, _mb in actions:
        if phase not in "BW":  # (a split backward accumulates in its W)
            continue
        rows = runner.my_rows(uid)
        if rows is None or rows[1] <= rows[0]:
            continue
        for p in runner.p.units[uid].parameters():
            counts[id(p)] += 1
    return dict(counts)


