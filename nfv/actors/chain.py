"""What a flow actor runs: a chain of per-packet NFs over one flow's state.

The NF interface is narrow, so that an NF needs no code for resilience: an NF has a
``name``, ``initial()`` (a new flow's state, an immutable picklable value) and
``process(state, packet) -> (packet or None, state)`` (the packet, possibly rewritten,
or None to drop it, and the flow's state after it). It keeps nothing between calls
outside the state it is handed, so the runtime can copy, replicate and move that state.

``Chain.process`` runs the NFs in order (a dropped packet is not seen by later NFs) and
returns the packet's *output* record, the flow's new states and the *delta*: the
``(position, state)`` pairs of the NFs whose state changed. Applying deltas in sequence
to a copy rebuilds the state exactly; applying one twice is prevented by the actors'
sequence numbers, not by the NFs.

``flow-monitor`` is an NF of this package: packets, payload bytes, first and last
timestamp of each flow (the counts of dl-nfv's flow monitor, per packet). Chains come
from an nf-config file whose chain names NFs of ``NF_FACTORIES``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from dl_nfv.artifacts.errors import InvalidArtifact, UnknownName
from dl_nfv.artifacts.io import read_document


class ActorPacket(NamedTuple):
    """One packet as the actors see it: headers, payload length, its place in the trace."""

    id: int
    ts_us: int
    proto: int
    src: bytes  # 4 or 16 raw address bytes
    sport: int
    dst: bytes
    dport: int
    flags: int
    length: int  # payload bytes
    wire_bytes: int


class Output(NamedTuple):
    """What left the system for one packet: ``dropped_by`` is "" for a packet that passed,
    and ``headers`` its (src, sport, dst, dport) as the chain left them."""

    packet: int
    flow: int
    dropped_by: str
    headers: tuple


def flow_key(p: ActorPacket) -> tuple:
    """Both directions of a conversation map to one key (the lower endpoint first)."""
    a, b = (p.src, p.sport), (p.dst, p.dport)
    return (p.proto, a, b) if a <= b else (p.proto, b, a)


class FlowMonitor:
    """Per flow: packets, payload bytes, first and last packet timestamp (µs)."""

    name = "flow-monitor"

    def __init__(self, spec: dict) -> None:
        if set(spec) - {"nf"}:
            raise ValueError(f"flow-monitor takes no options, got {sorted(set(spec) - {'nf'})}")

    def initial(self) -> tuple:
        return (0, 0, -1, -1)

    def process(self, state: tuple, packet: ActorPacket) -> tuple[ActorPacket, tuple]:
        packets, nbytes, first, _ = state
        return packet, (packets + 1, nbytes + packet.length,
                        packet.ts_us if first < 0 else first, packet.ts_us)


NF_FACTORIES: dict[str, Callable[[dict], Any]] = {"flow-monitor": FlowMonitor}


class Chain:
    """The NFs of a chain, in order, as one per-packet function over a flow's states."""

    def __init__(self, nfs: list) -> None:
        self.nfs = nfs
        self.names = [nf.name for nf in nfs]

    def initial(self) -> tuple:
        return tuple(nf.initial() for nf in self.nfs)

    def process(self, flow: int, states: tuple, packet: ActorPacket
                ) -> tuple[Output, tuple, tuple]:
        """(output, new states, delta) of ``packet`` on a flow in ``states``. O(chain)."""
        new = list(states)
        delta = []
        current: ActorPacket | None = packet
        dropped_by = ""
        for position, nf in enumerate(self.nfs):
            current, state = nf.process(states[position], current)
            if state != states[position]:
                new[position] = state
                delta.append((position, state))
            if current is None:
                dropped_by = nf.name
                break
        headers = () if current is None else (current.src, current.sport, current.dst,
                                                current.dport)
        return Output(packet.id, flow, dropped_by, headers), tuple(new), tuple(delta)


def apply_delta(states: tuple, delta: tuple) -> tuple:
    """``states`` with the delta's NF states replaced (what a replica does per packet)."""
    if not delta:
        return states
    new = list(states)
    for position, state in delta:
        new[position] = state
    return tuple(new)


def chain_document(path: str | Path | None) -> dict:
    """The chain of an nf-config file as plain data, read here so that runtimes on other
    hosts need not see the file: ``{"l4_chain": [...]}`` (the L3/L4 NFs of
    ``nfv/chains``, see ``l4.py``) or ``{"chain": [...]}`` (NFs of ``NF_FACTORIES``);
    no path: a flow monitor. Checked by building it once here."""
    if path is None:
        return {"chain": [{"nf": "flow-monitor"}]}
    doc = read_document(path)
    name = "l4_chain" if doc.get("l4_chain") else "chain"
    chain = doc.get(name)
    if not isinstance(chain, list) or not chain or not all(isinstance(s, dict) for s in chain):
        raise InvalidArtifact("expected a non-empty list of NF mappings", field=name,
                              file=str(path))
    document = {name: chain}
    build_chain(document, where=str(path))
    return document


def build_chain(document: dict, where: str = "chain"):
    """The chain of a chain document; ``UnknownName`` / ``InvalidArtifact`` naming the NF."""
    if "l4_chain" in document:
        from .l4 import L4Chain

        return L4Chain(document["l4_chain"], where=where)
    nfs = []
    for index, spec in enumerate(document["chain"]):
        name = spec.get("nf")
        factory = NF_FACTORIES.get(str(name))
        if factory is None:
            raise UnknownName(f"{where}: chain[{index}].nf: unknown NF {name!r} for flow actors; "
                              f"valid: {', '.join(sorted(NF_FACTORIES))} (or an l4_chain)")
        try:
            nfs.append(factory(spec))
        except (ValueError, TypeError) as exc:
            raise InvalidArtifact(str(exc), field=f"chain[{index}]", file=where) from None
    return Chain(nfs)
