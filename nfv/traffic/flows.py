"""The flow table: packets to flows (5-tuple, both directions one flow) to messages.

This is dl-nfv's one flow table. Each TCP flow runs a reassembly ``Stream``
per direction and frames the in-order bytes into messages: HTTP/1.1 messages
when the client's first bytes are an HTTP request, otherwise *turns* (the
bytes one side sends before the other side answers, cut at 64 KiB). Each UDP
datagram with a payload is one message. A flow ends on RST, when both sides have sent FIN and every
byte before each FIN has arrived, after ``idle_timeout_us`` without packets (the next packet with the same
5-tuple starts a new flow), or at the end of the trace. A SYN on a closed flow
starts a new flow.

``assemble.py`` is its array front end: flows whose segments arrive in order
are grouped and framed over columns, and every other flow is fed here.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from .http import REQUEST, RESPONSE, Framer, looks_like_http_request
from .pcap import ACK, FIN, RST, SYN, TCP, Packet
from .reassembly import Stream

TURN_LIMIT_BYTES = 64 * 1024
OTHER = 0  # message kind of a turn or a datagram


@dataclass(slots=True)
class Message:
    """One reassembled L7 unit of a flow, in completion order."""

    flow: int
    direction: int  # 0: client to server, 1: server to client
    payload: bytes
    header_len: int
    kind: int  # 0 other, 1 HTTP request, 2 HTTP response
    ts_us: int
    packets: int


@dataclass(slots=True)
class FlowState:
    id: int
    proto: int
    client: tuple[bytes, int]
    server: tuple[bytes, int]
    first_ts_us: int
    last_ts_us: int
    packets: int = 0
    wire_bytes: int = 0
    app: str = ""
    handshake: int = 0  # 1: client SYN seen, 2: then the server's SYN-ACK, 3: then an ACK
    closed: bool = False
    # reassembly state, given by the flow table to each TCP flow it builds; a UDP flow, or
    # one built over arrays (assemble.py), has none (the empty defaults are shared)
    streams: list | tuple = ()
    framers: list | tuple = ()
    seg_starts: list | tuple = ()  # per direction (TCP): a deque
    turn_dir: int = -1
    turn: bytearray | bytes = b""
    turn_base: int = 0
    early: list | tuple = ()


def handshake_step(state: int, direction: int, flags: int) -> int:
    """The next step of the three-way handshake, as Snort's ``flow:established`` sees it."""
    syn, ack = flags & SYN, flags & ACK
    if state == 0 and direction == 0 and syn and not ack:
        return 1
    if state == 1 and direction == 1 and syn and ack:
        return 2
    if state == 2 and direction == 0 and ack and not syn:
        return 3
    return state


class FlowTable:
    """Feed packets in capture order with ``add``; call ``close_all`` at the end.

    ``messages`` collects completed messages in completion order; ``flows``
    every flow ever seen, by id. O(1) amortised per packet plus the payload.
    """

    def __init__(self, stats: Counter, *, idle_timeout_us: int = 60_000_000,
                 window_bytes: int = 1 << 20):
        self.stats = stats
        self.idle_timeout_us = idle_timeout_us
        self.window_bytes = window_bytes
        self.active: dict[tuple, FlowState] = {}
        self.flows: list[FlowState] = []
        self.messages: list[Message] = []

    @staticmethod
    def key(pkt: Packet) -> tuple:
        a, b = (pkt.src, pkt.sport), (pkt.dst, pkt.dport)
        return (pkt.proto, a, b) if a <= b else (pkt.proto, b, a)

    def add(self, pkt: Packet) -> None:
        key = self.key(pkt)
        flow = self.active.get(key)
        if flow is not None and (pkt.ts_us - flow.last_ts_us > self.idle_timeout_us
                                 or (flow.closed and pkt.flags & (SYN | ACK) == SYN)):
            self._finish(flow)
            flow = None
        if flow is None:
            flow = self._new_flow(key, pkt)
        flow.packets += 1
        flow.wire_bytes += pkt.wire_bytes
        flow.last_ts_us = max(flow.last_ts_us, pkt.ts_us)
        direction = 0 if (pkt.src, pkt.sport) == flow.client else 1
        if pkt.proto == TCP:
            self._tcp(flow, direction, pkt)
        elif pkt.payload:
            flow.app = flow.app or "udp"
            self.messages.append(Message(flow.id, direction, pkt.payload, 0, OTHER, pkt.ts_us, 1))

    def _new_flow(self, key: tuple, pkt: Packet) -> FlowState:
        src, dst = (pkt.src, pkt.sport), (pkt.dst, pkt.dport)
        if pkt.proto == TCP and pkt.flags & (SYN | ACK) == (SYN | ACK):
            src, dst = dst, src
        flow = FlowState(len(self.flows), pkt.proto, src, dst, pkt.ts_us, pkt.ts_us)
        if pkt.proto == TCP:
            flow.streams = [Stream(self.stats, self.window_bytes), Stream(self.stats,
                                                                          self.window_bytes)]
            flow.seg_starts = [deque(), deque()]  # here, not per record: flows built over
            # arrays (assemble.py) never use them, and two deques weigh 1.5 KB
            flow.turn, flow.early = bytearray(), []
        self.flows.append(flow)
        self.active[key] = flow
        return flow

    def _tcp(self, flow: FlowState, direction: int, pkt: Packet) -> None:
        if flow.handshake < 3:
            flow.handshake = handshake_step(flow.handshake, direction, pkt.flags)
        if flow.closed:  # late ACKs and retransmissions after the end: counted, not read
            if pkt.payload:
                self.stats["tcp_bytes_after_close"] += len(pkt.payload)
            return
        chunks = flow.streams[direction].add(pkt.seq, pkt.payload, bool(pkt.flags & SYN))
        for offset, data in chunks:
            self._deliver(flow, direction, offset, data, pkt.ts_us)
        if pkt.flags & RST:
            self._finish(flow)
            return
        if pkt.flags & FIN:
            flow.streams[direction].mark_fin(pkt.seq, len(pkt.payload), bool(pkt.flags & SYN))
        if flow.streams[0].complete and flow.streams[1].complete:
            self._finish(flow)

    def _deliver(self, flow: FlowState, direction: int, offset: int, data: bytes,
                 ts_us: int) -> None:
        if not flow.app:
            if direction == 1 and not flow.closed:
                # the application is decided by the client's first bytes: hold the server's
                flow.early.append((offset, data, ts_us))
                return
            self._decide(flow, data if direction == 0 else b"")
            for early in flow.early:
                self._deliver(flow, 1, *early)
            flow.early.clear()
        flow.seg_starts[direction].append(offset)
        if flow.app == "http":
            for start, payload, header_len, kind in flow.framers[direction].feed(data, offset):
                self._emit(flow, direction, start, payload, header_len, kind, ts_us)
            return
        if flow.turn and flow.turn_dir != direction:
            self._emit_turn(flow, ts_us)
        if not flow.turn:
            flow.turn_dir, flow.turn_base = direction, offset
        flow.turn += data
        while len(flow.turn) >= TURN_LIMIT_BYTES:
            self._emit(flow, direction, flow.turn_base, bytes(flow.turn[:TURN_LIMIT_BYTES]), 0,
                       OTHER, ts_us)
            del flow.turn[:TURN_LIMIT_BYTES]
            flow.turn_base += TURN_LIMIT_BYTES

    def _decide(self, flow: FlowState, client_bytes: bytes) -> None:
        if looks_like_http_request(client_bytes):
            requests: deque = deque()
            flow.app = "http"
            flow.framers = [Framer(REQUEST, requests, self.stats),
                            Framer(RESPONSE, requests, self.stats)]
        else:
            flow.app = "tcp"

    def _emit_turn(self, flow: FlowState, ts_us: int) -> None:
        self._emit(flow, flow.turn_dir, flow.turn_base, bytes(flow.turn), 0, OTHER, ts_us)
        flow.turn.clear()

    def _emit(self, flow: FlowState, direction: int, start: int, payload: bytes, header_len: int,
              kind: int, ts_us: int) -> None:
        end = start + len(payload)
        starts = flow.seg_starts[direction]
        packets = 0
        while starts and starts[0] < end:
            starts.popleft()
            packets += 1
        self.messages.append(Message(flow.id, direction, payload, header_len, kind, ts_us,
                                     packets))

    def _finish(self, flow: FlowState) -> None:
        if flow.closed:
            return
        ts = flow.last_ts_us
        if flow.early and not flow.app:
            flow.app = "tcp"
            for early in flow.early:
                self._deliver(flow, 1, *early)
            flow.early.clear()
        for direction, stream in enumerate(flow.streams):
            missing, chunks = stream.flush()
            if missing and flow.app == "http":
                for start, payload, header_len, kind in flow.framers[direction].gap():
                    self._emit(flow, direction, start, payload, header_len, kind, ts)
            for offset, data in chunks:
                self._deliver(flow, direction, offset, data, ts)
        if flow.app == "http":
            for direction, framer in enumerate(flow.framers):
                for start, payload, header_len, kind in framer.finish():
                    self._emit(flow, direction, start, payload, header_len, kind, ts)
        elif flow.turn:
            self._emit_turn(flow, ts)
        flow.closed = True

    def close_all(self) -> None:
        """End every flow still open (end of the trace)."""
        for flow in list(self.active.values()):
            if not flow.closed:
                self._finish(flow)
