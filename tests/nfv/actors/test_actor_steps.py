"""The batched steps of an actor-mode migration, handler by handler (switch and runtimes
in one process, ``net.Net``): what each step sends, and what it leaves behind once the
message is out (the source's kept replicas, the destination's replaced ones)."""

from __future__ import annotations

import pytest

from dl_nfv.nfv.actors.batch import unpack
from dl_nfv.nfv.actors.chain import build_chain, chain_document, flow_key
from dl_nfv.nfv.actors.cluster import load_cluster
from dl_nfv.nfv.actors.traffic import interleaved
from tests.conftest import EXAMPLES

from .conftest import cluster_text, free_ports, sequential
from .net import Net

DOCUMENT = chain_document(EXAMPLES / "nf" / "fw-nat-lb.yaml")
PACKETS = interleaved(flows=24, packets_per_flow=5, seed=11)


@pytest.fixture
def net(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(cluster_text(free_ports(4)))
    net = Net(load_cluster(path), build_chain(DOCUMENT), seed=0)
    net.packets(PACKETS)
    net.run()
    yield net
    net.close()


def _command(net: Net, flows: int, source: str, destination: str) -> tuple:
    """The switch's ``migrate_out`` for ``flows`` flows, taken off its channel."""
    net.migrate(flows, source, destination, "actor")
    channel = net.channels[("switch", source)]
    kind, payload = channel.pop()
    assert kind == "migrate_out" and not channel
    return payload


@pytest.mark.parametrize("destination", ["rt2", "rt3"])
def test_the_switch_names_flows_marks_and_new_replicas_then_reroutes(net, destination):
    """rt1's flows are replicated on rt2: moved there, the source becomes their replica."""
    before = {f.id: (f.committed, f.replica) for f in net.switch.by_id if f.primary == "rt1"}
    to, flows, marks, replicas = _command(net, 5, "rt1", destination)
    assert to == destination and flows == sorted(before)[:5]
    assert marks == [before[f][0] for f in flows]
    assert replicas == ["rt1" if destination == "rt2" else "rt2"] * 5
    moved = [net.switch.by_id[f] for f in flows]
    assert [(f.primary, f.replica) for f in moved] == list(zip([destination] * 5, replicas))
    migration = net.switch.migrations[flows[0]]
    assert migration.replicas == {f: "rt2" for f in flows}  # as before the move
    assert all(net.switch.migrations[f] is migration for f in flows)


def test_the_source_exports_by_column_and_keeps_what_becomes_the_replica(net):
    _, states = sequential(PACKETS, DOCUMENT)
    source, destination = net.runtimes["rt1"], net.runtimes["rt2"]
    command = _command(net, 6, "rt1", "rt2")
    flows = command[1]
    actors = {f: source.primaries[f] for f in flows}
    packed, kept = source.export(*command[1:])
    got_flows, seqs, got_states, logs, replicas = unpack(packed)
    assert got_flows == flows and replicas == ["rt1"] * 6
    assert [(s, t) for s, t in zip(seqs, got_states)] == [states[f] for f in flows]
    assert logs == {}  # every output of these idle flows is out
    assert not set(flows) & source.primaries.keys()
    assert [actor for actor, _ in kept] == [actors[f] for f in flows]
    source.keep(kept)
    for f in flows:
        assert source.replicas[f] is actors[f]
        assert (actors[f].replica, actors[f].log) == (None, {})
    # The destination installs them, and hands back the replica actors it held.
    held = {f: destination.replicas[f] for f in flows}
    installed, replaced = destination.import_batch(packed, "rt1")
    assert installed == flows
    assert sorted(replaced, key=lambda a: a.flow) == [held[f] for f in flows]
    assert not set(flows) & destination.replicas.keys()
    assert {f: (destination.primaries[f].seq, destination.primaries[f].states)
            for f in flows} == {f: states[f] for f in flows}
    assert all(destination.primaries[f].replica == "rt1" for f in flows)


def test_a_log_not_yet_let_out_travels_and_stays_with_the_kept_replica(net):
    """Outputs the switch has not let out go with the state and stay in the source's
    copy, trimmed to what the switch's mark says is not out."""
    source = net.runtimes["rt1"]
    to, flows, marks, replicas = _command(net, 3, "rt1", "rt2")
    actor = source.primaries[flows[1]]
    pending = {actor.seq: actor.log.get(actor.seq, "out")}
    actor.log = {actor.seq - 1: "older", **pending}
    marks = [marks[0], actor.seq - 1, marks[2]]
    packed, kept = source.export(flows, marks, replicas)
    assert unpack(packed)[3] == {1: pending}
    source.keep(kept)
    assert source.replicas[flows[1]].log == pending
    assert source.replicas[flows[1]].log is not unpack(packed)[3][1]


def test_what_a_handler_leaves_for_later_is_done_before_the_next_message(net):
    """The source keeps its copy after ``migrate_in`` is out, but before it handles the
    next message: a delta the destination sends right away for the moved flow (the
    source is now its replica) lands on that copy, not on an empty one."""
    source, destination = net.runtimes["rt1"], net.runtimes["rt2"]
    command = _command(net, 1, "rt1", "rt2")
    flow = command[1][0]
    source.on_migrate_out("switch", command)
    assert flow not in source.replicas and source.after  # not yet: left for later
    kind, packed = net.channels[("rt1", "rt2")].popleft()
    destination.on_migrate_in("rt1", packed)
    lane = [p for p in PACKETS if net.switch.flows[flow_key(p)].id == flow]
    extra = lane[-1]._replace(id=len(PACKETS))
    seq = len(lane) + 1
    destination.on_packets("switch", [(flow, seq, "rt1", seq - 1, extra)])
    script = [[("deltas", "rt2", (source.session, destination.deltas.pop("rt1")))]]

    def receive(timeout_s, limit=4096):
        if script:
            return script.pop(0)
        source.running = False
        return []

    close = source.endpoint.close
    source.endpoint.receive, source.endpoint.close = receive, lambda: None
    source.serve()
    source.endpoint.close = close  # (closed with the net)
    _, states = sequential(lane + [extra], DOCUMENT)
    copy = source.replicas[flow]
    assert (copy.seq, copy.states) == states[0] and not source.after
    acks = [ack for kind, batch in net.channels[("rt1", "switch")] if kind == "acks"
            for ack in batch]
    assert [ack[:2] for ack in acks] == [(flow, seq)]  # the replica acknowledged it
