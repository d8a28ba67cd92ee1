"""Featurisation: an op graph, its op groups and a cluster as tensors for a learned planner.

Every figure comes from the cost model (``simulator/costs.py``): op times per device
type, op bytes, device memory, and the affine cost of a transfer between two devices
(``CostModel.transfer_affine``); this module only takes logarithms and normalises.
Times and bytes span many orders of magnitude, so they enter as ``log1p`` of the
figure in a fixed unit (ms, MiB).

Schema (``FEATURE_SCHEMA_VERSION``; a policy trained on one schema refuses another):

Op features, ``[ops, OP_FEATURES]``, graph order
    ``log1p`` of forward+backward ms on the fastest and on the slowest device type of
    the cluster, ``log1p`` of output MiB and of parameter MiB, the op kind one-hot
    (``OpKind`` order), and depth (longest edge path from a source) over the graph's
    greatest depth, in [0, 1]. ``op_ms``: ``[ops, device types]`` forward+backward ms
    (the backward where it runs), raw.

Group features, ``[groups, GROUP_FEATURES]``
    Sums over the group's ops of the time and byte figures (then ``log1p``), the mean
    of the kind one-hot (a histogram), the mean depth, and ``log1p`` of the op count.
    ``group_device_ms``: ``[groups, devices]`` the group's ms on each device, ``log1p``.
    ``edge_index`` ``[2, edges]`` and ``edge_attr`` ``[edges, 1]`` (``log1p`` MiB) of
    the coarsened graph, both directions (the reverse edge carries the gradient).

Device features, ``[devices, DEVICE_FEATURES]``, cluster order
    Speed relative to the fastest device (the inverse of the graph's whole time on it),
    ``log1p`` of memory GiB, GPU flag, and over the other devices the mean and the
    least ``log1p`` of the latency (us) and of the ms per MiB of a transfer to them.
    ``device_pair``: ``[devices, devices, 2]`` those two figures per ordered pair.

Same graph, cluster and coarsening give bit-identical tensors (no randomness, a fixed
order everywhere). Complexity: O(ops x types + edges + devices^2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dl_nfv.artifacts import DeviceKind, OpKind
from dl_nfv.simulator.costs import CostModel

from .coarsen import Coarsening

FEATURE_SCHEMA_VERSION = 1
MIB = 2**20
GIB = 2**30
KINDS = tuple(OpKind)
OP_FEATURES = 4 + len(KINDS) + 1
GROUP_FEATURES = 4 + len(KINDS) + 1 + 1
DEVICE_FEATURES = 3 + 4


@dataclass(frozen=True, kw_only=True, slots=True)
class OpFeatures:
    """Per-op tensors of one graph on one cluster (see the module docstring)."""

    x: torch.Tensor  # [ops, OP_FEATURES]
    op_ms: torch.Tensor  # [ops, device types]
    depth: torch.Tensor  # [ops], integer depth


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupGraph:
    """The coarsened graph with device features: what the encoder reads."""

    x: torch.Tensor  # [groups, GROUP_FEATURES]
    edge_index: torch.Tensor  # [2, edges], long
    edge_attr: torch.Tensor  # [edges, 1]
    group_device_ms: torch.Tensor  # [groups, devices]
    device_x: torch.Tensor  # [devices, DEVICE_FEATURES]
    device_pair: torch.Tensor  # [devices, devices, 2]
    schema_version: int = FEATURE_SCHEMA_VERSION


def op_features(cm: CostModel) -> OpFeatures:
    """Per-op features of the cost model's graph, in graph order."""
    work = cm.fwd_ms_by_type + cm.bwd_ms_by_type * cm.bwd_runs[:, None]  # [ops, types]
    depth = _depth(cm)
    kinds = np.zeros((len(cm.op_ids), len(KINDS)))
    for i, op in enumerate(cm.graph.ops):
        kinds[i, KINDS.index(op.kind)] = 1.0
    deepest = max(int(depth.max()), 1)
    x = np.column_stack([np.log1p(work.min(axis=1)), np.log1p(work.max(axis=1)),
                         np.log1p(cm.output_bytes / MIB), np.log1p(cm.param_bytes / MIB),
                         kinds, depth / deepest])
    return OpFeatures(x=_tensor(x), op_ms=_tensor(work), depth=torch.from_numpy(depth.astype(np.int64)))


def group_graph(cm: CostModel, coarsening: Coarsening) -> GroupGraph:
    """The coarsened graph's features and the cluster's, for the encoder."""
    ops = op_features(cm)
    n_groups = len(coarsening.groups)
    rows = [[cm.op_index[o] for o in group] for group in coarsening.groups]
    work = ops.op_ms.numpy()
    n_kinds = len(KINDS)
    x = np.zeros((n_groups, GROUP_FEATURES))
    for g, idx in enumerate(rows):
        w = work[idx].sum(axis=0)
        x[g, 0:4] = np.log1p([w.min(), w.max(), cm.output_bytes[idx].sum() / MIB,
                              cm.param_bytes[idx].sum() / MIB])
        x[g, 4:4 + n_kinds] = ops.x.numpy()[idx, 4:4 + n_kinds].mean(axis=0)
        x[g, 4 + n_kinds] = ops.x.numpy()[idx, 4 + n_kinds].mean()
        x[g, 5 + n_kinds] = np.log1p(len(idx))
    devices = list(cm.cluster.device_names)
    types = [cm.device_type_index[d] for d in devices]
    group_type_ms = np.array([work[idx].sum(axis=0) for idx in rows])  # [groups, types]
    group_device_ms = np.log1p(group_type_ms[:, types])
    pairs = list(coarsening.edges.items())
    src = [a for (a, _), _ in pairs] + [b for (_, b), _ in pairs]
    dst = [b for (_, b), _ in pairs] + [a for (a, _), _ in pairs]
    mib = [np.log1p(v / MIB) for _, v in pairs] * 2
    device_x, device_pair = device_features(cm)
    return GroupGraph(x=_tensor(x), edge_index=torch.tensor([src, dst], dtype=torch.long).reshape(2, -1),
                      edge_attr=_tensor(np.array(mib).reshape(-1, 1)),
                      group_device_ms=_tensor(group_device_ms), device_x=device_x,
                      device_pair=device_pair)


def device_features(cm: CostModel) -> tuple[torch.Tensor, torch.Tensor]:
    """``(device_x [devices, DEVICE_FEATURES], device_pair [devices, devices, 2])`` of the
    cluster, in its device order; link figures from ``CostModel.transfer_affine``."""
    devices = list(cm.cluster.device_names)
    n = len(devices)
    pair = np.zeros((n, n, 2))
    for i, a in enumerate(devices):
        for j, b in enumerate(devices):
            latency_ms, ms_per_byte = cm.transfer_affine(a, b)
            pair[i, j] = (np.log1p(latency_ms * 1e3), np.log1p(ms_per_byte * MIB))
    work = cm.fwd_ms_by_type + cm.bwd_ms_by_type * cm.bwd_runs[:, None]
    whole = work.sum(axis=0)  # the graph on each type
    speed = np.array([1.0 / whole[cm.device_type_index[d]] if whole[cm.device_type_index[d]] > 0
                      else 1.0 for d in devices])
    speed = speed / speed.max()
    x = np.zeros((n, DEVICE_FEATURES))
    for i, name in enumerate(devices):
        device = cm.cluster.device(name)
        others = [j for j in range(n) if j != i]
        x[i, 0] = speed[i]
        x[i, 1] = np.log1p(device.memory_bytes / GIB)
        x[i, 2] = 1.0 if device.type.kind is DeviceKind.GPU else 0.0
        if others:
            x[i, 3:5] = pair[i, others].mean(axis=0)
            x[i, 5:7] = pair[i, others].min(axis=0)
    return _tensor(x), _tensor(pair)


def _depth(cm: CostModel) -> np.ndarray:
    """Longest edge path from a source to each op (graph order)."""
    preds: dict[str, list[str]] = {op: [] for op in cm.op_ids}
    for e in cm.graph.edges:
        preds[e.dst].append(e.src)
    depth: dict[str, int] = {}
    for op in cm.topological_ids:
        depth[op] = max((depth[p] + 1 for p in preds[op]), default=0)
    return np.array([depth[o] for o in cm.op_ids], dtype=np.float64)


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
