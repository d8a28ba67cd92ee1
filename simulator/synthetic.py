"""Synthetic op graphs, clusters and schedules with real layer shapes, for benchmarks and tests.

These build ``op-graph`` records from the published architectures' shapes
(FLOPs, bytes, parameters of every layer computed from its dimensions) without
running PyTorch, so the simulator can be measured on full-size models quickly.
Op times are left unmeasured: the cost model estimates them by roofline with
its default efficiencies. Real profiles come from ``dl-nfv profile model``.
"""

from __future__ import annotations

from dl_nfv.artifacts import (
    Action,
    Edge,
    ModelRef,
    Op,
    OpGraph,
    OpKind,
    Topology,
    format_schedule,
    from_data,
)

F32 = 4


class _Builder:
    def __init__(self):
        self.ops: list[Op] = []
        self.edges: list[Edge] = []

    def op(self, op_id: str, kind: OpKind, inputs: list[tuple[str, int]], *, flops: float = 0.0,
           params: int = 0, out_bytes: int = 0, bytes_accessed: float | None = None,
           bwd_flops: float = 0.0) -> str:
        moved = bytes_accessed if bytes_accessed is not None else \
            out_bytes + params + sum(b for _, b in inputs)
        self.ops.append(Op(id=op_id, name=op_id, kind=kind, flops=float(flops),
                           bwd_flops=float(bwd_flops), bytes_accessed=float(moved),
                           param_bytes=int(params), output_bytes=int(out_bytes)))
        for src, nbytes in inputs:
            self.edges.append(Edge(src=src, dst=op_id, bytes=int(nbytes)))
        return op_id

    def graph(self, name: str, batch_size: int, **options) -> OpGraph:
        return OpGraph(model=ModelRef(name=name, source="synthetic", batch_size=batch_size,
                                      options=options), ops=tuple(self.ops),
                       edges=tuple(self.edges))


def resnet50(batch_size: int = 32, image: int = 224) -> OpGraph:
    """ResNet-50 (He et al. 2016, 25.6 M parameters) at op granularity: conv, bn, relu, add, ..."""
    b = _Builder()
    x_bytes = batch_size * 3 * image * image * F32
    cur, c, h = b.op("x", OpKind.INPUT, [], out_bytes=x_bytes), 3, image
    cur_bytes = x_bytes

    def conv(name, src, src_bytes, cin, cout, k, stride, hin):
        hout = hin // stride
        out = batch_size * cout * hout * hout * F32
        flops = 2 * cin * cout * k * k * hout * hout * batch_size
        b.op(name, OpKind.CONV, [(src, src_bytes)], flops=flops, params=cin * cout * k * k * F32,
             out_bytes=out)
        return name, out, hout

    def bn_relu(name, src, nbytes, channels, relu=True):
        b.op(f"{name}_bn", OpKind.NORM, [(src, nbytes)], flops=5 * nbytes / F32,
             params=2 * channels * F32, out_bytes=nbytes)
        if not relu:
            return f"{name}_bn"
        b.op(f"{name}_relu", OpKind.ACTIVATION, [(f"{name}_bn", nbytes)], flops=nbytes / F32,
             out_bytes=nbytes)
        return f"{name}_relu"

    cur, cur_bytes, h = conv("conv1", cur, cur_bytes, 3, 64, 7, 2, h)
    cur = bn_relu("stem", cur, cur_bytes, 64)
    h //= 2
    pooled = batch_size * 64 * h * h * F32
    cur = b.op("maxpool", OpKind.POOL, [(cur, cur_bytes)], flops=9 * pooled / F32, out_bytes=pooled)
    cur_bytes, c = pooled, 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for k in range(blocks):
            name = f"layer{stage}_{k}"
            stride = 2 if (k == 0 and stage > 1) else 1
            inp, inp_bytes, hin = cur, cur_bytes, h
            y, yb, h1 = conv(f"{name}_conv1", inp, inp_bytes, c, width, 1, 1, hin)
            y = bn_relu(f"{name}_1", y, yb, width)
            y, yb, h2 = conv(f"{name}_conv2", y, yb, width, width, 3, stride, h1)
            y = bn_relu(f"{name}_2", y, yb, width)
            y, yb, h3 = conv(f"{name}_conv3", y, yb, width, 4 * width, 1, 1, h2)
            y = bn_relu(f"{name}_3", y, yb, 4 * width, relu=False)
            if k == 0:
                s, sb, _ = conv(f"{name}_down", inp, inp_bytes, c, 4 * width, 1, stride, hin)
                s = bn_relu(f"{name}_down", s, sb, 4 * width, relu=False)
            else:
                s, sb = inp, inp_bytes
            add = b.op(f"{name}_add", OpKind.ELEMENTWISE, [(y, yb), (s, sb)], flops=yb / F32,
                       out_bytes=yb)
            cur = b.op(f"{name}_relu", OpKind.ACTIVATION, [(add, yb)], flops=yb / F32, out_bytes=yb)
            cur_bytes, c, h = yb, 4 * width, h3
    feat = batch_size * c * F32
    cur = b.op("avgpool", OpKind.POOL, [(cur, cur_bytes)], flops=cur_bytes / F32, out_bytes=feat)
    logits = batch_size * 1000 * F32
    cur = b.op("fc", OpKind.MATMUL, [(cur, feat)], flops=2 * batch_size * c * 1000,
               params=(c * 1000 + 1000) * F32, out_bytes=logits)
    b.op("loss", OpKind.LOSS, [(cur, logits)], flops=3 * logits / F32, out_bytes=F32)
    return b.graph("resnet50", batch_size, image=image)


def gpt2(layers: int = 48, d_model: int = 1600, heads: int = 25, vocab: int = 50257,
         seq_len: int = 1024, batch_size: int = 32, name: str = "gpt2-xl") -> OpGraph:
    """GPT-2 (Radford et al. 2019; XL: 48 layers, d 1600, 1.5 B parameters), ten ops per block."""
    b = _Builder()
    tokens = batch_size * seq_len
    act = tokens * d_model * F32
    cur = b.op("tokens", OpKind.INPUT, [], out_bytes=tokens * 8)
    cur = b.op("embed", OpKind.EMBEDDING, [(cur, tokens * 8)], flops=tokens * d_model,
               params=(vocab + seq_len) * d_model * F32, out_bytes=act, bytes_accessed=2 * act)
    for i in range(layers):
        p = f"h{i}"
        ln1 = b.op(f"{p}_ln1", OpKind.NORM, [(cur, act)], flops=8 * tokens * d_model,
                   params=2 * d_model * F32, out_bytes=act)
        qkv = b.op(f"{p}_qkv", OpKind.MATMUL, [(ln1, act)], flops=2 * tokens * d_model * 3 * d_model,
                   params=(3 * d_model * d_model + 3 * d_model) * F32, out_bytes=3 * act)
        attn_flops = 4 * batch_size * seq_len * seq_len * d_model
        attn = b.op(f"{p}_attn", OpKind.ATTENTION, [(qkv, 3 * act)], flops=attn_flops,
                    out_bytes=act, bytes_accessed=4 * act + batch_size * heads * seq_len * seq_len * F32)
        proj = b.op(f"{p}_proj", OpKind.MATMUL, [(attn, act)], flops=2 * tokens * d_model * d_model,
                    params=(d_model * d_model + d_model) * F32, out_bytes=act)
        add1 = b.op(f"{p}_add1", OpKind.ELEMENTWISE, [(proj, act), (cur, act)], flops=tokens * d_model,
                    out_bytes=act)
        ln2 = b.op(f"{p}_ln2", OpKind.NORM, [(add1, act)], flops=8 * tokens * d_model,
                   params=2 * d_model * F32, out_bytes=act)
        fc = b.op(f"{p}_fc", OpKind.MATMUL, [(ln2, act)], flops=2 * tokens * d_model * 4 * d_model,
                  params=(4 * d_model * d_model + 4 * d_model) * F32, out_bytes=4 * act)
        gelu = b.op(f"{p}_gelu", OpKind.ACTIVATION, [(fc, 4 * act)], flops=8 * tokens * 4 * d_model,
                    out_bytes=4 * act)
        mlp = b.op(f"{p}_mlp", OpKind.MATMUL, [(gelu, 4 * act)], flops=2 * tokens * 4 * d_model * d_model,
                   params=(4 * d_model * d_model + d_model) * F32, out_bytes=act)
        cur = b.op(f"{p}_add2", OpKind.ELEMENTWISE, [(mlp, act), (add1, act)], flops=tokens * d_model,
                   out_bytes=act)
    cur = b.op("ln_f", OpKind.NORM, [(cur, act)], flops=8 * tokens * d_model,
               params=2 * d_model * F32, out_bytes=act)
    logits = tokens * vocab * F32
    cur = b.op("head", OpKind.MATMUL, [(cur, act)], flops=2 * tokens * d_model * vocab,
               out_bytes=logits)  # weights tied to the embedding
    b.op("loss", OpKind.LOSS, [(cur, logits)], flops=4 * tokens * vocab, out_bytes=F32)
    return b.graph(name, batch_size, seq_len=seq_len)


def cluster(hosts: int, per_host: int, *, device_type: str = "V100-32GB", nvlink_gbps: float = 200,
            nic_gbps: float = 100, name: str | None = None) -> Topology:
    """``hosts`` hosts of ``per_host`` NVLink-meshed GPUs, one NIC each to one switch."""
    doc = {
        "name": name or f"{hosts}x{per_host}-{device_type}",
        "hosts": [{"name": f"h{i}", "devices": [{"type": device_type, "count": per_host}],
                   "interconnect": {"kind": "nvlink", "bandwidth_gbps": nvlink_gbps,
                                    "latency_us": 1},
                   **({"nics": [{"switch": "tor", "bandwidth_gbps": nic_gbps, "latency_us": 5}]}
                      if hosts > 1 else {})}
                  for i in range(hosts)],
        "switches": [{"name": "tor"}] if hosts > 1 else [],
    }
    return from_data(Topology, doc)


def one_f_one_b(stages: int, microbatches: int, stage: int) -> str:
    """The 1F1B schedule of ``stage`` (PipeDream-Flush): warm-up forwards, then F/B pairs, then Bs."""
    warmup = min(stages - stage - 1, microbatches)
    acts = [Action(stage, "F", m) for m in range(warmup)]
    f, bw = warmup, 0
    while f < microbatches:
        acts.append(Action(stage, "F", f))
        f += 1
        acts.append(Action(stage, "B", bw))
        bw += 1
    acts.extend(Action(stage, "B", m) for m in range(bw, microbatches))
    return format_schedule(acts)


def gpipe(stage: int, microbatches: int) -> str:
    """The GPipe schedule of ``stage``: every forward, then every backward."""
    return format_schedule([Action(stage, "F", m) for m in range(microbatches)]
                           + [Action(stage, "B", m) for m in range(microbatches)])
