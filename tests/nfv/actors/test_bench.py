"""``bench`` on a cluster that lost a runtime: measured on the live runtimes, the
recovery part skipped with a note when no third live runtime is left to kill."""

from __future__ import annotations

import time

from dl_nfv.nfv.actors.chain import chain_document
from dl_nfv.nfv.actors.client import fail, migrate, replay
from dl_nfv.nfv.actors.cluster import load_cluster
from dl_nfv.nfv.actors.measure import bench, speedups
from dl_nfv.nfv.actors.processes import ClusterProcesses
from dl_nfv.nfv.actors.traffic import interleaved


def test_bench_after_a_failure_uses_the_live_runtimes(cluster_file):
    spec = load_cluster(cluster_file)
    packets = interleaved(40, 6, seed=1)
    with ClusterProcesses(cluster_file, spec):
        replay(spec, packets, chain_document(None))
        event = fail(spec, "rt1")
        assert event["takeover_ms"] is not None
        result = bench(spec, packets, chain_document(None), sizes=(20,), latency_repeats=1,
                       migration_repeats=1)
        # migrate names live runtimes only, and the cluster still serves them
        replay(spec, interleaved(30, 3, seed=2), chain_document(None))
        assert migrate(spec, 5, "rt2", "rt3", "actor")["flows"] == 5
    assert result["live"] == ["rt2", "rt3"] and result["runtimes"] == 2
    assert "recovery" not in result and "third live runtime" in result["recovery_skipped"]
    assert [(m["flows"], m["mode"]) for m in result["migration"]] == [(20, "actor"),
                                                                      (20, "central")]
    assert result["speedup"] == speedups(result)[20] and result["speedup_flows"] == 20
    rates = result["throughput"]
    assert rates["replication"]["per_runtime"] == rates["replication"]["packets_per_s"] / 2


def test_a_replay_at_a_fixed_rate_sleeps_until_each_packet_is_due(cluster_file):
    """The latency runs' client waits for its next packet in the poll: at a rate far below
    saturation it uses a small part of a core, and takes none from the cluster it measures
    (a client polling without a time-out spins on a whole core)."""
    spec = load_cluster(cluster_file)
    packets = interleaved(50, 6, seed=4)
    with ClusterProcesses(cluster_file, spec):
        replay(spec, packets[:20], chain_document(None))  # connected and warm
        cpu, wall = time.process_time(), time.perf_counter()
        result = replay(spec, packets, chain_document(None), rate_pps=500, batch=1)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert (result["lost"], result["duplicates"], result["reordered"]) == (0, 0, 0)
    assert wall >= len(packets) / 500 - 0.01  # paced, not sent at once
    # a spinning client uses the whole core (cpu ~ wall); a sleeping one a part of it that
    # grows when other jobs slow its wake-ups and sends (0.4 of a core seen under the suite)
    assert cpu < 0.6 * wall, (cpu, wall)
