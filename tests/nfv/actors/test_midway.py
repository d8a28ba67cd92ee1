"""A runtime that dies in the middle of a migration (its source, its destination, or
another runtime), or with no migration under way, under interleavings of senders a
seeded choice makes (promote and snapshots against deltas in flight, fencing): the
migration completes or reports that it failed, no packet is held forever, and the
outputs and final states are those of the chain run sequentially. The processes are
in this one (``net.Net``), their messages delivered one at a time."""

from __future__ import annotations

import random

import pytest

from dl_nfv.nfv.actors.chain import build_chain, chain_document
from dl_nfv.nfv.actors.cluster import load_cluster
from dl_nfv.nfv.actors.traffic import interleaved
from tests.conftest import EXAMPLES

from .conftest import cluster_text, free_ports, sequential
from .net import Net

PACKETS = interleaved(flows=12, packets_per_flow=8, seed=5)
DOCUMENT = chain_document(EXAMPLES / "nf" / "fw-nat-lb.yaml")
EXPECTED_OUTPUTS, EXPECTED_STATES = sequential(PACKETS, DOCUMENT)


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("midway") / "cluster.yaml"
    path.write_text(cluster_text(free_ports(4)))
    return load_cluster(path)


def _run(spec, mode: str, destination: str, victim: str, seed: int) -> Net:
    rng = random.Random(seed)
    net = Net(spec, build_chain(DOCUMENT), seed)
    half = len(PACKETS) // 2
    for start in range(0, half, 8):
        net.packets(PACKETS[start:start + 8])
        for _ in range(rng.randrange(0, 12)):
            net.step()
    if mode:
        net.migrate(3, "rt1", destination, mode)
    for _ in range(rng.randrange(0, 24)):
        net.step()
    net.switch.on_packets("client", PACKETS[half:half + 8])  # routed, not yet sent
    if victim:
        net.kill(victim)
    net.switch.flush()
    for start in range(half + 8, len(PACKETS), 8):
        net.packets(PACKETS[start:start + 8])
        for _ in range(rng.randrange(0, 12)):
            net.step()
    net.run()
    return net


def _check(spec, mode: str, destination: str, victim: str, seed: int) -> None:
    net = _run(spec, mode, destination, victim, seed)
    try:
        outputs = sorted(net.outputs, key=lambda o: o.packet)
        assert outputs == EXPECTED_OUTPUTS  # every packet out once, as the chain says
        last: dict[int, int] = {}
        for output in net.outputs:  # and in order within its flow
            assert last.get(output.flow, -1) < output.packet
            last[output.flow] = output.packet
        assert net.states() == EXPECTED_STATES
        live = [n for n in net.runtimes if n not in net.killed]
        held = [f for n in live for f, a in net.runtimes[n].primaries.items()
                if a.held is not None]
        assert held == []
        if mode:
            (kind, result), = net.replies
            assert kind == "migrated" and result["flows"] == 3
            assert ("failed" in result) <= (victim in ("rt1", destination))
        assert net.switch.recoveries == [] and not net.switch.migrations
        for flow, (seq, _) in EXPECTED_STATES.items():  # one up-to-date replica elsewhere
            copies = [(n, net.runtimes[n].replicas[flow].seq) for n in live
                      if flow in net.runtimes[n].replicas]
            primary = net.switch.by_id[flow].primary
            assert [c for c in copies if c[0] != primary] == [
                (net.switch.by_id[flow].replica, seq)], (flow, copies, primary)
    finally:
        net.close()


CASES = [(mode, destination, victim) for mode in ("actor", "central")
         for destination in ("rt2", "rt3") for victim in ("", "rt1", "rt2", "rt3")] + [
    ("", "", victim) for victim in ("rt1", "rt2", "rt3")]  # a failure, no migration


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode, destination, victim", CASES)
def test_a_runtime_dying_mid_migration_loses_nothing(spec, mode, destination, victim, seed):
    _check(spec, mode, destination, victim, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 40))
@pytest.mark.parametrize("mode, destination, victim", CASES)
def test_a_runtime_dying_mid_migration_many_interleavings(spec, mode, destination, victim,
                                                         seed):
    _check(spec, mode, destination, victim, seed)
