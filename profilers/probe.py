"""Which values of a captured model follow the batch: ``probe`` runs it at a few batch sizes.

For every node of an fx graph it learns, from eval-mode runs on each of ``PROBE_ROWS``
rows, the result's shape, dtype and whether it needs a gradient, and how its
shape scales with the batch (``ValueInfo.rows_factor``): ``k > 0`` rows per
sample along one dimension, ``0`` for a shape that does not depend on the batch
(a position table), ``-1`` for a shape that changes with the batch but not in
proportion (``torch.nonzero``, ``torch.where`` with one argument, boolean
indexing: shapes that depend on the data). The runtime allocates the buffers of
values that cross devices from it, and the profiler derives from it which ops
must share a device (``colocation_groups``, the op graph's ``colocation``).
Cost: one forward pass at each of those (small) batch sizes.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

# Batch sizes of the probe runs: three, so that a shape that depends on the data
# (a count of rows routed somewhere) is rarely proportional to the batch by chance
PROBE_ROWS = (2, 3, 5)


@dataclass(frozen=True)
class ValueInfo:
    """A tensor value that may cross units: shape for ``rows`` rows, dtype, gradient."""

    name: str
    shape_per_rows: tuple[int, ...]  # shape with dimension batch_dim = rows * rows_factor
    rows_factor: int  # 0: the value does not depend on the batch size (shape is fixed)
    dtype: torch.dtype
    requires_grad: bool
    batch_dim: int = 0  # the dimension that follows the batch (0 for most activations)

    @property
    def batched(self) -> bool:
        return self.rows_factor > 0

    def shape(self, rows: int) -> tuple[int, ...]:
        if not self.batched:
            return self.shape_per_rows
        shape = list(self.shape_per_rows)
        shape[self.batch_dim] = rows * self.rows_factor
        return tuple(shape)


class _Probe(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.results: dict[str, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            self.results[n.name] = (tuple(result.shape), result.dtype, result.requires_grad)
        else:
            self.results[n.name] = type(result)
        return result


def probe(gm: fx.GraphModule, make_inputs) -> dict[str, Any]:
    """Run ``gm`` on ``make_inputs(rows)`` for each of ``PROBE_ROWS`` rows (eval mode).

    Returns node name -> ``ValueInfo`` for tensor results, or the result's type
    for anything else. A tensor whose shape changes with the batch in more than
    one dimension, or not in proportion at every probed size, gets ``rows_factor``
    -1: it cannot be cut by rows, and ``split`` lets it cross only between units
    of the same placement.
    """
    runs = []
    was_training = gm.training
    gm.eval()
    try:
        for rows in PROBE_ROWS:
            interp = _Probe(gm)
            interp.run(*make_inputs(rows))
            runs.append(interp.results)
    finally:
        gm.train(was_training)
    return {name: _value_info(name, [run[name] for run in runs]) for name in runs[0]}


def _value_info(name: str, results: list[Any]) -> Any:
    """One node's ``ValueInfo`` from its results at each of ``PROBE_ROWS`` rows."""
    first = results[0]
    if not isinstance(first, tuple):
        return first
    shapes = [r[0] for r in results]
    s1, dtype, grad = first
    if all(s == s1 for s in shapes):
        return ValueInfo(name, s1, 0, dtype, grad)
    dims = ({i for s in shapes[1:] for i, (x, y) in enumerate(zip(s1, s)) if x != y}
            if all(len(s) == len(s1) for s in shapes) else set())
    if len(dims) == 1:
        (d,) = dims
        k = s1[d] // PROBE_ROWS[0]
        if k > 0 and all(s[d] == k * rows for s, rows in zip(shapes, PROBE_ROWS)):
            shape = list(s1)
            shape[d] = 1
            return ValueInfo(name, tuple(shape), k, dtype, grad, batch_dim=d)
    return ValueInfo(name, s1, -1, dtype, grad)


def colocation_groups(gm: fx.GraphModule, op_of: Mapping[str, str],
                      info: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    """The groups of ops the runtime can only run together, from ``probe`` results.

    Two rules of the runtime's split (``dl_nfv.runtime.partition``) make ops inseparable:

    * a ``getitem`` of a value that is not a tensor (the tuple of ``torch.topk``,
      ``torch.where``, ``torch.chunk``, an LSTM) runs where the tuple is made;
    * a value whose shape depends on the data (``rows_factor`` -1) cannot be cut
      by rows, so its producer and every consumer share devices and shares.

    Ops joined by either rule, transitively, form one group (op ids in graph node
    order); ops of the model's inputs never join. Groups of one op are left out.
    O(nodes + edges).
    """
    parent: dict[str, str] = {}

    def root(op: str) -> str:
        while parent.setdefault(op, op) != op:
            parent[op] = parent[parent[op]]
            op = parent[op]
        return op

    def join(a: str | None, b: str | None) -> None:
        if a is not None and b is not None and a != b:
            parent[root(b)] = root(a)

    def op_of_node(n: fx.Node) -> str | None:
        return op_of.get(n.name) if n.op not in ("placeholder", "output", "get_attr") else None

    for n in gm.graph.nodes:
        op = op_of_node(n)
        if op is None:
            continue
        src = n.args[0] if n.args else None
        if (n.op == "call_function" and n.target is operator.getitem and isinstance(src, fx.Node)
                and not isinstance(info.get(src.name), ValueInfo)):
            join(op_of_node(src), op)
        value = info.get(n.name)
        if isinstance(value, ValueInfo) and value.rows_factor < 0:
            for user in n.users:
                join(op, op_of_node(user))
    order = {}
    for n in gm.graph.nodes:
        op = op_of_node(n)
        if op is not None:
            order.setdefault(op, len(order))
    members: dict[str, list[str]] = {}
    for op in sorted(parent, key=order.__getitem__):
        members.setdefault(root(op), []).append(op)
    return tuple(tuple(group) for group in members.values() if len(group) > 1)
