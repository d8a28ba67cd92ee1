"""Migration under traffic, NFVactor's (actor) and OpenNF's (central): nothing lost,
nothing reordered, every flow's state as if it had never moved."""

from __future__ import annotations

import pytest

from dl_nfv.artifacts.errors import BadInput
from dl_nfv.nfv.actors.chain import chain_document
from dl_nfv.nfv.actors.client import Action, migrate, replay
from dl_nfv.nfv.actors.cluster import load_cluster
from dl_nfv.nfv.actors.processes import ClusterProcesses
from dl_nfv.nfv.actors.traffic import interleaved
from tests.conftest import EXAMPLES

from .conftest import cluster_text, free_ports, sequential

PACKETS = interleaved(flows=90, packets_per_flow=12, seed=3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One running cluster for this module's tests (each replay starts afresh)."""
    path = tmp_path_factory.mktemp("actors") / "cluster.yaml"
    path.write_text(cluster_text(free_ports(4)))
    spec = load_cluster(path)
    with ClusterProcesses(path, spec):
        yield spec


def test_migration_under_traffic_loses_and_reorders_nothing(cluster):
    spec = cluster
    document = chain_document(EXAMPLES / "nf" / "fw-nat-lb.yaml")
    outputs, states = sequential(PACKETS, document)
    assert {o.dropped_by for o in outputs} == {"", "firewall:acl", "firewall:no_conn"}
    quarter = len(PACKETS) // 4
    for mode in ("actor", "central"):
        # rt1's flows are replicated on rt2, so moving them there moves the replica too.
        actions = (Action(quarter, "migrate", "rt1", "rt2", flows=10, mode=mode),
                   Action(2 * quarter, "migrate", "rt3", "rt1", flows=5, mode=mode))
        result = replay(spec, PACKETS, document, rate_pps=3000, window=256, batch=8,
                        actions=actions)
        assert (result["lost"], result["duplicates"], result["reordered"]) == (0, 0, 0)
        assert result["outputs"] == outputs
        assert result["states"] == states
        moved = {(m["source"], m["destination"]): m for m in result["migrations"]}
        assert {k: m["flows"] for k, m in moved.items()} == {("rt1", "rt2"): 10,
                                                              ("rt3", "rt1"): 5}
        assert all(m["mode"] == mode for m in moved.values())
        runtimes = result["status"]["runtimes"]  # 90 flows placed round-robin: 30 each
        assert [runtimes[r]["flows"] for r in ("rt1", "rt2", "rt3")] == [25, 40, 25]
        assert sum(runtimes[r]["replicas"] for r in runtimes) == 90
        # One replica per flow, as far as its primary: a replica on the runtime a flow
        # moved to was moved away.
        assert {f: [seq for _, seq in r] for f, r in result["replicas"].items()} == {
            f: [seq] for f, (seq, _) in states.items()}


def test_bad_migrations_name_the_problem(cluster):
    spec = cluster
    replay(spec, PACKETS[:60], chain_document(None))
    with pytest.raises(BadInput, match="on 'rt1' already"):
        migrate(spec, 1, "rt1", "rt1", "actor")
    with pytest.raises(BadInput, match="fewer than the 500"):
        migrate(spec, 500, "rt1", "rt2", "actor")
    with pytest.raises(BadInput, match="no runtime 'rt9'"):
        migrate(spec, 1, "rt1", "rt9", "central")
    done = migrate(spec, 3, "rt1", "rt3", "central")
    assert done["flows"] == 3 and done["completion_ms"] > 0
