"""A loopback cluster file on free ports, and the sequential reference a cluster must match."""

from __future__ import annotations

import socket

import pytest

from dl_nfv.nfv.actors.chain import Output, build_chain, flow_key

HEARTBEAT_MS = 10
TIMEOUT_MS = 150


def free_ports(count: int) -> list[int]:
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def cluster_text(ports: list[int], runtimes: int = 3, replication: bool = True) -> str:
    lines = ["kind: actors-cluster", "schema_version: 1",
             f'switch: {{name: switch, address: "127.0.0.1:{ports[0]}"}}', "runtimes:"]
    lines += [f'  - {{name: rt{i + 1}, address: "127.0.0.1:{ports[i + 1]}"}}'
              for i in range(runtimes)]
    lines += [f"heartbeat_ms: {HEARTBEAT_MS}", f"heartbeat_timeout_ms: {TIMEOUT_MS}",
              f"replication: {'true' if replication else 'false'}"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def cluster_file(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(cluster_text(free_ports(4)))
    return path


def sequential(packets, document) -> tuple[list[Output], dict]:
    """The chain run over each flow's packets in order, in one process: flow ids by first
    appearance (as the switch numbers them), outputs in packet order, final (seq, states)."""
    chain = build_chain(document)
    ids, states, outputs = {}, {}, []
    for packet in packets:
        flow = ids.setdefault(flow_key(packet), len(ids))
        seq, state = states.get(flow, (0, chain.initial()))
        output, state, _ = chain.process(flow, state, packet)
        states[flow] = (seq + 1, state)
        outputs.append(output)
    return outputs, states
