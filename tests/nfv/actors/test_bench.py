"""``bench`` on a cluster that lost a runtime: measured on the live runtimes, the
recovery part skipped with a note when no third live runtime is left to kill."""

from __future__ import annotations

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
