"""What a run reads before any process starts: plan, graph, topology, and run defaults.

Kept free of torch so that the launcher (``dl-nfv train``) checks its inputs and
fails fast on bad ones without paying for importing torch.
"""

from __future__ import annotations

from pathlib import Path

from dl_nfv.artifacts import ArtifactMismatch, BadInput, fingerprint, load, validate_against


def default_warmup(steps: int) -> int:
    """Warm-up steps left out of the medians: a third of the run, at most 3."""
    return min(3, steps // 3)


def default_threads(local_workers: int) -> int:
    """Threads of a worker whose device states no cores (a GPU, or no topology): this
    host's cores shared evenly."""
    import os

    return max(1, (os.cpu_count() or 1) // max(local_workers, 1))


def device_threads(topology, devices, requested: int | None, local_world: int) -> list[int]:
    """Intra-op threads of the worker of each of ``devices``.

    ``requested`` (``--threads``) when given; else a CPU device's cores as the topology
    states them (``cores``, one where it says nothing), whatever the number of workers;
    else (a GPU, or no topology) this host's cores shared by the ``local_world`` workers.
    """
    if requested is not None:
        return [requested] * len(devices)
    cores = device_cores(topology, devices)
    return [cores.get(d) or default_threads(local_world) for d in devices]


def device_cores(topology, devices) -> dict[str, int]:
    """Cores of each CPU device of ``devices`` by the topology (GPUs and unknowns left out)."""
    if topology is None:
        return {}
    from dl_nfv.artifacts import cluster_of

    cluster = cluster_of(topology)
    out = {}
    for d in devices:
        cores = cluster.device(d).type.cpu_cores
        if cores is not None:
            out[d] = cores
    return out


def cpu_set(threads_of_local_ranks: list[int], local_rank: int,
            available: list[int]) -> tuple[int, ...]:
    """The CPUs worker ``local_rank`` of this host is pinned to: consecutive blocks of
    ``available`` (this process's allowed CPUs, in order), one per local rank in rank order,
    each as wide as that rank's threads. Empty (no pinning) where the blocks do not all
    fit, so that an oversubscribed host shares its cores instead of piling workers on some.
    """
    if sum(threads_of_local_ranks) > len(available):
        return ()
    start = sum(threads_of_local_ranks[:local_rank])
    return tuple(available[start:start + threads_of_local_ranks[local_rank]])


def resolve_path(given: str | None, recorded: str, plan_path: str) -> Path | None:
    """An artifact path: the one given, else the one the plan recorded (relative to the plan)."""
    if given:
        return Path(given)
    if not recorded:
        return None
    path = Path(recorded)
    if not path.is_absolute():
        path = Path(plan_path).resolve().parent / path
    return path


def load_inputs(plan_path: str, graph_path: str | None, topology_path: str | None):
    """Load the plan, its graph and (when found) its topology, and check they belong together.

    Raises ``BadInput`` when the graph cannot be found and ``ArtifactMismatch``
    when fingerprints differ.
    """
    plan = load(plan_path, expect="plan")
    gpath = resolve_path(graph_path, plan.graph_path, plan_path)
    if gpath is None:
        raise BadInput(f"{plan_path}: the plan records no graph_path; pass --graph")
    if not gpath.exists():
        raise BadInput(f"{plan_path}: graph {str(gpath)!r} (graph_path) not found; pass --graph")
    graph = load(gpath, expect="op-graph")
    tpath = resolve_path(topology_path, plan.topology_path, plan_path)
    topology = None
    if tpath is not None and (topology_path or tpath.exists()):
        topology = load(tpath, expect="topology")
    if topology is not None:
        validate_against(plan, graph, topology)
    elif fingerprint(graph) != plan.graph_sha256:
        raise ArtifactMismatch(f"the plan was made for a graph with sha256 {plan.graph_sha256[:12]}..., "
                               f"but {gpath} has sha256 {fingerprint(graph)[:12]}...")
    from dl_nfv.simulator.lower import check_fusion

    check_fusion(plan, graph)
    return plan, graph, topology, gpath


def device_kinds(topology, devices) -> dict[str, str]:
    if topology is None:
        return {}
    from dl_nfv.artifacts import cluster_of

    cluster = cluster_of(topology)
    return {d: cluster.device(d).type.kind.value for d in devices}


def trace_path_of(trace: str, rank: int) -> Path:
    """Where rank ``rank`` writes its trace: ``run.json`` -> ``run.rank0.json``."""
    path = Path(trace)
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix or '.json'}")
