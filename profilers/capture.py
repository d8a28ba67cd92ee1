"""Graph capture: trace a module with torch.fx and group its nodes into op-graph ops.

``capture(module, example_inputs, granularity=...)`` returns a ``Capture``: the
``torch.fx.GraphModule`` and the mapping from op id to the fx nodes that make
the op. The runtime re-traces the same model with the same arguments (tracing
is deterministic) and splits the GraphModule into per-device submodules by the
op ids of an op graph.

Granularity
    ``op``: every fx node that computes (``call_module`` of a torch.nn leaf,
    ``call_function``, ``call_method``) is an op; its id is the fx node name
    (``layer1_0_conv1``, ``add_3``). ``get_attr`` nodes (parameters or buffers
    read directly) belong to the op of their first user.

    ``layer``: modules are coarsened into *layers*, traced as opaque leaves.
    Layers are found by descending from the root through containers
    (``Sequential``, ``ModuleList``, ``ModuleDict``) and through modules that
    hold a stack of same-class blocks (a ``ModuleList`` of transformer layers);
    every other child met on the way is a layer (a ResNet bottleneck, a
    transformer block, an embedding). The op id of a layer is its module's
    qualified name (``layer1.0``, ``h.11``); a module called a second time gets
    ``@2``. Functional nodes and calls of parameter-free modules (ReLU,
    Dropout, pooling) join the layer before them (or the first layer, at the
    start), so each op is a contiguous run of nodes in graph order and the op
    graph stays acyclic.

In both, each graph input (placeholder) is an op of kind ``input`` whose id is
the argument name.

Untraceable models raise ``UntraceableModel`` (a ``BadInput``) naming the
innermost module being traced when tracing stopped, and the option that avoids
it (``--granularity layer`` or ``--leaf NAME``).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import fx, nn

from dl_nfv.artifacts import BadInput, Granularity

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


class UntraceableModel(BadInput):
    """torch.fx could not trace the model (data-dependent control flow, iteration, ...)."""


@dataclass(frozen=True)
class Capture:
    """A traced model and its ops.

    ``op_ids`` lists ops in graph (topological) order; ``nodes_of[op]`` the fx
    node names of an op, in graph order; ``op_of[node]`` the inverse;
    ``modules_of[op]`` the qualified names of the modules the op calls (empty
    for inputs and purely functional ops).
    """

    graph_module: fx.GraphModule
    granularity: Granularity
    op_ids: tuple[str, ...]
    nodes_of: dict[str, tuple[str, ...]]
    op_of: dict[str, str]
    modules_of: dict[str, tuple[str, ...]]
    input_ops: tuple[str, ...]

    def nodes(self, op_id: str) -> list[fx.Node]:
        by_name = {n.name: n for n in self.graph_module.graph.nodes}
        return [by_name[name] for name in self.nodes_of[op_id]]

    @cached_property
    def tied_parameter_ids(self) -> frozenset[int]:
        """``id()`` of every parameter tensor that more than one op uses (a tied weight);
        found once per capture, though every instrumented step asks."""
        users: dict[int, set[str]] = {}
        for node in self.graph_module.graph.nodes:
            op = self.op_of.get(node.name)
            for p in node_parameters(self.graph_module, node):
                users.setdefault(id(p), set()).add(op)
        return frozenset(key for key, ops in users.items() if len(ops) > 1)


def node_parameters(gm: fx.GraphModule, node: fx.Node) -> list[nn.Parameter]:
    """The parameter tensors ``node`` uses: every one of the module it calls (shared ones
    included), or the parameter it reads (``get_attr``); none for other nodes."""
    if node.op == "call_module":
        return [p for _, p in gm.get_submodule(str(node.target)).named_parameters(
            remove_duplicate=False)]
    if node.op == "get_attr":
        obj = gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        return [obj] if isinstance(obj, nn.Parameter) else []
    return []


def capture(module: nn.Module, example_inputs: Sequence[torch.Tensor] | None = None, *,
            granularity: Granularity | str = Granularity.OP, leaf_modules: Iterable[str] = (),
            ) -> Capture:
    """Trace ``module`` and group its fx nodes into ops at ``granularity``.

    Parameters
    ----------
    module : the model (not modified).
    example_inputs : its positional inputs; only their number is used here
        (arguments of ``forward`` after them that have defaults are fixed to
        their defaults). ``None`` traces every argument.
    granularity : ``op`` or ``layer`` (see the module docstring).
    leaf_modules : qualified module names or class names traced as opaque
        leaves (and, at layer granularity, made layers).

    Returns a ``Capture``. Deterministic: the same module and arguments give the
    same graph, node names and op ids. Raises ``UntraceableModel`` when fx
    cannot trace the model, ``BadInput`` when the number of inputs does not
    match ``forward``. Cost: one symbolic trace, O(nodes) grouping.
    """
    granularity = Granularity(granularity)
    leaves = frozenset(leaf_modules)
    _check_leaves(module, leaves)
    layers = layer_modules(module, leaves) if granularity is Granularity.LAYER else set()
    concrete = _concrete_args(module, None if example_inputs is None else len(example_inputs))
    tracer = _Tracer(leaves, layers)
    try:
        graph = tracer.trace(module, concrete_args=concrete)
    except BadInput:
        raise
    except Exception as exc:  # fx raises TraceError, TypeError, RuntimeError, ...
        raise _untraceable(module, tracer, exc, granularity) from None
    gm = fx.GraphModule(tracer.root, graph, type(module).__name__)
    if granularity is Granularity.LAYER:
        groups = _layer_groups(gm, layers)
    else:
        groups = _op_groups(gm)
    op_ids = tuple(groups)
    nodes_of = {op: tuple(n.name for n in nodes) for op, nodes in groups.items()}
    op_of = {name: op for op, names in nodes_of.items() for name in names}
    modules_of = {op: tuple(dict.fromkeys(str(n.target) for n in nodes if n.op == "call_module"))
                  for op, nodes in groups.items()}
    inputs = tuple(op for op, nodes in groups.items() if nodes[0].op == "placeholder")
    return Capture(graph_module=gm, granularity=granularity, op_ids=op_ids, nodes_of=nodes_of,
                   op_of=op_of, modules_of=modules_of, input_ops=inputs)


def layer_modules(module: nn.Module, leaves: frozenset[str] = frozenset()) -> set[str]:
    """Qualified names of the modules that are layers at layer granularity (see module doc)."""
    out: set[str] = set()

    def visit(parent: nn.Module, prefix: str) -> None:
        for name, child in parent.named_children():
            qualname = f"{prefix}.{name}" if prefix else name
            if qualname in leaves or type(child).__name__ in leaves:
                out.add(qualname)
            elif isinstance(child, CONTAINERS) or _holds_stack(child):
                visit(child, qualname)
            else:
                out.add(qualname)

    visit(module, "")
    return out


def _holds_stack(module: nn.Module) -> bool:
    """True if a direct child is a container of >= 2 modules, all of one class."""
    for child in module.children():
        if isinstance(child, CONTAINERS):
            members = list(child.children())
            if len(members) >= 2 and len({type(m) for m in members}) == 1:
                return True
    return False


def _check_leaves(module: nn.Module, leaves: frozenset[str]) -> None:
    names = {name for name, _ in module.named_modules() if name}
    classes = {type(m).__name__ for m in module.modules()}
    for leaf in sorted(leaves):
        if leaf not in names and leaf not in classes:
            raise BadInput(f"--leaf {leaf!r}: the model has no module or module class of that name")


def _concrete_args(module: nn.Module, n_inputs: int | None) -> dict | None:
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if n_inputs is None:
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    required = [p for p in positional if p.default is p.empty]
    if n_inputs < len(required) or n_inputs > len(positional):
        names = ", ".join(p.name for p in positional)
        raise BadInput(f"{type(module).__name__}.forward({names}) takes {len(required)}"
                       f"{'' if len(required) == len(positional) else f' to {len(positional)}'} "
                       f"inputs, got {n_inputs} (one per --input-shape)")
    return {p.name: p.default for p in positional[n_inputs:]} or None


class _Tracer(fx.Tracer):
    """fx tracer with chosen leaves, remembering the module stack for error messages.

    Buffers read in ``forward`` become ``get_attr`` nodes (like parameters), so
    slicing a buffer by an input's size traces.
    """

    proxy_buffer_attributes = True

    def __init__(self, leaves: frozenset[str], layers: set[str]):
        super().__init__()
        self.leaves = leaves
        self.layers = layers
        self.stack: list[tuple[str, str]] = []

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if qualname in self.layers or qualname in self.leaves or type(m).__name__ in self.leaves:
            return True
        return super().is_leaf_module(m, qualname)

    def call_module(self, m, forward, args, kwargs):
        qualname = self.path_of_module(m)
        self.stack.append((qualname, type(m).__name__))
        out = super().call_module(m, forward, args, kwargs)
        self.stack.pop()
        return out


def _untraceable(module: nn.Module, tracer: _Tracer, exc: Exception,
                 granularity: Granularity) -> UntraceableModel:
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if len(reason) > 160:
        reason = reason[:157] + "..."
    inner = [(q, c) for q, c in tracer.stack if q]
    if not inner:
        where = f"in {type(module).__name__}.forward itself"
        hint = ("no granularity avoids it: make forward() free of data-dependent Python "
                "control flow, or wrap that part in a submodule and pass --leaf NAME")
    else:
        qualname, cls = inner[-1]
        where = f"in module {qualname!r} ({cls})"
        layer = next((q for q, _ in inner if q in layer_modules(module)), None)
        if granularity is Granularity.OP and layer is not None:
            hint = f"rerun with --granularity layer (traces {layer!r} as one op) or --leaf {qualname}"
        else:
            hint = f"rerun with --leaf {qualname} to trace that module as one opaque op"
    return UntraceableModel(f"cannot capture the model with torch.fx: {reason} ({where}); {hint}")


def _node_module(node: fx.Node) -> str:
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        last = list(stack.values())[-1]
        path = last[0] if isinstance(last, tuple) else last
        return str(path)
    return ""


def _op_groups(gm: fx.GraphModule) -> dict[str, list[fx.Node]]:
    groups: dict[str, list[fx.Node]] = {}
    pending_attrs: dict[fx.Node, None] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        if node.op == "get_attr":
            pending_attrs[node] = None
            continue
        groups[node.name] = [node]
    # A get_attr joins its first user's op, placed before it to keep graph order.
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for attr in pending_attrs:
        users = sorted((u for u in attr.users if u.op != "output"), key=order.__getitem__)
        if not users:
            continue
        owner = users[0].name if users[0].name in groups else None
        if owner is None:  # a get_attr consumed by another get_attr does not happen in fx
            continue
        groups[owner].insert(0, attr)
    for nodes in groups.values():
        nodes.sort(key=order.__getitem__)
    return groups


def _is_layer_call(node: fx.Node, gm: fx.GraphModule, layers: set[str]) -> bool:
    if node.op != "call_module" or str(node.target) not in layers:
        return False
    sub = gm.get_submodule(str(node.target))
    return any(True for _ in sub.parameters()) or not _is_elementwise_module(sub)


def _is_elementwise_module(module: nn.Module) -> bool:
    """Parameter-free modules that are merged into a neighbouring layer."""
    return not any(True for _ in module.parameters()) and not any(True for _ in module.buffers())


def _layer_groups(gm: fx.GraphModule, layers: set[str]) -> dict[str, list[fx.Node]]:
    groups: dict[str, list[fx.Node]] = {}
    pending: list[fx.Node] = []
    current: str | None = None
    calls: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        if node.op == "placeholder":
            groups[node.name] = [node]
            continue
        if _is_layer_call(node, gm, layers):
            target = str(node.target)
            calls[target] = calls.get(target, 0) + 1
            current = target if calls[target] == 1 else f"{target}@{calls[target]}"
            groups[current] = [*pending, node]
            pending = []
        elif current is None:
            pending.append(node)
        else:
            groups[current].append(node)
    if pending:  # a model without any layer: one op holding every node
        groups[type(gm).__name__] = pending
    return groups
