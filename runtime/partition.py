"""Split a captured model into per-unit fx submodules at the plan's op boundaries.

A *unit* is a set of ops that runs as one piece on one device (or on each
replica of a group): a pipeline stage, or one op of an op-placement plan. The
model's fx graph (from ``dl_nfv.profilers.capture``, the same trace the op
graph was made from, so op ids match) is cut into one ``GraphModule`` per unit
that takes the unit's inputs and returns the values other units (or the loss)
need. Units share the model's parameters (the submodules are the original
``nn.Module`` objects), so an optimizer over the model updates them.

Values that cross units are tensors, sent between devices. A node whose
result is not a tensor (a tuple from ``torch.split`` or an LSTM, a size from
``x.size(0)``) never crosses: ``getitem`` nodes of a tuple are moved into the
tuple producer's unit, and other non-tensor values are recomputed in the unit
that needs them (their producers are copied there; these are shape
computations).

``probe`` (``dl_nfv.profilers.probe``, shared with the profiler) runs the model
at a few small batch sizes (eval mode) to learn each crossing value's shape, dtype,
whether it needs a gradient, and how its first dimension scales with the batch,
so receivers can allocate buffers for any slice of rows. A value whose shape
depends on the data (not on the batch in proportion) cannot be cut by rows: it
may cross only between units with the same placement (same devices, same
shares), where every replica passes its own whole value to itself. The profiler
records such values' producers and consumers as colocation groups of the op
graph, and so do the ``getitem`` ops of a tuple with the tuple's producer.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from dl_nfv.artifacts import BadInput
from dl_nfv.profilers.probe import PROBE_ROWS, ValueInfo, probe

__all__ = ["PROBE_ROWS", "Partition", "Unit", "ValueInfo", "probe", "split"]

@dataclass
class Unit:
    """One unit's submodule: ``module(*inputs) -> tuple(outputs)``."""

    id: str
    module: fx.GraphModule
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ops: tuple[str, ...] = ()

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(dict.fromkeys(self.module.parameters()))


@dataclass
class Partition:
    """The model cut into units, with who produces and who consumes every crossing value."""

    units: dict[str, Unit]
    producer: dict[str, str | None]  # value -> unit id; None for a model input
    consumers: dict[str, tuple[str, ...]]  # value -> unit ids that take it as input
    input_names: tuple[str, ...]  # the model's placeholders, in order
    output_spec: Any  # the model output's structure, with value names for tensors
    loss_unit: str
    values: dict[str, ValueInfo] = field(default_factory=dict)

    def output_leaves(self) -> tuple[str, ...]:
        leaves: list[str] = []
        fx.node.map_aggregate(self.output_spec, lambda v: leaves.append(v) if isinstance(v, str) else v)
        return tuple(dict.fromkeys(leaves))


def _is_structural(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


_INPLACE_FUNCTIONS = {operator.iadd, operator.isub, operator.imul, operator.itruediv}


def _mutates_first_arg(node: fx.Node, gm: fx.GraphModule) -> bool:
    if node.op == "call_method":
        return isinstance(node.target, str) and node.target.endswith("_") and not node.target.startswith("_")
    if node.op == "call_function":
        return node.target in _INPLACE_FUNCTIONS or bool(node.kwargs.get("inplace"))
    if node.op == "call_module":
        return bool(getattr(gm.get_submodule(str(node.target)), "inplace", False))
    return False


def split(gm: fx.GraphModule, op_of: Mapping[str, str], unit_of_op: Mapping[str, str],
          info: Mapping[str, Any], placement_of: Mapping[str, Hashable] | None = None) -> Partition:
    """Cut ``gm`` into units.

    Parameters
    ----------
    gm : the captured model.
    op_of : fx node name -> op id (``Capture.op_of``).
    unit_of_op : op id -> unit id, for every op that is not a model input.
    info : ``probe`` results (node name -> ``ValueInfo`` or type).
    placement_of : unit id -> its placement (devices and shares); a value whose shape
        does not follow the batch may cross between units of equal placement. Without
        it no such value may cross.

    Returns the ``Partition``. Raises ``BadInput`` when a node's op has no unit.
    Cost: O(nodes + edges).
    """
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    output = next(n for n in nodes if n.op == "output")
    unit_of: dict[fx.Node, str] = {}
    for n in nodes:
        if n.op in ("placeholder", "output", "get_attr"):
            continue
        op = op_of.get(n.name)
        if op is None or op not in unit_of_op:
            raise BadInput(f"fx node {n.name!r} (op {op!r}) is in no unit of the plan")
        unit_of[n] = unit_of_op[op]
    # getitem of a non-tensor (a tuple) runs where the tuple was made
    for n in nodes:
        if _is_structural(n):
            src = n.args[0]
            if isinstance(src, fx.Node) and src in unit_of and not isinstance(info.get(src.name), ValueInfo):
                unit_of[n] = unit_of[src]
    order = {n: i for i, n in enumerate(nodes)}
    leaves: list[fx.Node] = []
    fx.node.map_arg(output.args[0], lambda n: leaves.append(n) or n)
    leaves = list(dict.fromkeys(leaves))
    loss_unit = max((unit_of[n] for n in leaves if n in unit_of), key=lambda u: max(
        order[n] for n in unit_of if unit_of[n] == u), default=None)
    if loss_unit is None:
        raise BadInput("the model's output is one of its inputs; there is nothing to train")
    members: dict[str, list[fx.Node]] = {}
    for n in nodes:
        if n in unit_of:
            members.setdefault(unit_of[n], []).append(n)

    plans = {uid: _needs(body, [n for n in leaves if uid == loss_unit], info)
             for uid, body in members.items()}
    wanted: dict[fx.Node, list[str]] = {}
    for uid, (external, _) in plans.items():
        for n in external:
            wanted.setdefault(n, []).append(uid)
    units: dict[str, Unit] = {}
    producer: dict[str, str | None] = {p.name: None for p in placeholders}
    for uid, body in members.items():
        external, copies = plans[uid]
        outs = [n for n in body if any(u != uid for u in wanted.get(n, ()))]
        extra = [n for n in leaves if uid == loss_unit]
        module = _build_module(gm, uid, body, external, copies, outs, extra)
        ops = tuple(dict.fromkeys(op_of[n.name] for n in body if n.name in op_of))
        units[uid] = Unit(id=uid, module=module, inputs=tuple(n.name for n in external),
                          outputs=tuple(n.name for n in outs), ops=ops)
        for n in outs:
            producer[n.name] = uid
    consumers = {n.name: tuple(u for u in uids) for n, uids in wanted.items()}
    values = {v: info[v] for v in consumers if isinstance(info.get(v), ValueInfo)}
    same = placement_of or {}
    for v, value in values.items():
        if value.rows_factor >= 0 or producer.get(v) is None:
            continue
        home = same.get(producer[v])
        apart = [c for c in consumers[v] if home is None or same.get(c) != home]
        if apart:
            raise BadInput(f"value {v!r} (shape {list(value.shape_per_rows)} for "
                           f"{PROBE_ROWS[0]} rows) crosses from unit {producer[v]!r} to "
                           f"{apart[0]!r}, but its shape does not follow the batch in one "
                           f"dimension, so it cannot be cut by rows; place those ops on the same "
                           f"devices with the same shares (re-profile the model: the op graph's "
                           f"colocation groups say which)")
    spec = fx.node.map_arg(output.args[0], lambda n: n.name)
    return Partition(units=units, producer=producer, consumers=consumers,
                     input_names=tuple(p.name for p in placeholders), output_spec=spec,
                     loss_unit=loss_unit, values=values)


def _needs(body: Sequence[fx.Node], loss_leaves: Sequence[fx.Node],
           info: Mapping[str, Any]) -> tuple[list[fx.Node], list[fx.Node]]:
    """The tensors a unit receives (and model inputs it reads), and the non-tensor producers
    it recomputes."""
    mine = set(body)
    external: list[fx.Node] = []
    copies: list[fx.Node] = []
    seen: set[fx.Node] = set()

    def need(n: fx.Node) -> None:
        if n in mine or n in seen or n.op == "get_attr":
            return
        seen.add(n)
        if n.op == "placeholder" or isinstance(info.get(n.name), ValueInfo):
            external.append(n)
        else:  # a non-tensor made elsewhere: recompute it here
            for a in n.all_input_nodes:
                need(a)
            copies.append(n)

    for n in body:
        for a in n.all_input_nodes:
            need(a)
    for n in loss_leaves:
        need(n)
    return external, copies


def _build_module(gm: fx.GraphModule, uid: str, body: Sequence[fx.Node],
                  external: Sequence[fx.Node], copies: Sequence[fx.Node], outs: Sequence[fx.Node],
                  loss_leaves: Sequence[fx.Node]) -> fx.GraphModule:
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in external:
        env[n] = g.placeholder(n.name)
    mutated = {a for n in body if _mutates_first_arg(n, gm) for a in n.args[:1]
               if isinstance(a, fx.Node) and a in env}
    for n in mutated:  # an in-place op on a received leaf would break autograd: work on a copy
        env[n] = g.call_method("clone", (env[n],))

    def arg(n: fx.Node) -> fx.Node:
        if n not in env:
            assert n.op == "get_attr", n
            env[n] = g.get_attr(n.target)
        return env[n]

    for n in sorted([*copies, *body], key=order.__getitem__):
        env[n] = g.node_copy(n, arg)
    # the unit's crossing outputs, then (loss unit) the model output's tensors
    g.output((*[env[n] for n in outs], *[env[n] for n in loss_leaves]))
    return fx.GraphModule(gm, g, f"unit_{uid}")
