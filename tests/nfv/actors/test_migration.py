"""Migration under traffic, NFVactor's (actor) and OpenNF's (central): nothing lost,
nothing reordered, every flow's state as if it had never moved."""

from __future__ import annotations

import pytest

from dl_nfv.artifacts.errors import BadInput
from dl_nfv.nfv.actors.chain import build_chain, chain_document, flow_key
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


@pytest.mark.parametrize("state_first", [False, True])
@pytest.mark.parametrize("replica", [None, "rt1"])
def test_migrated_state_may_arrive_before_or_after_the_packets(tmp_path, state_first, replica):
    """The destination takes its senders' messages in turn, so the source's state can
    come before or after the flow's next packets from the switch: either order installs
    the state, processes the held packets after it, and reports the flow migrated once.
    Moving a flow onto its replica's runtime (replica "rt1", the source) leaves the
    source holding the state as the replica, which then applies the destination's
    deltas."""
    from dl_nfv.nfv.actors.runtime import Runtime

    path = tmp_path / "cluster.yaml"
    path.write_text(cluster_text(free_ports(4)))
    spec = load_cluster(path)
    document = chain_document(EXAMPLES / "nf" / "fw-nat-lb.yaml")
    lane = [p for p in PACKETS if flow_key(p) == flow_key(PACKETS[0])]
    _, expected = sequential(lane, document)
    source, destination = Runtime(spec, "rt1"), Runtime(spec, "rt2")
    try:
        source.chain = destination.chain = build_chain(document)
        half = len(lane) // 2
        source.on_packets("switch", [(0, s + 1, None, 0, p) for s, p in enumerate(lane[:half])])
        assert [seq for _, seq, _ in source.acks] == list(range(1, half + 1))
        told = []
        destination.tell = lambda address, kind, body: told.append((kind, body))
        source.tell = lambda address, kind, body: told.append((kind, body))
        source.on_migrate_out("switch", ("rt2", [0], [half], [replica]))
        source.settle()  # (what the process does before its next message)
        (kind, states), = told
        assert kind == "migrate_in" and 0 not in source.primaries
        assert (0 in source.replicas) == (replica == "rt1")
        told.clear()
        later = [(0, half + 1 + s, replica, half, p) for s, p in enumerate(lane[half:])]
        if state_first:
            destination.on_migrate_in("rt1", states)
            destination.on_packets("switch", later)
        else:
            destination.on_packets("switch", later)  # held until the state is in
            assert destination.primaries[0].seq == 0 and destination.primaries[0].held
            assert told == []
            destination.on_migrate_in("rt1", states)
        assert told == [("migrated", [0])]
        actor = destination.primaries[0]
        assert actor.held is None and (actor.seq, actor.states) == expected[0]
        if replica == "rt1":
            source.on_deltas("rt2", destination.deltas["rt1"])
            copy = source.replicas[0]
            assert (copy.seq, copy.states) == expected[0]
            assert [seq for _, seq, _ in source.acks[half:]] == list(range(half + 1,
                                                                           len(lane) + 1))
        else:
            assert [seq for _, seq, _ in destination.acks] == list(range(half + 1,
                                                                        len(lane) + 1))
    finally:
        source.endpoint.close()
        destination.endpoint.close()


def test_a_source_named_replica_before_its_migrate_out_keeps_the_copy(tmp_path):
    """The destination died before the source handled ``migrate_out`` (queued behind its
    packets): the flow's replica, promoted, names the source as the new replica, and its
    snapshot and deltas can reach the source first. The source keeps them as the replica
    while it still holds the stale primary, which ``migrate_out`` then takes away."""
    from dl_nfv.nfv.actors.runtime import Runtime

    path = tmp_path / "cluster.yaml"
    path.write_text(cluster_text(free_ports(4)))
    spec = load_cluster(path)
    document = chain_document(EXAMPLES / "nf" / "fw-nat-lb.yaml")
    lane = [p for p in PACKETS if flow_key(p) == flow_key(PACKETS[0])]
    _, expected = sequential(lane, document)
    source, replica = Runtime(spec, "rt1"), Runtime(spec, "rt2")
    try:
        source.chain = replica.chain = build_chain(document)
        half = len(lane) // 2
        first = [(0, s + 1, "rt2", 0, p) for s, p in enumerate(lane[:half])]
        source.on_packets("switch", first)
        replica.on_deltas("rt1", source.deltas.pop("rt2"))
        source.tell = replica.tell = lambda address, kind, body: None
        replica.on_promote("switch", [(0, "rt1", half)])  # rt3, the destination, died
        replica.on_packets("switch", [(0, half + 1 + s, "rt1", half, p)
                                      for s, p in enumerate(lane[half:])])
        source.on_snapshot("rt2", replica.snapshots.pop("rt1"))
        source.on_deltas("rt2", replica.deltas.pop("rt1"))
        assert 0 in source.primaries  # stale: its migrate_out is still on its way
        source.on_migrate_out("switch", ("rt3", [0], [half], ["rt2"]))
        assert 0 not in source.primaries
        copy = source.replicas[0]
        assert (copy.seq, copy.states) == expected[0]
        assert [seq for _, seq, _ in source.acks if seq > half] == list(range(half + 1,
                                                                              len(lane) + 1))
    finally:
        source.endpoint.close()
        replica.endpoint.close()
