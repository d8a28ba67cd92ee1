"""Per-flow connection state machines of the L3/L4 NFs, as plain per-packet steps.

Two machines, each a pure function ``step(state, packet class) -> (state, outcome)``
that the reference NFs call packet by packet and the tensor kernels tabulate once
(``table``) to run as a segmented scan. Writing the logic once keeps the two
engines on one meaning; the tests check the kernels' scan, time-outs and state
tables against the reference driven packet by packet.

**Connection tracking** (firewall), after Linux conntrack reduced to the states
a middlebox on the path needs: a TCP flow is created by a SYN without ACK that
the ACL allows (state ``SYN_SENT``), answered by SYN+ACK from the other side
(``SYN_RECV``), established by the initiator's ACK; a FIN moves it to
``FIN_F``/``FIN_R`` (initiator's/responder's FIN), the other side's FIN to
``CLOSING``; a RST from either side ends it (the RST passes). A TCP packet with
no flow that is not a SYN is dropped (``no_conn``), one that does not fit the
state (a SYN in an established flow, data before the handshake) is dropped
(``invalid``) and leaves the state as it was. UDP flows exist from their first
allowed packet. The ACL is matched against the packet that creates the flow,
as client -> server.

**Sessions** (NAT, load balancer): a flow's session starts at its first packet
(``START``: the NF binds a port or picks a backend), follows FINs the same way,
and ends after a RST (``END``). A RST with no session is dropped
(``no_session``).

States carry the side that started the flow (``orient``); a packet is *forward*
when it comes from that side. Time-outs are per state (``L4Timeouts``): a packet
that comes later than the time-out after the flow's previous packet finds the
flow gone (``state == NONE``) and starts over.
"""

from __future__ import annotations

from enum import IntEnum

from ..traffic.pcap import ACK, FIN, RST, SYN, UDP


class Verdict(IntEnum):
    """What an NF does with a packet; every value but PASS is a drop reason."""

    PASS = 0
    ACL = 1
    NO_CONN = 2
    INVALID = 3
    NO_SESSION = 4
    POOL_EXHAUSTED = 5
    RATE = 6


DROP_REASONS = {v.value: v.name.lower() for v in Verdict if v != Verdict.PASS}


class Conn(IntEnum):
    NONE = 0
    SYN_SENT = 1
    SYN_RECV = 2
    ESTABLISHED = 3
    FIN_F = 4
    FIN_R = 5
    CLOSING = 6
    UDP = 7


class Session(IntEnum):
    NONE = 0
    OPEN = 1
    FIN_F = 2
    FIN_R = 3
    CLOSING = 4
    UDP = 5


class Event(IntEnum):
    NOTHING = 0
    START = 1
    END = 2  # the session ends after this packet


def conn_step(state: Conn, forward: bool, flags: int, proto: int, acl_allows: bool
              ) -> tuple[Conn, Verdict]:
    """Connection tracking for one packet; ``forward`` is meaningless when ``state`` is NONE."""
    syn, ack, fin, rst = bool(flags & SYN), bool(flags & ACK), bool(flags & FIN), bool(flags & RST)
    if state == Conn.NONE:
        if not acl_allows:
            return Conn.NONE, Verdict.ACL
        if proto == UDP:
            return Conn.UDP, Verdict.PASS
        if syn and not ack and not rst and not fin:
            return Conn.SYN_SENT, Verdict.PASS
        return Conn.NONE, Verdict.NO_CONN
    if state == Conn.UDP:
        return Conn.UDP, Verdict.PASS
    if rst:
        return Conn.NONE, Verdict.PASS
    if state == Conn.SYN_SENT:
        if forward and syn and not ack:
            return state, Verdict.PASS
        if not forward and syn and ack:
            return Conn.SYN_RECV, Verdict.PASS
        return state, Verdict.INVALID
    if state == Conn.SYN_RECV:
        if not forward and syn and ack:
            return state, Verdict.PASS
        if forward and ack and not syn:
            return (Conn.FIN_F if fin else Conn.ESTABLISHED), Verdict.PASS
        return state, Verdict.INVALID
    if syn:
        return state, Verdict.INVALID
    if not fin:
        return state, Verdict.PASS
    if state == Conn.ESTABLISHED:
        return (Conn.FIN_F if forward else Conn.FIN_R), Verdict.PASS
    if (state == Conn.FIN_F and not forward) or (state == Conn.FIN_R and forward):
        return Conn.CLOSING, Verdict.PASS
    return state, Verdict.PASS


def session_step(state: Session, forward: bool, flags: int, proto: int
                 ) -> tuple[Session, Event, Verdict]:
    """A NAT/LB session for one packet."""
    fin, rst = bool(flags & FIN), bool(flags & RST)
    if state == Session.NONE:
        if rst:
            return Session.NONE, Event.NOTHING, Verdict.NO_SESSION
        if proto == UDP:
            return Session.UDP, Event.START, Verdict.PASS
        return (Session.FIN_F if fin else Session.OPEN), Event.START, Verdict.PASS
    if rst:
        return Session.NONE, Event.END, Verdict.PASS
    if not fin or state in (Session.UDP, Session.CLOSING):
        return state, Event.NOTHING, Verdict.PASS
    if state == Session.OPEN:
        return (Session.FIN_F if forward else Session.FIN_R), Event.NOTHING, Verdict.PASS
    if (state == Session.FIN_F and not forward) or (state == Session.FIN_R and forward):
        return Session.CLOSING, Event.NOTHING, Verdict.PASS
    return state, Event.NOTHING, Verdict.PASS


def conn_timeouts_us(t) -> dict[Conn, int]:
    """Idle time-out of each connection state (``L4Timeouts`` -> microseconds)."""
    us = {name: int(round(getattr(t, name) * 1e6)) for name in
          ("syn_s", "established_s", "fin_s", "closing_s", "udp_s")}
    return {Conn.NONE: 1 << 62, Conn.SYN_SENT: us["syn_s"], Conn.SYN_RECV: us["syn_s"],
            Conn.ESTABLISHED: us["established_s"], Conn.FIN_F: us["fin_s"],
            Conn.FIN_R: us["fin_s"], Conn.CLOSING: us["closing_s"], Conn.UDP: us["udp_s"]}


def session_timeouts_us(t) -> dict[Session, int]:
    conn = conn_timeouts_us(t)
    return {Session.NONE: 1 << 62, Session.OPEN: conn[Conn.ESTABLISHED],
            Session.FIN_F: conn[Conn.FIN_F], Session.FIN_R: conn[Conn.FIN_R],
            Session.CLOSING: conn[Conn.CLOSING], Session.UDP: conn[Conn.UDP]}


# Packet classes for the tables: the flag bits that matter, UDP, the ACL's answer.
FLAG_BITS = (SYN, ACK, FIN, RST)
N_CLASSES = 64  # 4 flag bits, udp, acl_allows


def packet_class(flags, proto, acl_allows):
    """Class index 0..63 (ints or int64 arrays/tensors)."""
    bits = ((flags & SYN) > 0) * 1 + ((flags & ACK) > 0) * 2 + ((flags & FIN) > 0) * 4 \
        + ((flags & RST) > 0) * 8
    return bits + (proto == UDP) * 16 + acl_allows * 32


def _class_fields(c: int) -> tuple[int, int, bool]:
    flags = sum(bit for k, bit in enumerate(FLAG_BITS) if c >> k & 1)
    return flags, (UDP if c & 16 else 6), bool(c & 32)


def encode(state: int, orient: int) -> int:
    """A tensor state: 0 for NONE, else 1 + 2 * (state - 1) + orient."""
    return 0 if state == 0 else 1 + 2 * (state - 1) + orient


def decode(code: int) -> tuple[int, int]:
    return (0, 0) if code == 0 else ((code - 1) // 2 + 1, (code - 1) % 2)


def table(machine: str) -> tuple[list[list[int]], list[list[int]], list[list[int]], int]:
    """The machine as tables over (class * 2 + packet dir, encoded state): next encoded
    state, verdict and event; and the number of encoded states."""
    n_states = len(Conn) if machine == "conn" else len(Session)
    width = 1 + 2 * (n_states - 1)
    nxt, verdict, event = [], [], []
    for c in range(N_CLASSES):
        flags, proto, allows = _class_fields(c)
        for direction in (0, 1):
            row_n, row_v, row_e = [], [], []
            for code in range(width):
                state, orient = decode(code)
                orient = direction if state == 0 else orient
                forward = direction == orient
                if machine == "conn":
                    new, v = conn_step(Conn(state), forward, flags, proto, allows)
                    e = Event.NOTHING
                else:
                    new, e, v = session_step(Session(state), forward, flags, proto)
                row_n.append(encode(int(new), orient))
                row_v.append(int(v))
                row_e.append(int(e))
            nxt.append(row_n)
            verdict.append(row_v)
            event.append(row_e)
    return nxt, verdict, event, width
