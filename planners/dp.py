"""Data parallelism (baseline): every device holds the whole model and a share of the batch.

Batch shares follow device speed (``balance="proportional"``, the
heterogeneity-aware baseline) or are even (``balance="even"``, plain DDP). A device
whose share would hold fewer rows than the graph's batch norms need in training
(``runnable.min_slice_rows``) is left out, and the batch shared again among the rest.
Gradients are synchronised by AllReduce in DDP-style buckets that overlap the
backward pass, or through parameter servers (``sync="ps"``: one server per
host, parameters sharded over them). All ops form one group on every device
used, so every colocation group of the graph shares a placement.
"""

from __future__ import annotations

from dl_nfv.artifacts import BadInput, Collective, Fusion, Group, OpGraph, SyncMethod, Topology

from .base import (
    device_speeds,
    finish,
    gradient_buckets,
    integer_shares,
    optimizer_named,
    replicas,
    started,
)
from .bounds import lower_bound
from .runnable import min_slice_rows, require_rows

MB = 2**20


def plan(graph: OpGraph, topology: Topology, *, seed: int = 0, sync: str = "allreduce",
         balance: str = "proportional", bucket_mb: float = 25.0, collective: str = "auto",
         devices: str = "", optimizer: str = "sgd"):
    """Data parallelism over the cluster's devices.

    Parameters
    ----------
    sync : str
        allreduce or ps (one parameter server on the first device of each host).
    balance : str
        proportional (batch shares by device speed) or even.
    bucket_mb : float
        Gradient bucket size in MiB (0: one collective after the whole backward).
    collective : str
        AllReduce algorithm: auto, ring, tree or hierarchical.
    devices : str
        Comma-separated device names to use (default: all).
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.

    Complexity: O(ops + devices) plus one simulation.
    """
    t0 = started()
    from dl_nfv.simulator.costs import CostModel

    opt = optimizer_named("dp", optimizer)
    cm = CostModel(graph, topology)
    names = _pick_devices(cm, devices)
    try:
        method = SyncMethod(sync)
        algorithm = Collective(collective)
    except ValueError as exc:
        raise BadInput(f"dp: {exc}") from None
    if balance not in ("proportional", "even"):
        raise BadInput(f"dp: balance must be 'proportional' or 'even', got {balance!r}")
    weights = device_speeds(cm, names) if balance == "proportional" else [1.0] * len(names)
    used, shares = replicas(*_counts(graph, names, weights))
    ops = tuple(op.id for op in graph.ops)
    servers: tuple[str, ...] = ()
    if method is SyncMethod.PS:
        hosts: dict[str, str] = {}
        for d in used:
            hosts.setdefault(cm.cluster.device(d).host, d)
        servers = tuple(hosts.values())
    group = Group(id="all", ops=ops, devices=used, batch_shares=shares if len(used) > 1 else (),
                  sync=method if len(used) > 1 else SyncMethod.NONE, ps_servers=servers if len(used) > 1 else (),
                  collective=algorithm if method is SyncMethod.ALLREDUCE else Collective.AUTO)
    fusion = None
    if bucket_mb > 0 and len(used) > 1:
        fusion = Fusion(gradient_buckets=gradient_buckets(graph, ops, bucket_mb * MB))
    # one group: the replica with the largest share, at least 1 / len(used), runs every op
    bound = lower_bound(cm, used, min_batch_fraction=1.0 / len(used))
    return finish(planner="dp", graph=graph, topology=topology, groups=[group], seed=seed,
                  options={"sync": sync, "balance": balance, "bucket_mb": bucket_mb,
                           "collective": collective, "devices": devices, "optimizer": optimizer},
                  started_at=t0, bound=bound, fusion=fusion, optimizer=opt, cost_model=cm)


def _counts(graph: OpGraph, names: list[str], weights: list[float]
            ) -> tuple[list[str], list[int]]:
    """Devices and their samples by ``weights`` (largest remainder), leaving out one at a
    time (the fewest samples, then the smallest weight, then the last) while some device
    would get fewer rows than ``min_slice_rows``; ``InfeasiblePlan`` when one device is left
    short."""
    batch, rows = graph.model.batch_size, min_slice_rows(graph)
    names, weights = list(names), list(weights)
    counts = integer_shares(batch, weights)
    while len(names) > 1 and (short := [i for i, c in enumerate(counts) if 0 < c < rows]):
        drop = min(short, key=lambda i: (counts[i], weights[i], -i))
        del names[drop], weights[drop]
        counts = integer_shares(batch, weights)
    require_rows(graph, min(c for c in counts if c > 0), "dp", f"the batch of {batch}")
    return names, counts


def _pick_devices(cm, devices: str) -> list[str]:
    if not devices:
        return list(cm.cluster.device_names)
    names = [d.strip() for d in devices.split(",") if d.strip()]
    for name in names:
        cm.cluster.device(name)  # raises UnknownName
    return names
