"""Build the ``sim-report`` artifact of a ``SimResult``."""

from __future__ import annotations

from collections import defaultdict

from dl_nfv.artifacts import fingerprint
from dl_nfv.artifacts.simreport import (
    CriticalStep,
    DeviceUsage,
    LinkUsage,
    Overflow,
    SimReport,
)

from .tasks import COMPUTE_KINDS, TaskKind

ROUND = 6


def build_report(result) -> SimReport:
    """Summarise ``result`` (a SimResult) as a ``SimReport``.

    Complexity: O(tasks x resources per task + critical path).
    """
    tg = result.tasks
    plan, graph, topology = result.plan, result.graph, result.topology
    cluster = result.cost_model.cluster
    it = result.iteration_ms
    overlap = result._overlap
    devices = []
    counts: dict[int, int] = defaultdict(int)
    for d in tg.device:
        if d >= 0:
            counts[d] += 1
    for d, name in enumerate(tg.device_names):
        busy = result.busy_ms[name]
        comm, hidden = overlap.get(d, (0.0, 0.0))
        devices.append(DeviceUsage(
            device=name, type=cluster.device(name).type.name, busy_ms=round(busy, ROUND),
            busy_fraction=round(busy / it, ROUND) if it > 0 else 0.0,
            compute_tasks=counts[d], comm_ms=round(comm, ROUND),
            hidden_comm_ms=round(hidden, ROUND), static_bytes=int(round(tg.static_bytes[d])),
            peak_memory_bytes=result.peak_memory_bytes[name], memory_bytes=tg.capacity_bytes[d],
            host_driven=bool(tg.host_driven[d])))
    busy_link: dict[int, float] = defaultdict(float)
    tasks_link: dict[int, int] = defaultdict(int)
    transfer_bytes: dict[tuple[str, str], float] = defaultdict(float)
    collective_bytes: dict[tuple[str, str], float] = defaultdict(float)
    n_links = tg.n_links
    n_transfers = n_collectives = 0
    compute_ms = comm_ms = 0.0
    for t, k in enumerate(tg.kind):
        dur = tg.duration_ms[t]
        if k in COMPUTE_KINDS:
            compute_ms += dur
            continue
        comm_ms += dur
        if k == TaskKind.TRANSFER:
            n_transfers += 1
        else:
            n_collectives += 1
        for r in tg.resources[t]:
            if r < n_links:
                busy_link[r] += dur
                tasks_link[r] += 1
                if k == TaskKind.TRANSFER:
                    transfer_bytes[tg.resource_names[r]] += tg.nbytes[t]
        if k != TaskKind.TRANSFER:
            for hop, nbytes in tg.info[t][2].items():
                collective_bytes[hop] += nbytes
    links = []
    for r in range(n_links):
        hop = tg.resource_names[r]
        links.append(LinkUsage(
            src=hop[0], dst=hop[1], bandwidth_gbps=cluster.link(*hop)["bandwidth_gbps"],
            transfer_bytes=int(round(transfer_bytes[hop])),
            collective_bytes=int(round(collective_bytes[hop])),
            busy_ms=round(busy_link[r], ROUND),
            busy_fraction=round(min(1.0, busy_link[r] / it), ROUND) if it > 0 else 0.0,
            tasks=tasks_link[r]))
    links.sort(key=lambda lk: (-lk.busy_ms, lk.src, lk.dst))
    path = tuple(CriticalStep(kind=c.kind, name=c.name, where=c.where,
                              start_ms=round(c.start_ms, ROUND), end_ms=round(c.end_ms, ROUND),
                              tasks=c.tasks) for c in result.critical_path)
    return SimReport(
        planner=plan.planner, plan_sha256=fingerprint(plan), graph_sha256=plan.graph_sha256,
        topology_sha256=plan.topology_sha256, model=graph.model.name, topology=topology.name,
        microbatches=tg.microbatches, iteration_ms=round(it, ROUND),
        planner_prediction_ms=plan.prediction.iteration_ms if plan.prediction else None,
        feasible=result.feasible, tasks=len(tg), compute_tasks=sum(counts.values()),
        transfers=n_transfers, collectives=n_collectives, compute_ms=round(compute_ms, ROUND),
        comm_ms=round(comm_ms, ROUND),
        comm_hidden_fraction=round(min(1.0, result.comm_hidden_fraction), ROUND),
        critical_path_ms=round(result.longest_chain_ms, ROUND), devices=tuple(devices),
        links=tuple(links),
        overflows=tuple(Overflow(device=d, time_ms=round(t, ROUND), shortfall_bytes=b)
                        for d, t, b in result.overflows),
        critical_path=path)
