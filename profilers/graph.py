"""Assembling ``Op`` and ``Edge`` records from a capture, its counts and its timings.

Per op:
    ``kind`` from the module class or function it calls (a layer of several
    kinds is a ``block``); ``flops``/``bwd_flops``/``bytes_accessed`` as counted
    by ``CostCounter`` over the whole batch; ``params`` the parameter tensors
    the op owns (a tensor used by several ops, such as a tied embedding, is
    owned by the first op that uses it, so every parameter is owned exactly
    once) and ``param_bytes`` their size; ``shared_params`` the tensors it
    uses that an earlier op owns, with their bytes (so a device running it holds
    a copy to keep in sync); ``output_bytes`` the activation bytes
    the op keeps alive until its backward (inputs: the input tensor);
    ``splittable_dims`` the output dimensions the op can be cut along: the
    batch dimension when the output has one, plus the output channel (conv) or
    feature (linear) dimension of ops with such weights.
Per edge:
    ``bytes`` of the tensors flowing from one op to another (each producer
    value counted once per consuming op); 0 for non-tensor values (sizes).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import fx, nn

from dl_nfv.artifacts import Edge, Granularity, Op, OpKind

from .capture import Capture, node_parameters

_MODULE_KINDS: tuple[tuple[type, OpKind], ...] = (
    (nn.modules.conv._ConvNd, OpKind.CONV),
    (nn.Linear, OpKind.MATMUL), (nn.Bilinear, OpKind.MATMUL),
    (nn.MultiheadAttention, OpKind.ATTENTION),
    (nn.modules.batchnorm._NormBase, OpKind.NORM), (nn.LayerNorm, OpKind.NORM),
    (nn.GroupNorm, OpKind.NORM), (getattr(nn, "RMSNorm", nn.LayerNorm), OpKind.NORM),
    (nn.Embedding, OpKind.EMBEDDING), (nn.EmbeddingBag, OpKind.EMBEDDING),
    (nn.RNNBase, OpKind.RNN), (nn.RNNCellBase, OpKind.RNN),
    (nn.modules.pooling._MaxPoolNd, OpKind.POOL), (nn.modules.pooling._AvgPoolNd, OpKind.POOL),
    (nn.modules.pooling._AdaptiveAvgPoolNd, OpKind.POOL),
    (nn.modules.pooling._AdaptiveMaxPoolNd, OpKind.POOL),
    (nn.modules.dropout._DropoutNd, OpKind.ELEMENTWISE),
    (nn.ReLU, OpKind.ACTIVATION), (nn.ReLU6, OpKind.ACTIVATION), (nn.GELU, OpKind.ACTIVATION),
    (nn.SiLU, OpKind.ACTIVATION), (nn.Tanh, OpKind.ACTIVATION), (nn.Sigmoid, OpKind.ACTIVATION),
    (nn.Softmax, OpKind.ACTIVATION), (nn.LeakyReLU, OpKind.ACTIVATION), (nn.ELU, OpKind.ACTIVATION),
    (nn.Hardswish, OpKind.ACTIVATION), (nn.Mish, OpKind.ACTIVATION),
    (nn.Flatten, OpKind.SHAPE), (nn.Identity, OpKind.SHAPE),
    (nn.modules.loss._Loss, OpKind.LOSS),
)

_FUNCTION_KINDS: dict[str, OpKind] = {
    **dict.fromkeys(("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                     "conv_transpose3d"), OpKind.CONV),
    **dict.fromkeys(("linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "bilinear",
                     "__matmul__"), OpKind.MATMUL),
    **dict.fromkeys(("scaled_dot_product_attention", "multi_head_attention_forward"),
                    OpKind.ATTENTION),
    **dict.fromkeys(("layer_norm", "batch_norm", "group_norm", "instance_norm", "rms_norm",
                     "normalize"), OpKind.NORM),
    **dict.fromkeys(("relu", "relu_", "relu6", "gelu", "silu", "tanh", "sigmoid", "softmax",
                     "log_softmax", "leaky_relu", "elu", "hardswish", "mish", "softplus"),
                    OpKind.ACTIVATION),
    **dict.fromkeys(("max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d",
                     "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                     "adaptive_max_pool2d"), OpKind.POOL),
    **dict.fromkeys(("embedding", "embedding_bag"), OpKind.EMBEDDING),
    **dict.fromkeys(("add", "sub", "mul", "truediv", "div", "neg", "pow", "exp", "log", "sqrt",
                     "rsqrt", "abs", "where", "clamp", "dropout", "iadd", "imul", "__add__",
                     "__mul__", "__sub__", "__truediv__", "masked_fill", "float", "to", "type_as",
                     "zeros_like", "ones_like"), OpKind.ELEMENTWISE),
    **dict.fromkeys(("sum", "mean", "amax", "max", "min", "norm", "var", "std", "argmax",
                     "logsumexp", "cumsum"), OpKind.REDUCTION),
    **dict.fromkeys(("view", "reshape", "permute", "transpose", "flatten", "unflatten", "squeeze",
                     "unsqueeze", "contiguous", "size", "getitem", "getattr", "split", "chunk",
                     "cat", "stack", "expand", "expand_as", "repeat", "narrow", "t", "unbind",
                     "arange", "select", "index_select", "gather"), OpKind.SHAPE),
    **dict.fromkeys(("cross_entropy", "nll_loss", "mse_loss", "l1_loss",
                     "binary_cross_entropy_with_logits"), OpKind.LOSS),
}


def target_name(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    target = node.target
    return getattr(target, "__name__", None) or str(target).rsplit(".", 1)[-1]


def node_kind(node: fx.Node, gm: fx.GraphModule) -> OpKind:
    if node.op == "placeholder":
        return OpKind.INPUT
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        for cls, kind in _MODULE_KINDS:
            if isinstance(module, cls):
                return kind
        return OpKind.BLOCK
    if node.op in ("call_function", "call_method"):
        return _FUNCTION_KINDS.get(target_name(node), OpKind.OTHER)
    return OpKind.OTHER


def _op_kind_and_name(nodes: list[fx.Node], gm: fx.GraphModule,
                      granularity: Granularity) -> tuple[OpKind, str]:
    compute = [n for n in nodes if n.op != "get_attr"]
    first = compute[0]
    if first.op == "placeholder":
        return OpKind.INPUT, first.name
    if granularity is Granularity.OP:
        if first.op == "call_module":
            return node_kind(first, gm), type(gm.get_submodule(str(first.target))).__name__
        return node_kind(first, gm), target_name(first)
    layers = [n for n in compute if n.op == "call_module"]
    head = layers[0] if layers else compute[0]
    kind = node_kind(head, gm)
    name = (type(gm.get_submodule(str(head.target))).__name__ if head.op == "call_module"
            else target_name(head))
    if len(compute) > 1:
        name += f" +{len(compute) - 1}"
    return kind, name


def _owned_params(capture: Capture) -> tuple[dict[str, list[tuple[str, torch.Tensor]]],
                                             dict[str, dict[str, int]]]:
    """Parameters each op owns (the first op, in graph order, to use a tensor owns it),
    and per op the parameters it uses that another op owns (tied weights: name -> bytes)."""
    gm = capture.graph_module
    canonical: dict[int, str] = {}
    for name, p in gm.named_parameters(remove_duplicate=False):
        canonical.setdefault(id(p), name)
    owned: dict[str, list[tuple[str, torch.Tensor]]] = defaultdict(list)
    shared: dict[str, dict[str, int]] = defaultdict(dict)
    owner: dict[int, str] = {}
    for op in capture.op_ids:
        for node in capture.nodes(op):
            for p in node_parameters(gm, node):
                name = canonical.get(id(p), str(node.target))
                if id(p) not in owner:
                    owner[id(p)] = op
                    owned[op].append((name, p))
                elif owner[id(p)] != op:
                    shared[op][name] = p.numel() * p.element_size()
    return owned, shared


def _splittable(nodes: list[fx.Node], gm: fx.GraphModule, shape: tuple[int, ...] | None,
                batch_size: int, kind: OpKind, granularity: Granularity) -> tuple[int, ...]:
    if shape is None or not shape or shape[0] != batch_size:
        return ()
    dims = [0]
    if granularity is Granularity.OP and len(shape) >= 2:
        if kind is OpKind.CONV:
            dims.append(1)
        elif kind is OpKind.MATMUL and any(n.op == "call_module" for n in nodes):
            dims.append(len(shape) - 1)
    return tuple(dims)


def build_ops(capture: Capture, counter, value_meta: dict, fwd_ms: dict, bwd_ms: dict,
              device_type: str, batch_size: int, fixed_ms: dict | None = None,
              tie_ms: dict | None = None, input_flops: dict | None = None
              ) -> tuple[tuple[Op, ...], tuple[Edge, ...]]:
    """``Op`` records (graph order) and ``Edge`` records of a profiled capture.

    ``fixed_ms`` maps op ids to their measured (forward, backward) batch-independent ms,
    each at most the op's time (rounding keeps that order); ``tie_ms`` the owners of tied
    weights to the ms of their backward that sums the weights' gradients; ``input_flops``
    op ids to the backward FLOPs that compute input gradients (``bwd_input_flops``, at most
    ``bwd_flops``).
    """
    fixed_ms = fixed_ms or {}
    tie_ms = tie_ms or {}
    gm = capture.graph_module
    owned, shared = _owned_params(capture)
    ops = []
    for op_id in capture.op_ids:
        nodes = capture.nodes(op_id)
        kind, name = _op_kind_and_name(nodes, gm, capture.granularity)
        last = [n for n in nodes if n.op != "get_attr"][-1]
        out_bytes, shape = value_meta.get(last.name, (0, None))
        params = owned.get(op_id, [])
        if kind is OpKind.INPUT:
            activation = out_bytes
        else:
            activation = int(counter.activation_bytes.get(op_id, 0))
        module = ",".join(capture.modules_of[op_id]) or _enclosing_module(nodes)
        timed = kind is not OpKind.INPUT
        fixed = fixed_ms.get(op_id) if timed else None
        ops.append(Op(
            id=op_id, name=name, kind=kind,
            flops=float(counter.flops.get(op_id, 0.0)),
            bwd_flops=float(counter.bwd_flops.get(op_id, 0.0)),
            bwd_input_flops=(min(float(input_flops.get(op_id, 0.0)), float(counter.bwd_flops.get(op_id, 0.0)))
                             if input_flops is not None and timed else None),
            bytes_accessed=float(counter.bytes_accessed.get(op_id, 0.0)),
            param_bytes=sum(p.numel() * p.element_size() for _, p in params),
            output_bytes=activation,
            params=tuple(n for n, _ in params),
            shared_params=dict(shared.get(op_id, {})),
            fwd_ms={device_type: round(fwd_ms.get(op_id, 0.0), 6)} if timed else {},
            bwd_ms={device_type: round(bwd_ms.get(op_id, 0.0), 6)} if timed else {},
            fwd_fixed_ms={device_type: round(fixed[0], 6)} if fixed else {},
            bwd_fixed_ms={device_type: round(fixed[1], 6)} if fixed else {},
            tie_sum_ms=({device_type: round(min(tie_ms[op_id], bwd_ms.get(op_id, 0.0)), 6)}
                        if timed and op_id in tie_ms else {}),
            splittable_dims=_splittable(nodes, gm, shape, batch_size, kind, capture.granularity),
            module=module,
        ))
    return tuple(ops), build_edges(capture, value_meta)


def _enclosing_module(nodes: list[fx.Node]) -> str:
    for node in nodes:
        stack = node.meta.get("nn_module_stack") or {}
        if stack:
            last = list(stack.values())[-1]
            return str(last[0] if isinstance(last, tuple) else last)
    return ""


def build_edges(capture: Capture, value_meta: dict) -> tuple[Edge, ...]:
    """Edges between ops, in graph order of their consumer, with tensor bytes."""
    edges: dict[tuple[str, str], int] = {}
    counted: set[tuple[str, str]] = set()
    for op_id in capture.op_ids:
        for node in capture.nodes(op_id):
            for producer in node.all_input_nodes:
                if producer.op == "get_attr":
                    continue
                src = capture.op_of[producer.name]
                if src == op_id:
                    continue
                key = (src, op_id)
                edges.setdefault(key, 0)
                if (producer.name, op_id) not in counted:
                    counted.add((producer.name, op_id))
                    edges[key] += value_meta.get(producer.name, (0, None))[0]
    return tuple(Edge(src=s, dst=d, bytes=b) for (s, d), b in edges.items())
