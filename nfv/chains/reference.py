"""The L3/L4 NFs as per-packet reference logic: plain Python, one packet at a time.

This is the oracle the tensor kernels (``kernels.py``) are tested against, and the
interface other runtimes reuse (NFVactor's per-flow actors): every NF is an object
holding its per-flow state in a dict keyed by the flow key, with

* ``process(packet: Pkt) -> Verdict`` — one packet, in arrival order; rewrites
  ``packet``'s fields in place (NAT: source; LB: destination) and returns
  ``Verdict.PASS`` or the drop reason;
* ``sweep(now_us)`` — drop flows idle longer than their state's time-out (the
  engines call it at batch boundaries, at most once per ``sweep_interval_s``);
* ``end_batch()`` — NAT ports released during a batch return to the pool here;
* ``snapshot() -> dict`` — the per-flow state, engine-independent, for comparison.

Model (shared with the kernels):

* **firewall** — ACL (first match wins, else ``default``) on the packet that
  creates a flow, then connection tracking (``states.conn_step``); every packet
  of a tracked flow refreshes its idle time.
* **nat** — source NAT: a flow's session start takes the head of a FIFO pool of
  (address, port) bindings; forward packets leave with the binding as source,
  replies with the client's address as destination. A start that finds the pool
  empty leaves the session without binding: its packets are dropped
  (``pool_exhausted``) until it ends. A session closed by both FINs keeps its
  binding for ``closing_s``. Bindings come back at the end of the batch
  in which their session ended (RST, or a packet that found it timed out), or at
  a sweep (in flow-key order).
* **lb** — Maglev (Eisenbud et al., NSDI 2016): a prime-size lookup table filled
  from each backend's (offset, skip) permutation; a session start to the VIP takes
  ``table[flow_hash % size]`` and keeps it for the session (affinity survives
  ``set_backends``). Forward packets go to the backend, replies leave from the VIP.
* **monitor** — packets, bytes, first and last timestamp per flow.
* **rate-limit** — a token bucket per flow (``rate_bytes_per_s``, ``burst_bytes``),
  integer arithmetic in byte-microseconds so both engines agree exactly.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections import deque
from dataclasses import dataclass

from dl_nfv.artifacts.nfconfig import port_range

from .packets import flow_hash
from .states import (
    Conn,
    Event,
    Session,
    Verdict,
    conn_step,
    conn_timeouts_us,
    session_step,
    session_timeouts_us,
)

ANY_PROTO = 0


@dataclass(slots=True)
class Pkt:
    """One packet's fields as an NF sees them; ``key``/``dir`` from ``packets.key_pair``."""

    ts_us: int
    src: int
    dst: int
    sport: int
    dport: int
    proto: int
    flags: int
    wire_bytes: int
    key: tuple[int, int]
    dir: int


def compile_acl(spec) -> list[tuple[int, int, int, int, int, int, int, int, int, int]]:
    """ACL rules as (allow, proto, src, src_mask, dst, dst_mask, sport_lo, sport_hi,
    dport_lo, dport_hi) over IPv4; an IPv6 prefix never matches (mask -1)."""
    rules = []
    for rule in spec.acl:
        nets = []
        for text in (rule.src, rule.dst):
            if text == "any":
                nets += [0, 0]
                continue
            net = ipaddress.ip_network(text, strict=False)
            if net.version != 4:
                nets += [0, -1]
                continue
            nets += [int(net.network_address), int(net.netmask)]
        ports = []
        for text in (rule.src_port, rule.dst_port):
            ports += port_range(text)
        proto = {"any": ANY_PROTO, "tcp": 6, "udp": 17}[rule.proto.value]
        rules.append((int(rule.action.value == "allow"), proto, *nets, *ports))
    return rules


def acl_allows(rules, default_allow: bool, p: Pkt) -> bool:
    for allow, proto, src, smask, dst, dmask, slo, shi, dlo, dhi in rules:
        if proto not in (ANY_PROTO, p.proto) or smask < 0 or dmask < 0:
            continue
        if (p.src & smask) == src and (p.dst & dmask) == dst and slo <= p.sport <= shi \
                and dlo <= p.dport <= dhi:
            return bool(allow)
    return default_allow


class FirewallRef:
    """Stateful firewall: 5-tuple ACL + TCP connection tracking."""

    def __init__(self, spec):
        self.rules = compile_acl(spec)
        self.default_allow = spec.default.value == "allow"
        self.timeouts = conn_timeouts_us(spec.timeouts)
        self.flows: dict[tuple[int, int], list[int]] = {}  # key -> [state, orient, last_us]

    def process(self, p: Pkt) -> Verdict:
        entry = self.flows.get(p.key)
        state, orient = (entry[0], entry[1]) if entry else (0, p.dir)
        if entry and p.ts_us - entry[2] > self.timeouts[Conn(state)]:
            state, orient = 0, p.dir
        allows = acl_allows(self.rules, self.default_allow, p) if state == 0 else True
        new, verdict = conn_step(Conn(state), p.dir == orient, p.flags, p.proto, allows)
        if new == Conn.NONE:
            self.flows.pop(p.key, None)
        else:
            self.flows[p.key] = [int(new), orient, p.ts_us]
        return verdict

    def sweep(self, now_us: int) -> None:
        for key in sorted(k for k, (s, _, last) in self.flows.items()
                          if now_us - last > self.timeouts[Conn(s)]):
            del self.flows[key]

    def end_batch(self) -> None:
        pass

    def snapshot(self) -> dict:
        return {k: tuple(v) for k, v in self.flows.items()}


def pool_bindings(spec) -> list[tuple[int, int]]:
    """The NAT pool's (address, port) bindings in allocation order, address-major."""
    lo, hi = port_range(spec.ports)
    ports = range(lo, hi + 1)
    return [(int(ipaddress.IPv4Address(a)), port) for a in spec.pool for port in ports]


class _SessionRef:
    """What NAT and LB share: sessions per flow, time-outs, start/end events."""

    def __init__(self, spec):
        self.timeouts = session_timeouts_us(spec.timeouts)
        # key -> [state, orient, last_us, binding, peer_ip, peer_port]
        self.flows: dict[tuple[int, int], list[int]] = {}

    def _session(self, p: Pkt):
        """(record or None, state, orient, event, verdict) after ``p``; ends what timed out."""
        entry = self.flows.get(p.key)
        if entry and p.ts_us - entry[2] > self.timeouts[Session(entry[0])]:
            self.end(entry)
            del self.flows[p.key]
            entry = None
        state, orient = (entry[0], entry[1]) if entry else (0, p.dir)
        new, event, verdict = session_step(Session(state), p.dir == orient, p.flags, p.proto)
        return entry, int(new), orient, event, verdict

    def process(self, p: Pkt) -> Verdict:
        entry, new, orient, event, verdict = self._session(p)
        if verdict != Verdict.PASS:
            return verdict
        if event == Event.START:
            entry = [new, orient, p.ts_us, *self.start(p)]
        entry[0], entry[2] = new, p.ts_us
        verdict = self.rewrite(entry, p, p.dir == orient)
        if event == Event.END:
            self.end(entry)
            del self.flows[p.key]
        else:
            self.flows[p.key] = entry
        return verdict

    def sweep(self, now_us: int) -> None:
        for key in sorted(k for k, e in self.flows.items()
                          if now_us - e[2] > self.timeouts[Session(e[0])]):
            self.end(self.flows.pop(key), at_sweep=True)

    def snapshot(self) -> dict:
        return {k: tuple(v) for k, v in self.flows.items()}


class NatRef(_SessionRef):
    """Source NAT with a FIFO port pool."""

    def __init__(self, spec):
        super().__init__(spec)
        self.bindings = pool_bindings(spec)
        self.free: deque[int] = deque(range(len(self.bindings)))
        self.pending: list[int] = []
        self.translations = self.exhausted = self.peak_in_use = 0

    def start(self, p: Pkt) -> tuple[int, int, int]:
        if self.free:
            binding = self.free.popleft()
            self.translations += 1
            self.peak_in_use = max(self.peak_in_use, len(self.bindings) - len(self.free))
        else:
            binding = -1
            self.exhausted += 1
        return binding, p.src, p.sport

    def rewrite(self, entry: list[int], p: Pkt, forward: bool) -> Verdict:
        if entry[3] < 0:
            return Verdict.POOL_EXHAUSTED
        if forward:
            p.src, p.sport = self.bindings[entry[3]]
        else:
            p.dst, p.dport = entry[4], entry[5]
        return Verdict.PASS

    def end(self, entry: list[int], at_sweep: bool = False) -> None:
        if entry[3] >= 0:
            (self.free if at_sweep else self.pending).append(entry[3])

    def end_batch(self) -> None:
        self.free.extend(self.pending)
        self.pending.clear()

    def in_use(self) -> int:
        return len(self.bindings) - len(self.free) - len(self.pending)


def endpoint(text: str) -> tuple[int, int]:
    """``a.b.c.d[:port]`` -> (address, port or 0)."""
    address, _, port = text.partition(":")
    return int(ipaddress.IPv4Address(address)), int(port or 0)


def _maglev_hashes(name: str, size: int) -> tuple[int, int]:
    digest = hashlib.blake2b(name.encode(), digest_size=16).digest()
    return (int.from_bytes(digest[:8], "big") % size,
            int.from_bytes(digest[8:], "big") % (size - 1) + 1)


def maglev_table(names: list[str], size: int) -> list[int]:
    """Maglev's lookup table (Algorithm 1 of the paper): ``size`` (prime) entries, each
    the index of a backend in ``names``; backends take turns claiming their next
    preferred free entry, so their shares differ by at most one entry.
    O(size * log size) expected."""
    perms = [_maglev_hashes(name, size) for name in names]
    nxt = [0] * len(names)
    entry = [-1] * size
    filled = 0
    while True:
        for i, (offset, skip) in enumerate(perms):
            c = (offset + nxt[i] * skip) % size
            while entry[c] >= 0:
                nxt[i] += 1
                c = (offset + nxt[i] * skip) % size
            entry[c] = i
            nxt[i] += 1
            filled += 1
            if filled == size:
                return entry


class Backends:
    """Every backend the LB has known (ids stay valid) and the current Maglev table."""

    def __init__(self, names: list[str], size: int):
        self.names: list[str] = []
        self.size = size
        self.set(names)

    def set(self, names: list[str]) -> None:
        for name in names:
            if name not in self.names:
                self.names.append(name)
        local = maglev_table(list(names), self.size)
        self.table = [self.names.index(names[i]) for i in local]
        self.endpoints = [endpoint(n) for n in self.names]


class LoadBalancerRef(_SessionRef):
    """L4 load balancer with Maglev hashing and per-flow affinity."""

    def __init__(self, spec, backends: Backends | None = None):
        super().__init__(spec)
        self.backends = backends or Backends(list(spec.backends), spec.table_size)
        self.vip = None if spec.vip == "any" else endpoint(spec.vip)
        self.flows_per_backend: dict[int, int] = {}

    def set_backends(self, names: list[str]) -> None:
        self.backends.set(names)

    def start(self, p: Pkt) -> tuple[int, int, int]:
        backend = -1
        if self.vip is None or (p.dst == self.vip[0] and self.vip[1] in (0, p.dport)):
            backend = self.backends.table[flow_hash(*p.key) % self.backends.size]
            self.flows_per_backend[backend] = self.flows_per_backend.get(backend, 0) + 1
        return backend, p.dst, p.dport

    def rewrite(self, entry: list[int], p: Pkt, forward: bool) -> Verdict:
        if entry[3] >= 0:
            if forward:
                address, port = self.backends.endpoints[entry[3]]
                p.dst, p.dport = address, port or p.dport
            else:
                p.src, p.sport = entry[4], entry[5]
        return Verdict.PASS

    def end(self, entry: list[int], at_sweep: bool = False) -> None:
        pass

    def end_batch(self) -> None:
        pass


class MonitorRef:
    """Packets, bytes, first and last seen per flow; idle flows are exported at sweeps."""

    def __init__(self, spec):
        self.idle_us = int(round(spec.timeouts.established_s * 1e6))
        self.flows: dict[tuple[int, int], list[int]] = {}  # key -> [packets, bytes, first, last]
        self.exported = 0

    def process(self, p: Pkt) -> Verdict:
        entry = self.flows.get(p.key)
        if entry is None:
            self.flows[p.key] = [1, p.wire_bytes, p.ts_us, p.ts_us]
        else:
            entry[0] += 1
            entry[1] += p.wire_bytes
            entry[3] = p.ts_us
        return Verdict.PASS

    def sweep(self, now_us: int) -> None:
        for key in [k for k, e in self.flows.items() if now_us - e[3] > self.idle_us]:
            del self.flows[key]
            self.exported += 1

    def end_batch(self) -> None:
        pass

    def snapshot(self) -> dict:
        return {k: tuple(v) for k, v in self.flows.items()}


class RateLimiterRef:
    """A token bucket per flow, in byte-microseconds."""

    def __init__(self, spec):
        self.rate = spec.rate_bytes_per_s
        self.cap = spec.burst_bytes * 1_000_000
        self.max_dt = -(-self.cap // self.rate)
        self.idle_us = int(round(spec.timeouts.established_s * 1e6))
        self.flows: dict[tuple[int, int], list[int]] = {}  # key -> [tokens, last_us]

    def process(self, p: Pkt) -> Verdict:
        entry = self.flows.get(p.key)
        if entry is None:
            tokens = self.cap
        else:
            dt = min(max(p.ts_us - entry[1], 0), self.max_dt)
            tokens = min(self.cap, entry[0] + self.rate * dt)
        cost = p.wire_bytes * 1_000_000
        verdict = Verdict.PASS if tokens >= cost else Verdict.RATE
        if verdict == Verdict.PASS:
            tokens -= cost
        self.flows[p.key] = [tokens, p.ts_us]
        return verdict

    def sweep(self, now_us: int) -> None:
        for key in [k for k, e in self.flows.items() if now_us - e[1] > self.idle_us]:
            del self.flows[key]

    def end_batch(self) -> None:
        pass

    def snapshot(self) -> dict:
        return {k: tuple(v) for k, v in self.flows.items()}


# each L3/L4 NF of an l4_chain by its config name (``L4NfSpec.nf``)
REFERENCE = {"firewall": FirewallRef, "nat": NatRef, "lb": LoadBalancerRef,
             "monitor": MonitorRef, "rate-limit": RateLimiterRef}
