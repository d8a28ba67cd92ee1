"""The four data-parallel baselines (dp-even, dp-prop, ps-even, ps-prop) against closed forms.

The toy: one V100 on host ``a``, one T4 on
host ``b``, each with a 25 Gbps NIC to one switch, and a chain of four matmuls measured on
both types, the T4 taking twice the V100's time. Expected values come from that ratio and
the launch overhead (5 us on both types), not from the planners.
"""

from __future__ import annotations

import pytest

from dl_nfv.artifacts import SyncMethod, from_document
from dl_nfv.planners import PLANNERS, run
from dl_nfv.simulator import simulate
from dl_nfv.simulator.costs import ACCUMULATE_PASSES
from dl_nfv.simulator.tasks import TaskKind

LAUNCH_MS = 0.005  # both types' launch overhead: the part of an op that does not shrink
FWD_MS = (2.0, 3.0, 4.0, 1.0)  # on the V100; backward 2x forward; the T4 twice as slow
PARAM_BYTES = 4 * 2**20
BATCH = 12
V100, T4 = "a/gpu0", "b/gpu0"
MEMORY_GBPS = {V100: 900, T4: 320}


def v100_t4_topology():
    """One V100 on host ``a``, one T4 on host ``b``, 25 Gbps, 5 us NICs to one switch."""
    host = lambda name, kind: {"name": name, "devices": [{"type": kind, "count": 1}],  # noqa: E731
                                "nics": [{"switch": "tor", "bandwidth_gbps": 25, "latency_us": 5}]}
    return from_document({"kind": "topology", "schema_version": 1, "name": "v100-t4",
                          "hosts": [host("a", "V100-16GB"), host("b", "T4")],
                          "switches": [{"name": "tor"}]})


def _graph():
    ops, edges = [], []
    for i, t in enumerate(FWD_MS):
        ops.append({"id": f"l{i}", "name": f"l{i}", "kind": "matmul", "param_bytes": PARAM_BYTES,
                    "output_bytes": 4096, "fwd_ms": {"V100-16GB": t, "T4": 2 * t},
                    "bwd_ms": {"V100-16GB": 2 * t, "T4": 4 * t}})
        if i:
            edges.append({"src": f"l{i - 1}", "dst": f"l{i}", "bytes": 4096})
    return from_document({"kind": "op-graph", "schema_version": 1,
                          "model": {"name": "chain4", "batch_size": BATCH}, "ops": ops,
                          "edges": edges})


def _compute_ms(device: str, share: float) -> float:
    """Forward plus backward of the chain on ``device`` at ``share`` of the batch: the
    launch does not shrink, the rest does; each backward adds its gradient into its
    bucket (``ACCUMULATE_PASSES`` over the parameter bytes at the memory bandwidth)."""
    slow = 1 if device == V100 else 2
    scaled = sum(LAUNCH_MS + (slow * t - LAUNCH_MS) * share
                 + LAUNCH_MS + (2 * slow * t - LAUNCH_MS) * share for t in FWD_MS)
    accumulate = len(FWD_MS) * PARAM_BYTES * ACCUMULATE_PASSES / (MEMORY_GBPS[device] * 1e6)
    return scaled + accumulate


def _simulated_compute_ms(plan, graph, topology) -> dict[str, float]:
    result = simulate(plan, graph, topology)
    tg = result.tasks
    out = dict.fromkeys(tg.device_names, 0.0)
    for t, kind in enumerate(tg.kind):
        if kind in (TaskKind.FORWARD, TaskKind.BACKWARD):
            out[tg.device_names[tg.device[t]]] += tg.duration_ms[t]
    return out


def test_registry_presets_fix_sync_and_balance():
    expected = {"dp-even": ("allreduce", "even"), "dp-prop": ("allreduce", "proportional"),
                "ps-even": ("ps", "even"), "ps-prop": ("ps", "proportional")}
    for name, (sync, balance) in expected.items():
        info = PLANNERS[name]
        assert info.baseline and info.family == "data-parallel"
        assert info.preset.get("sync", "allreduce") == sync and info.preset["balance"] == balance


@pytest.mark.parametrize("name,sync", [("dp-even", SyncMethod.ALLREDUCE), ("dp-prop", SyncMethod.ALLREDUCE),
                                       ("ps-even", SyncMethod.PS), ("ps-prop", SyncMethod.PS)])
def test_batch_shares_and_compute_time_follow_the_split(name, sync):
    graph, topology = _graph(), v100_t4_topology()
    plan = run(name, graph, topology)
    assert plan.planner == name
    (group,) = plan.groups
    assert group.devices == (V100, T4) and group.sync is sync
    # speeds 1 : 1/2, so the proportional split of 12 samples is 8 : 4
    shares = (0.5, 0.5) if name.endswith("even") else (8 / 12, 4 / 12)
    assert group.shares == pytest.approx(shares)
    if sync is SyncMethod.PS:  # one server per host: both devices serve half the parameters
        assert group.ps_servers == (V100, T4)
    compute = _simulated_compute_ms(plan, graph, topology)
    assert compute[V100] == pytest.approx(_compute_ms(V100, shares[0]), rel=1e-9)
    assert compute[T4] == pytest.approx(_compute_ms(T4, shares[1]), rel=1e-9)


def test_proportional_split_equalises_compute_and_even_split_does_not():
    graph, topology = _graph(), v100_t4_topology()
    total = 3 * sum(FWD_MS)  # forward + backward of the chain on the V100, full batch
    prop = _simulated_compute_ms(run("dp-prop", graph, topology), graph, topology)
    even = _simulated_compute_ms(run("dp-even", graph, topology), graph, topology)
    # proportional: 2/3 of the batch at speed 1 = 1/3 at speed 1/2 = 2/3 of the V100's time
    # (up to launches and bucket adds, well under 1%)
    assert prop[V100] == pytest.approx(2 / 3 * total, rel=0.01)
    assert prop[T4] == pytest.approx(2 / 3 * total, rel=0.01)
    # even: the T4 takes twice as long as the V100
    assert even[V100] == pytest.approx(total / 2, rel=0.01)
    assert even[T4] == pytest.approx(total, rel=0.01)
    # the iteration is bound by the slower replica's compute, so proportional wins
    ms = {n: run(n, graph, topology).prediction.iteration_ms for n in ("dp-even", "dp-prop")}
    assert ms["dp-prop"] < ms["dp-even"] - 0.2 * total


def test_allreduce_and_ps_move_the_same_bytes_between_two_hosts():
    """Two devices on two hosts: a ring AllReduce of S bytes sends 2(N-1)/N x S = S each
    way; with a server per host each replica pushes the other server's half (S/2) and
    pulls it back (S/2): S each way too. Every byte crosses both NICs."""
    graph, topology = _graph(), v100_t4_topology()
    gradient_bytes = len(FWD_MS) * PARAM_BYTES
    for name in ("dp-even", "ps-even"):
        report = simulate(run(name, graph, topology), graph, topology).to_report()
        moved = {(link.src, link.dst): link.collective_bytes for link in report.links}
        for hop in (("a", "tor"), ("tor", "b"), ("b", "tor"), ("tor", "a")):
            assert moved[hop] == pytest.approx(gradient_bytes, rel=1e-9), (name, hop)


def test_dp_keeps_its_default_of_proportional_shares():
    graph, topology = _graph(), v100_t4_topology()
    assert run("dp", graph, topology).groups[0].shares == run("dp-prop", graph, topology).groups[0].shares
