"""DisCo's learned estimator of fused-kernel time: a GNN over a fused group's ops.

Model. A fused group (a compiled region) costs, per phase (forward, backward),

    fused_ms = per_call_ms + ratio x sum_ms

where ``sum_ms`` is the sum of its ops' times (the cost model's ``op_ms``, unfused),
``per_call_ms`` the fixed cost of calling a compiled region, measured by ``dl-nfv
profile fusion`` on the machine the measurements come from and charged on devices of
that type only, and ``ratio`` what generated code makes of the ops' work. The network
predicts ``log ratio`` for both phases from the group:

* per op (a node): the kind one-hot (``OpKind`` order), ``log1p`` of forward and
  backward MFLOPs and of the MiB accessed, output and held as parameters, the op's share
  of the group's forward and backward time (from the op graph's profile), and its
  position in the group;
* per edge inside the group, both directions: ``log1p`` of its MiB;
* per group: ``log1p`` of the op count, of the MiB that stay inside the kernel, and of
  ``sum_ms`` forward and backward (small kernels gain more from fusion).

Node and group features are standardised by the training groups' means and spreads. A
prediction is clamped to the 5th-95th percentiles of ``log ratio`` over the training
groups whose eager time is at least the per-call cost: groups larger or of other shapes
than any measured one get a measured ratio, not an extrapolation.

Two graph-attention layers (``torch_geometric.nn.GATConv`` with edge features, as
``planners/learned/encoder.py``) with residual connections, mean and max pooling, the
group features, and an MLP to the two outputs, whose bias starts at the training groups'
median ``log ratio``. Trained by full-batch AdamW (weight decay ``WEIGHT_DECAY``) on a
Huber loss of ``log ratio`` over ``fusion-times`` files (``dl-nfv profile fusion``), the
target being ``max(fused - per_call, 1% of eager) / eager`` of each measured group and
its weight ``eager / (eager + per_call)`` (a group that is mostly its call says little
about the ratio). Measurements are few and noisy: the weight decay, the small network
and the few epochs (``EPOCHS``) were chosen by the error on models left out of training.

The trained network is a ``policy`` artifact (planner ``disco``; the per-call costs are
buffers among its weights, the device type they were measured on is in its
architecture). ``FusedEstimator`` serves ``CostModel.fused_estimator``, memoising each
(group, device type, phase, batch share).

Limits: trained on the machine and thread count of its measurements; on a device type
the measurements were not taken on, the ratio is applied without the per-call cost (a
GPU's launch cost is the cost model's own). A group of one op is never asked.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GATConv, global_max_pool, global_mean_pool

from dl_nfv.artifacts import BadInput, OpKind
from dl_nfv.artifacts.policy import TrainedOn

MIB = 2**20
KINDS = tuple(OpKind)
NODE_FEATURES = len(KINDS) + 5 + 3
GROUP_FEATURES = 4
PLANNER = "disco"
ARCHITECTURE = {"hidden": 16, "layers": 2, "heads": 2, "device_type": "cpu"}
WEIGHT_DECAY = 0.1
EPOCHS = 60  # with the weight decay, chosen by leave-one-model-out error (docs/planners/disco.md)
HUBER_DELTA = 0.25  # in log ratio: squared error within 25%, absolute beyond (outliers)


@dataclass(frozen=True, slots=True)
class GroupOps:
    """What the estimator reads of one group: per op (kind, MFLOPs fwd/bwd, bytes accessed,
    output and parameter bytes, graph fwd/bwd ms), the edges inside (index pairs, bytes),
    and the unfused sum of its ops' forward and backward ms where it is priced."""

    kinds: tuple[OpKind, ...]
    figures: tuple[tuple[float, ...], ...]  # per op: flops, bwd_flops, bytes, out, param, fwd, bwd
    edges: tuple[tuple[int, int, float], ...]
    sum_fwd_ms: float
    sum_bwd_ms: float


def group_data(g: GroupOps) -> Data:
    """The group as a ``torch_geometric`` graph with features (module docstring)."""
    n = len(g.kinds)
    x = np.zeros((n, NODE_FEATURES), dtype=np.float32)
    figs = np.array(g.figures, dtype=np.float64).reshape(n, 7)
    for i, kind in enumerate(g.kinds):
        x[i, KINDS.index(kind)] = 1.0
    k = len(KINDS)
    x[:, k] = np.log1p(figs[:, 0] / 1e6)
    x[:, k + 1] = np.log1p(figs[:, 1] / 1e6)
    x[:, k + 2:k + 5] = np.log1p(figs[:, 2:5] / MIB)
    for j, col in ((k + 5, 5), (k + 6, 6)):
        total = figs[:, col].sum()
        x[:, j] = figs[:, col] / total if total > 0 else 1.0 / n
    x[:, k + 7] = np.arange(n) / max(n - 1, 1)
    src = [s for s, d, _ in g.edges] + [d for s, d, _ in g.edges]
    dst = [d for s, d, _ in g.edges] + [s for s, d, _ in g.edges]
    attr = [math.log1p(b / MIB) for _, _, b in g.edges] * 2
    inside = sum(b for _, _, b in g.edges)
    group = [math.log1p(n), math.log1p(inside / MIB), math.log1p(g.sum_fwd_ms),
             math.log1p(g.sum_bwd_ms)]
    return Data(x=torch.from_numpy(x), edge_index=torch.tensor([src, dst], dtype=torch.long).reshape(2, -1),
                edge_attr=torch.tensor(attr, dtype=torch.float32).reshape(-1, 1),
                group=torch.tensor([group], dtype=torch.float32))


class FusedGroupNet(nn.Module):
    """``log ratio`` (forward, backward) of fused groups (module docstring).

    ``per_call_ms`` (a buffer: forward, backward) is the measured per-call cost of a
    compiled region on ``device_type``."""

    def __init__(self, *, hidden: int = 16, layers: int = 2, heads: int = 2,
                 device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type
        self.embed = nn.Sequential(nn.Linear(NODE_FEATURES, hidden), nn.ReLU(),
                                   nn.Linear(hidden, hidden))
        self.convs = nn.ModuleList(GATConv(hidden, hidden // heads, heads=heads, edge_dim=1)
                                   for _ in range(layers))
        self.head = nn.Sequential(nn.Linear(2 * hidden + GROUP_FEATURES, hidden), nn.ReLU(),
                                  nn.Linear(hidden, 2))
        self.register_buffer("per_call_ms", torch.zeros(2))
        # the 5th and 95th percentiles of the log ratio (forward, backward) of the training
        # groups whose eager time is at least the per-call cost: a prediction is clamped to
        # them, never extrapolated past what was measured
        self.register_buffer("log_ratio_low", torch.zeros(2))
        self.register_buffer("log_ratio_high", torch.zeros(2))
        # the training groups' feature means and spreads: features enter standardised
        self.register_buffer("node_shift", torch.zeros(NODE_FEATURES))
        self.register_buffer("node_scale", torch.ones(NODE_FEATURES))
        self.register_buffer("group_shift", torch.zeros(GROUP_FEATURES))
        self.register_buffer("group_scale", torch.ones(GROUP_FEATURES))

    def forward(self, batch: Batch) -> torch.Tensor:
        h = self.embed((batch.x - self.node_shift) / self.node_scale)
        for conv in self.convs:
            h = h + torch.relu(conv(h, batch.edge_index, batch.edge_attr))
        group = (batch.group - self.group_shift) / self.group_scale
        pooled = torch.cat([global_mean_pool(h, batch.batch), global_max_pool(h, batch.batch),
                            group], dim=1)
        return self.head(pooled)

    def standardise(self, batch: Batch) -> None:
        """Set the feature shifts and scales to ``batch``'s means and spreads (a constant
        feature is left unscaled)."""
        for data, shift, scale in ((batch.x, self.node_shift, self.node_scale),
                                   (batch.group, self.group_shift, self.group_scale)):
            std = data.std(dim=0) if data.shape[0] > 1 else torch.zeros(data.shape[1])
            shift.copy_(data.mean(dim=0))
            scale.copy_(torch.where(std > 1e-6, std, torch.ones_like(std)))


def measured_groups(times) -> list[tuple[GroupOps, tuple[float, float], tuple[float, float]]]:
    """Of a ``fusion-times`` record: per group its ``GroupOps`` (priced at its measured eager
    time), the measured (eager, fused) forward ms and backward ms."""
    out = []
    for g in times.groups:
        ops = GroupOps(kinds=tuple(op.kind for op in g.ops),
                       figures=tuple((op.flops, op.bwd_flops, op.bytes_accessed, op.output_bytes,
                                      op.param_bytes, op.fwd_ms, op.bwd_ms) for op in g.ops),
                       edges=tuple((s, d, float(b)) for s, d, b in g.edges),
                       sum_fwd_ms=g.eager_fwd_ms, sum_bwd_ms=g.eager_bwd_ms)
        out.append((ops, (g.eager_fwd_ms, g.fused_fwd_ms), (g.eager_bwd_ms, g.fused_bwd_ms)))
    return out


def _target(eager: float, fused: float, per_call: float) -> float:
    eager = max(eager, 1e-6)
    return math.log(max(fused - per_call, 0.01 * eager) / eager)


def train(measurements: Sequence, *, seed: int = 0, epochs: int = EPOCHS, lr: float = 3e-3,
          architecture: dict | None = None) -> FusedGroupNet:
    """A ``FusedGroupNet`` trained on ``fusion-times`` records (module docstring). The
    per-call costs are the mean of the records' (all must come from one device type).

    Raises ``BadInput`` when the records hold no group or mix device types. Deterministic
    for a seed (full-batch Adam, one thread's float order). O(epochs x groups x ops)."""
    types = sorted({t.device_type for t in measurements})
    if len(types) != 1:
        raise BadInput(f"plan learn disco: the measurements come from device types {types}; "
                       f"train one estimator per device type")
    rows = [row for t in measurements for row in measured_groups(t)]
    if not rows:
        raise BadInput("plan learn disco: the measurements hold no measured group")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # small graphs: threads only add synchronisation
    try:
        return _fit(measurements, rows, types[0], seed=seed, epochs=epochs, lr=lr,
                    architecture=architecture)
    finally:
        torch.set_num_threads(previous)


def _fit(measurements, rows, device_type: str, *, seed: int, epochs: int, lr: float,
         architecture: dict | None) -> FusedGroupNet:
    torch.manual_seed(seed)
    random.seed(seed)
    net = FusedGroupNet(**{**ARCHITECTURE, **(architecture or {}), "device_type": device_type})
    per_call = (float(np.mean([t.per_call_fwd_ms for t in measurements])),
                float(np.mean([t.per_call_bwd_ms for t in measurements])))
    net.per_call_ms.copy_(torch.tensor(per_call))
    batch = Batch.from_data_list([group_data(ops) for ops, _, _ in rows])
    net.standardise(batch)
    y = torch.tensor([[_target(*f, per_call[0]), _target(*b, per_call[1])] for _, f, b in rows])
    # a group whose eager time is near the per-call cost says little about the ratio (its
    # fused time is mostly the call): its weight falls with the per-call share
    eager = torch.tensor([[f[0], b[0]] for _, f, b in rows])
    weight = eager / (eager + torch.tensor(per_call) + 1e-9)
    for k in range(2):  # the clamp: over the groups whose eager time is at least the call's
        sure = y[weight[:, k] >= 0.5, k] if bool((weight[:, k] >= 0.5).any()) else y[:, k]
        net.log_ratio_low[k] = torch.quantile(sure, 0.05)
        net.log_ratio_high[k] = torch.quantile(sure, 0.95)
    with torch.no_grad():  # start from the median ratio: the network learns the departures
        net.head[-1].bias.copy_(y.median(dim=0).values)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=WEIGHT_DECAY)
    for _ in range(epochs):
        opt.zero_grad()
        loss = (weight * nn.functional.huber_loss(net(batch), y, reduction="none",
                                                  delta=HUBER_DELTA)).sum() / weight.sum()
        loss.backward()
        opt.step()
    net.eval()
    return net


def predict_ms(net: FusedGroupNet, groups: Sequence[GroupOps], *, per_call: bool = True,
               ) -> np.ndarray:
    """``[groups, 2]`` predicted fused (forward, backward) ms of ``groups``."""
    with torch.no_grad():
        log_ratio = net(Batch.from_data_list([group_data(g) for g in groups]))
        ratio = torch.exp(torch.clamp(log_ratio, net.log_ratio_low, net.log_ratio_high)).numpy()
    sums = np.array([[g.sum_fwd_ms, g.sum_bwd_ms] for g in groups])
    fixed = net.per_call_ms.numpy()[None, :] if per_call else 0.0
    return fixed + ratio * sums


def errors(net: FusedGroupNet, measurements: Sequence, *, launch_ms: float,
           bandwidth_bytes_per_ms: float) -> dict[str, float]:
    """Median relative errors on the measured fused (forward + backward) ms of the
    records' groups: the estimator's, the sum of the ops' (no fusion) and the cost model's
    rule (``rule_ms``); with ``... p90`` the 90th percentiles."""
    rows = [row for t in measurements for row in measured_groups(t)]
    if not rows:
        raise BadInput("the measurements hold no measured group")
    measured = np.array([f[1] + b[1] for _, f, b in rows])
    eager = np.array([f[0] + b[0] for _, f, b in rows])
    out = {"groups": float(len(rows))}
    for name, pred in (("estimator", predict_ms(net, [ops for ops, _, _ in rows]).sum(axis=1)),
                       ("sum of ops", eager),
                       ("cost model rule", [rule_ms(ops, total, launch_ms, bandwidth_bytes_per_ms)
                                            for (ops, _, _), total in zip(rows, eager)])):
        err = np.abs(np.asarray(pred) - measured) / measured
        out[name], out[f"{name} p90"] = float(np.median(err)), float(np.quantile(err, 0.9))
    return out


def rule_ms(ops: GroupOps, eager_ms: float, launch_ms: float, bandwidth_bytes_per_ms: float) -> float:
    """The cost model's sum-of-ops rule on a group whose ops take ``eager_ms`` unfused: less
    a launch per op beyond the first and the round trip of every tensor inside, never below
    its slowest op (its share of the op graph's times)."""
    n = len(ops.kinds)
    inside = sum(nbytes for _, _, nbytes in ops.edges)
    times = np.array([fig[5] + fig[6] for fig in ops.figures])
    slowest = eager_ms * (times.max() / times.sum()) if times.sum() > 0 else eager_ms / n
    saved = 2 * (n - 1) * launch_ms + 2 * 2 * inside / bandwidth_bytes_per_ms
    return max(eager_ms - saved, slowest)


def device_figures(device_type: str) -> dict[str, float]:
    """The launch cost and memory bandwidth of ``device_type`` as ``errors`` takes them."""
    from dl_nfv.artifacts import lookup

    device = lookup(device_type)
    return {"launch_ms": device.launch_overhead_us / 1e3,
            "bandwidth_bytes_per_ms": device.memory_bandwidth_gb_per_s * 1e6}


def leave_one_model_out(by_model: dict[str, Sequence], *, seed: int = 0, epochs: int = EPOCHS,
                        ) -> dict[str, dict[str, float]]:
    """Per model: ``errors`` of an estimator trained on every other model's records
    (``by_model``: model name -> its ``fusion-times`` records), on that model's groups."""
    out = {}
    for held in by_model:
        rest = [t for name, records in by_model.items() if name != held for t in records]
        net = train(rest, seed=seed, epochs=epochs)
        out[held] = errors(net, by_model[held], **device_figures(net.device_type))
    return out


class FusedEstimator:
    """``CostModel.fused_estimator`` from a trained network: ``per_call + ratio x sum`` of
    the cost model's op times, memoised per (group, device type column, phase, share)."""

    def __init__(self, net: FusedGroupNet):
        self.net = net
        self._memo: dict = {}
        self._out_edges: dict[str, list[tuple[str, int]]] | None = None

    def __call__(self, cm, op_ids: Sequence[str], device: str, phase: str,
                 batch_fraction: float) -> float:
        column = cm.device_type_index[device]
        key = (tuple(op_ids), column, phase, batch_fraction)
        if key not in self._memo:
            self._memo[key] = self._estimate(cm, op_ids, device, phase, batch_fraction)
        return self._memo[key]

    def _estimate(self, cm, op_ids, device, phase, batch_fraction) -> float:
        index = cm.graph.index
        ref = cm.reference
        if self._out_edges is None:  # one estimator serves one cost model
            self._out_edges = {}
            for e in cm.graph.edges:
                self._out_edges.setdefault(e.src, []).append((e.dst, e.bytes))
        fwd = sum(cm.op_ms(o, device, "fwd", batch_fraction) for o in op_ids)
        bwd = sum(cm.op_ms(o, device, "bwd", batch_fraction) for o in op_ids)
        pos = {o: i for i, o in enumerate(op_ids)}
        ops = GroupOps(kinds=tuple(index[o].kind for o in op_ids),
                       figures=tuple((index[o].flops * batch_fraction,
                                      index[o].bwd_flops * batch_fraction,
                                      index[o].bytes_accessed * batch_fraction,
                                      index[o].output_bytes * batch_fraction, index[o].param_bytes,
                                      index[o].fwd_ms.get(ref, 0.0), index[o].bwd_ms.get(ref, 0.0))
                                     for o in op_ids),
                       edges=tuple((pos[s], pos[d], float(b) * batch_fraction) for s in op_ids
                                   for d, b in self._out_edges.get(s, ()) if d in pos),
                       sum_fwd_ms=fwd, sum_bwd_ms=bwd)
        charge = cm.device_types[cm.device_type_index[device]].name == self.net.device_type
        fwd_ms, bwd_ms = predict_ms(self.net, [ops], per_call=charge)[0]
        return float(fwd_ms if phase == "fwd" else bwd_ms)


def learn(measurements: Sequence, names: Sequence[str], *, held_out: Sequence = (),
          held_out_names: Sequence[str] = (), seed: int = 0, epochs: int = EPOCHS,
          command: str = ""):
    """Train the estimator on ``measurements`` (``fusion-times`` records of the models
    ``names``) and return its ``policy`` artifact; the median errors on ``held_out``
    records (other models) and on the training records are in its notes.

    Raises ``BadInput`` (``train``; held-out records of another device type)."""
    from ..learned.policy import policy_of

    net = train(measurements, seed=seed, epochs=epochs)
    figures = device_figures(net.device_type)
    notes = [_error_note("training groups", errors(net, measurements, **figures), names)]
    if held_out:
        if {t.device_type for t in held_out} != {net.device_type}:
            raise BadInput(f"plan learn disco: the held-out measurements are not all from "
                           f"device type {net.device_type!r}")
        notes.append(_error_note("held-out groups", errors(net, held_out, **figures),
                                 held_out_names))
    architecture = {**ARCHITECTURE, "device_type": net.device_type}
    return policy_of(net, planner=PLANNER, architecture=architecture,
                     trained_on=TrainedOn(graphs=tuple(names),
                                          episodes=sum(len(t.groups) for t in measurements)),
                     seed=seed, command=command, notes=tuple(notes))


def _error_note(what: str, e: dict[str, float], names: Sequence[str]) -> str:
    return (f"median error of fused forward+backward ms on {int(e['groups'])} {what} "
            f"({', '.join(names)}): estimator {100 * e['estimator']:.1f}%, sum of ops "
            f"{100 * e['sum of ops']:.1f}%, cost model rule {100 * e['cost model rule']:.1f}%")


def load_estimator(path) -> FusedEstimator:
    """The ``FusedEstimator`` of a policy file trained by ``plan learn disco``; ``BadInput``
    naming the file when it is not one."""
    from ..learned.policy import build_network, read_policy

    policy = read_policy(path)
    try:
        net = build_network(policy, FusedGroupNet, dict(ARCHITECTURE), planner=PLANNER)
    except BadInput as exc:
        raise BadInput(f"{path}: {exc}") from None
    return FusedEstimator(net)


def simulate_with_estimator(plan_path, estimator_path, *, graph=None, topology=None,
                            compare=None):
    """``simulator.files.simulate_files`` with the cost model's fused groups priced by the
    estimator at ``estimator_path`` (``dl-nfv simulate --estimator``): the plan's
    prediction as ``plan disco --estimator`` made it. The report's notes name the
    estimator. Raises what ``simulate_files`` raises, and ``BadInput`` for an estimator
    file that is not one."""
    from dataclasses import replace

    from dl_nfv.simulator import simulate
    from dl_nfv.simulator.costs import CostModel
    from dl_nfv.simulator.files import compare_with_run, extrapolation_notes, plan_artifacts

    estimator = load_estimator(estimator_path)
    plan, graph_doc, topology_doc, _, _ = plan_artifacts(plan_path, graph, topology)
    cm = CostModel(graph_doc, topology_doc)
    cm.fused_estimator = estimator
    result = simulate(plan, graph_doc, topology_doc, cost_model=cm, check_fingerprints=False)
    report = result.to_report()
    notes = (*extrapolation_notes(plan.devices, graph_doc, topology_doc),
             f"fused groups priced by the estimator {estimator_path}")
    report = replace(report, notes=(*report.notes, *notes))
    if compare is not None:
        report = compare_with_run(report, result, compare)
    return result, report
