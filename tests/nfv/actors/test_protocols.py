"""The messages each migration mode exchanges, counted on the switch and runtimes in one
process (``net.Net``): the actor mode sends a fixed number per runtime pair whatever the
number of flows; the central mode is OpenNF's loss-free, order-preserving move, a get,
a put and an acknowledgement per flow, the source's packets raised to the controller
and the source drained before the flows are re-routed."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest

from dl_nfv.nfv.actors.chain import build_chain, chain_document
from dl_nfv.nfv.actors.cluster import load_cluster
from dl_nfv.nfv.actors.traffic import interleaved
from tests.conftest import EXAMPLES

from .conftest import cluster_text, free_ports, sequential
from .net import Net

PACKETS = interleaved(flows=30, packets_per_flow=6, seed=7)
DOCUMENT = chain_document(EXAMPLES / "nf" / "fw-nat-lb.yaml")
MOVED = 6


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("protocols") / "cluster.yaml"
    path.write_text(cluster_text(free_ports(4)))
    return load_cluster(path)


def _migrate(spec, mode: str, seed: int) -> tuple[Net, Counter]:
    """Half the packets, then ``MOVED`` flows from rt1 to rt3 with the rest of the packets
    routed right after the command (so they reach the source mid-move); the messages sent
    from the command on, by (sender, receiver, kind)."""
    net = Net(spec, build_chain(DOCUMENT), seed)
    half = len(PACKETS) // 2
    net.packets(PACKETS[:half])
    net.run()
    net.sent.clear()
    net.migrate(MOVED, "rt1", "rt3", mode)
    net.packets(PACKETS[half:])
    net.run()
    return net, Counter(net.sent)


def _outputs_as_sequential(net: Net) -> None:
    outputs, states = sequential(PACKETS, DOCUMENT)
    assert sorted(net.outputs, key=lambda o: o.packet) == outputs
    last: dict[int, int] = {}
    for output in net.outputs:
        assert last.get(output.flow, -1) < output.packet
        last[output.flow] = output.packet
    assert net.states() == states
    assert net.switch.migrations == {} and net.replies[0][0] == "migrated"


@pytest.mark.parametrize("seed", range(3))
def test_actor_mode_sends_one_message_each_way_per_runtime_pair(spec, seed):
    net, sent = _migrate(spec, "actor", seed)
    try:
        _outputs_as_sequential(net)
        assert sent[("switch", "rt1", "migrate_out")] == 1
        assert sent[("rt1", "rt3", "migrate_in")] == 1
        assert sent[("rt3", "switch", "migrated")] == 1
        assert not any(kind in ("chunk", "put_perflow", "events") for *_, kind in sent)
    finally:
        net.close()


@pytest.mark.parametrize("seed", range(3))
def test_central_mode_is_opennf_loss_free_order_preserving_move(spec, seed):
    net, sent = _migrate(spec, "central", seed)
    try:
        _outputs_as_sequential(net)
        for step, count in ((("switch", "rt1", "enable_events"), 1),
                            (("switch", "rt1", "get_perflow"), 1),
                            (("rt1", "switch", "chunk"), MOVED),
                            (("switch", "rt3", "put_perflow"), MOVED),
                            (("rt3", "switch", "put_ack"), MOVED),
                            (("switch", "rt1", "disable_events"), 1),
                            (("rt1", "switch", "events_disabled"), 1)):
            assert sent[step] == count, step
        # the moving flows' packets reached the source after enable_events: raised to the
        # controller, which buffered and released them (the outputs above are in order)
        assert sent[("rt1", "switch", "events")] >= 1
        assert not any(kind in ("migrate_out", "migrate_in") for *_, kind in sent)
        moving = [f for f in net.switch.by_id if f.primary == "rt3"]
        assert len(moving) >= MOVED and all(f.buffer == {} for f in net.switch.by_id)
        assert all(not r.raising for r in net.runtimes.values())
    finally:
        net.close()


def test_messages_pickled_without_a_memo_round_trip():
    """The messaging layer writes a shared object once per reference (no memo): what is
    read back equals what was sent, named tuples and nested batches included."""
    from dl_nfv.nfv.actors.chain import Output
    from dl_nfv.nfv.actors.wire import Endpoint

    output = Output(*range(len(Output._fields)))
    shared = (1, (2, 3), "rt2")
    message = ("migrate_in", "rt1", (4, [(f, shared, {f: output}, None) for f in range(50)]))
    endpoint = Endpoint("probe")
    try:
        for _ in range(2):  # the pickler and its buffer are reused
            encoded = endpoint.encode(message)
            assert pickle.loads(encoded) == message
        assert len(encoded) > 50 * len(pickle.dumps(shared))  # each reference written out
    finally:
        endpoint.close()


def test_an_exact_wait_ends_at_its_time_or_at_the_first_message():
    """``Endpoint.wait`` (the replay client's pacing) waits the time given, fractions of a
    millisecond included, and ends when a message comes, which ``receive`` then takes."""
    import time

    from dl_nfv.nfv.actors.wire import Endpoint

    receiver, sender = Endpoint("probe"), Endpoint("peer")
    try:
        for wait_s in (0.0003, 0.004):
            began = time.perf_counter()
            assert receiver.wait(wait_s) is False
            assert time.perf_counter() - began >= wait_s
        sender.send(receiver.address, "hello", 7)
        assert receiver.wait(5.0) is True
        assert receiver.receive(0, exact=True) == [("hello", "peer", 7)]
        assert receiver.wait(0.001) is False  # taken: nothing waits any more
    finally:
        receiver.close()
        sender.close()
