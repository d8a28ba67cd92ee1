"""What the runtime needs of a plan beyond the plan record's own checks: rows for batch norms.

The runtime trains every replica of a group (or pipeline stage) on its own slice of
each microbatch: ``batch_size / microbatches`` rows split by the group's batch
shares (largest remainder). A batch norm in training normalises each channel over
the rows and positions of its slice, and torch refuses a slice with a single value
per channel (``Expected more than 1 value per channel when training``): a batch
norm whose output has one position per channel (after global pooling, or on
``(batch, features)``) needs at least two rows in every slice.

``batch_norm_rows`` reads that from the op graph (an op named like a batch norm,
its channels from its two affine parameters, its output's size from its outgoing
edges); ``min_slice_rows`` is what a planner choosing microbatches and shares needs,
and ``require_rows`` refuses (``InfeasiblePlan``) a slice size no choice can raise;
``slice_rows`` gives the rows of every replica slice of a plan; and
``check_batch_norm_rows`` raises naming the op, the group, the device and the rows.
A batch norm without affine parameters or without outgoing edges is not checked
(its channels or its output size are not in the graph), nor is one inside a
layer of a layer-granularity graph (the op is the layer; its batch norms are not
named in the graph).

Complexity: O(ops + edges + groups x replicas).
"""

from __future__ import annotations

from dl_nfv.artifacts import InfeasiblePlan, InvalidArtifact, OpGraph, Plan

from .base import integer_shares

# bytes per element of the dtypes an op graph names
DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
MIN_NORM_ROWS = 2


def batch_norm_rows(graph: OpGraph) -> dict[str, int]:
    """Op id -> the fewest rows a training slice must hold, for every batch norm whose
    output has a single position per channel (``MIN_NORM_ROWS``)."""
    itemsize = DTYPE_BYTES.get(graph.model.dtype, 4)
    out_bytes: dict[str, int] = {}
    for e in graph.edges:
        out_bytes[e.src] = max(out_bytes.get(e.src, 0), e.bytes)
    needs = {}
    for op in graph.ops:
        if "batchnorm" not in op.name.lower().replace("_", "") or op.param_bytes <= 0:
            continue
        channels = op.param_bytes / (2 * itemsize)  # weight and bias, one each per channel
        per_sample = out_bytes.get(op.id, 0) / graph.model.batch_size / itemsize
        if 0 < per_sample <= channels:
            needs[op.id] = MIN_NORM_ROWS
    return needs


def min_slice_rows(graph: OpGraph) -> int:
    """The fewest rows any replica's slice of a microbatch may hold for the runtime to train
    ``graph``: 2 when a batch norm needs them (``batch_norm_rows``), else 1. A planner that
    picks microbatch counts or batch shares keeps every non-empty slice at least this big."""
    return max(batch_norm_rows(graph).values(), default=1)


def require_rows(graph: OpGraph, rows: int, planner: str, why: str) -> None:
    """Raise ``InfeasiblePlan`` naming the batch norm and the rows when a slice of ``rows``
    rows (``why`` says what leaves it that few) is too small to train ``graph``."""
    short = [(op, need) for op, need in batch_norm_rows(graph).items() if rows < need]
    if short:
        op, need = short[0]
        raise InfeasiblePlan(f"{planner}: batch norm {op!r} needs at least {need} rows per "
                             f"replica slice in training (one value per channel otherwise), "
                             f"but {why} leaves {rows}")


def slice_rows(plan: Plan) -> dict[str, dict[str, int]]:
    """Group id -> device -> the rows of the slice that device trains per microbatch."""
    microbatches = plan.pipeline.microbatches if plan.pipeline is not None else 1
    rows = plan.batch_size // microbatches
    return {g.id: dict(zip(g.devices, integer_shares(rows, list(g.shares)))) for g in plan.groups}


def check_batch_norm_rows(plan: Plan, graph: OpGraph) -> None:
    """Raise ``InvalidArtifact`` when a replica trains a batch norm of ``graph`` on a slice
    with fewer rows than it needs (one value per channel, which torch refuses)."""
    needs = batch_norm_rows(graph)
    if not needs:
        return
    rows = slice_rows(plan)
    for g in plan.groups:
        for op in g.ops:
            if op not in needs:
                continue
            for device, count in rows[g.id].items():
                if 0 < count < needs[op]:
                    where = ("pipeline.microbatches" if plan.pipeline is not None
                             else f"groups.{g.id}.batch_shares")
                    raise InvalidArtifact(
                        f"batch norm {op!r} (group {g.id!r}) would train on {count} row(s) per "
                        f"slice on {device!r}: one value per channel, which torch refuses in "
                        f"training; it needs at least {needs[op]} rows per microbatch and "
                        f"replica", field=where)
