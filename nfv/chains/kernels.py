"""The L3/L4 NFs as batched torch kernels over a flow-sorted batch.

The chain keeps every NF's per-flow state in one ``DeviceFlowTable`` (the NFs all
key on the packet's flow key as captured, so one lookup serves them all): each NF
owns its named columns and one bit of the ``holders`` column, set while it keeps
the flow. The engine looks the batch's flows up once, inserts the new ones and
gathers their table rows once, transposed (``Sub.state``: a contiguous row per table
column, an entry per flow of the batch), with each NF's columns set to their fill
values for the flows the NF does not keep (one masked select for every NF), so a
kernel reads a column as a plain view. A kernel reads and writes its columns there,
per flow, and runs on the packets that reached it (``Sub``: a subset of the batch,
still sorted by flow then arrival, or with the packets an NF before dropped in place
and masked, ``Sub.live``, where its ``takes_live`` allows) with tensor operations only
(numpy's over the same memory on a CPU: ``ops.arrays``) — the state machine
as a segmented scan (``scan.fsm_scan``), per-packet outcomes by gathers — and the
engine scatters the rows back once. The meaning is the reference's
(``reference.py``); where the reference's order across flows matters (NAT port
allocation, releases, sweeps) the kernel orders events by arrival or by flow key
the same way. ``process`` returns the per-packet verdict (None: it drops no packet)
and rewrites ``Sub``'s fields in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..traffic.pcap import ACK, TCP, UDP
from . import states as st
from .acl import match, rule_table
from .flowtable import DeviceFlowTable
from .joint import JOINT, JointScan
from .ops import (
    arrays,
    at_least,
    key_order,
    nonzero,
    on_host,
    pick,
    put_columns,
    spread,
    stable_order,
    stack,
    take,
    take_columns,
    tensor,
)
from .packets import MASK32, flow_hash
from .reference import Backends, compile_acl, endpoint, pool_bindings
from .scan import (
    Segments,
    fragile_states,
    fsm_scan,
    last_marked,
    previous_gap,
    quiet_rows,
)

PACKETS_PER_FLOW = 4  # the per-flow ACL needs more than this many packets per flow
HOLDERS = "holders"  # the table column with one bit per NF that keeps the flow
ARRIVAL_BOUND = 1 << 31  # above any packet's position in a batch
REWRITTEN = ("src", "dst", "sport", "dport")  # the Sub fields NAT and LB rewrite


@dataclass(slots=True)
class Sub:
    """The packets an NF sees, flow-sorted; ``arrival`` is the position in the batch.
    Per flow (segment): its key, its entry in every row of ``state`` and the ``held`` bits at
    the batch's start (the protocol is the key's low byte; flags only enter as ``cls``)."""

    ts: object
    src: object
    dst: object
    sport: object
    dport: object
    wire: object
    keys: object  # [2, flows]: each flow's key (packets.key_pair's k1, k2)
    dir: object
    arrival: object
    seg: Segments
    # [table columns, flows]: a column per flow of the batch's table rows, each NF's
    # columns at their fill values where the NF kept no state for the flow
    state: object
    held: object
    cls: object  # states.packet_class without the ACL bit
    original: bool = True  # addresses and ports as captured (no NAT/LB stage before)
    memo: dict = field(default_factory=dict)  # results NFs of this Sub may share
    # the packets no NF has dropped yet (None: all); an NF whose ``takes_live`` says so runs
    # with the dropped ones in place, which it neither steps, counts nor rewrites
    live: object = None


def session_rows(sub: Sub):
    """The session machine's row of each of ``sub``'s packets (class and direction), once per
    ``Sub``: the firewall's rows are these plus its ACL bit's (``st.table``'s order)."""
    got = sub.memo.get(("session", "classes"))
    if got is None:  # by numpy over the tensors' memory on a CPU
        cls, direction = arrays(on_host(sub.cls), sub.cls, sub.dir)
        got = sub.memo[("session", "classes")] = tensor(cls * 2 + direction)
    return got


def _tensor(values, device):
    return torch.tensor(values, dtype=torch.int64, device=device)


class _Stateful:
    """An NF's columns and holder bit in the chain's flow table; time-out sweeps."""

    columns: dict[str, int] = {}

    def __init__(self, table: DeviceFlowTable, index: int, device):
        self.device = device
        self.table = table
        self.bit = 1 << index
        self.names = {name: f"{index}.{name}" for name in self.columns}
        table.add_columns({self.names[n]: v for n, v in self.columns.items()})

    def col(self, name):
        return self.table.cols[self.names[name]]

    def _flows(self, sub: Sub):
        """Whether the NF kept each of ``sub``'s flows before this batch (a tensor; by numpy
        over its memory on a CPU)."""
        if on_host(sub.held):
            return torch.from_numpy((sub.held.numpy() & self.bit) != 0)
        return (sub.held & self.bit) != 0

    def _get(self, sub: Sub, name: str):
        """Table column ``name`` (a full name) for ``sub``'s flows: a row of ``sub.state``."""
        return sub.state[self.table.index[name]]

    def _set(self, sub: Sub, name: str, value) -> None:
        sub.state[self.table.index[name]] = value

    def _column(self, sub: Sub, name):
        """The NF's column ``name`` for ``sub``'s flows (its fill where it keeps none)."""
        return self._get(sub, self.names[name])

    def _store(self, sub: Sub, existed, keep, values: dict):
        """Write per-flow ``values`` into the batch's rows (every flow: the holder bit
        says which are kept; ``keep`` None: all); by numpy over their memory on a CPU."""
        host = on_host(sub.state)
        state, existed, keep = arrays(host, sub.state, existed, keep)
        rows = arrays(host, *values.values())
        h = self.table.index[HOLDERS]
        if keep is None:
            if not bool(existed.all()):
                state[h] |= self.bit
        else:
            state[h] = (state[h] & ~self.bit) | keep * self.bit
        at = [self.table.index[self.names[name]] for name in values]
        if at == list(range(at[0], at[0] + len(at))):  # adjacent columns: one write
            stack(rows, out=state[at[0]:at[0] + len(at)])
        else:
            for j, row in zip(at, rows):
                state[j] = row

    def held_slots(self):
        """The slots of the flows the NF keeps."""
        slots = self.table.live_slots()
        return slots[(take(self.table.cols[HOLDERS], slots) & self.bit) != 0]

    def forget(self, slots, live=None, at=None) -> None:
        """The NF no longer keeps these flows (the engine deletes entries nobody keeps);
        its bit also cleared in the sweep's rows ``live`` at positions ``at``."""
        holders = self.table.cols[HOLDERS]
        holders[slots] = holders[slots] & ~self.bit
        if live is not None:
            h = live[1][:, self.table.index[HOLDERS]]
            h[at] = h[at] & ~self.bit

    def _live(self):
        slots = self.table.live_slots()
        return slots, torch.index_select(self.table.values, 0, slots)

    def _expired(self, now_us: int, live=None):
        """Positions in ``live`` (the table's live slots and their rows, ``[flows, columns]``;
        None: gathered here) of the flows the NF keeps that have been idle past their
        time-out; the oldest last-seen time among those it keeps on (``1 << 62``: none)."""
        slots, rows = live = live or self._live()
        held = (rows[:, self.table.index[HOLDERS]] & self.bit) != 0
        last = rows[:, self.table.index[self.names["last"]]]
        over = (now_us - last) > self._timeout_of(rows)
        oldest = int(pick(held & ~over, last, 1 << 62).min()) if last.numel() else 1 << 62
        return torch.nonzero(held & over).squeeze(1), oldest, live

    def sweep(self, now_us: int, live=None) -> int:
        """Forget the flows idle past their time-out; the oldest last-seen time kept."""
        at, oldest, live = self._expired(now_us, live)
        self.forget(take(live[0], at), live, at)
        return oldest

    def min_timeout(self) -> int:
        """The shortest idle time-out of a flow the NF keeps."""
        return self.idle_us

    def end_batch(self) -> None:
        pass

    def takes_live(self, sub: Sub) -> bool:
        """Whether ``process`` may see ``sub`` with packets an NF before dropped (``live``)."""
        return False

    def items(self) -> dict:
        return self.table.items(self.held_slots(), list(self.names.values()))

    def snapshot(self) -> dict:
        return self.items()


class _Machine(_Stateful):
    """A flow's connection state as one of ``states``' machines, with per-state time-outs."""

    machine = ""

    def __init__(self, table, index: int, device, timeouts: dict):
        super().__init__(table, index, device)
        nxt, verdict, event, width = st.table(self.machine)
        self.next, self.verdict = _tensor(nxt, device), _tensor(verdict, device)
        self.event = _tensor(event, device)
        kind = st.Conn if self.machine == "conn" else st.Session
        self.timeouts = _tensor([timeouts[kind(st.decode(c)[0])] for c in range(width)],
                                device)
        self.data_rows = [(st.packet_class(flags, proto, acl) * 2 + d) for flags, proto in
                          ((ACK, TCP), (0, UDP)) for acl in (0, 1) for d in (0, 1)]
        self.quiet = quiet_rows(self.next, self.data_rows)
        self.fragile = fragile_states(self.next, self.quiet)

    def _timeout_of(self, rows):
        return take(self.timeouts, rows[:, self.table.index[self.names["state"]]].contiguous())

    def min_timeout(self) -> int:
        return int(self.timeouts[1:].min())

    def _scan(self, sub: Sub, cls, existed):
        """``fsm_scan`` from the flows' stored states; shared by NFs of one ``Sub`` that run
        the same machine from equal states (NAT then LB)."""
        s0 = self._column(sub, "state")
        last = self._column(sub, "last")
        got = self._shared(sub, cls)
        if got is not None:
            return got
        key = (self.machine, "scan")
        result = sub.memo.pop(JOINT, None) if self.machine == "session" else None
        if result is None:  # no joint scan with the firewall before (``joint``)
            gap = previous_gap(sub.ts, sub.seg, last, existed)
            result = fsm_scan(self.next, self.timeouts, cls, gap, sub.seg, s0, self.quiet,
                              self.fragile)
        # the columns are rows of ``sub.state``, which the NF's store overwrites: copies
        copies = [tensor(c.copy()) for c in arrays(True, s0, last)] if on_host(s0) else \
            [s0.clone(), last.clone()]
        sub.memo[key] = (self.timeouts, *copies, cls, result, sub.live)
        return result


    def _shared(self, sub: Sub, cls):
        """The scan of an NF before on ``sub`` that ran this machine from the states, last-seen
        times and classes this NF has (NAT then LB) over the same live packets (none dropped
        since: a packet that NF stepped and dropped never reaches this one), else None."""
        known = sub.memo.get(("shared", self.bit))  # asked before (``takes_live``)
        if known is not None and known[0] is sub.live:
            return known[1]
        got = sub.memo.get((self.machine, "scan"))
        shared = got[4] if got is not None and got[5] is sub.live \
            and torch.equal(got[0], self.timeouts) \
            and torch.equal(got[1], self._column(sub, "state")) \
            and torch.equal(got[2], self._column(sub, "last")) \
            and (got[3] is cls or torch.equal(got[3], cls)) \
            else None
        sub.memo[("shared", self.bit)] = (sub.live, shared)
        return shared


class FirewallKernel(_Machine):
    """ACL + connection tracking; state (encoded with orientation, see ``states``), last."""

    columns = {"state": 0, "last": 0}
    machine = "conn"

    def __init__(self, spec, table, index: int, device):
        super().__init__(table, index, device, st.conn_timeouts_us(spec.timeouts))
        self.rules = compile_acl(spec)
        self.default_allow = spec.default.value == "allow"
        self.rule_table = rule_table(self.rules, self.default_allow, device)
        self.joint: JointScan | None = None

    def join(self, session: _SessionKernel) -> None:
        """Scan with ``session``, the NF right after this one, as one machine (``joint``)."""
        self.joint = JointScan(self, session, self.data_rows)

    def snapshot(self) -> dict:
        """key -> (state, orient, last), the reference's form."""
        return {k: (*st.decode(v[0]), v[1]) for k, v in self.items().items()}

    def _match(self, src, dst, sport, dport, proto):
        """Per packet, the first matching rule's answer (``acl.match``)."""
        return match(self.rule_table, self.default_allow, src, dst, sport, dport, proto)

    def _acl(self, sub: Sub, scale: int = 1):
        """Per packet, whether the ACL allows it as client -> server (times ``scale``). On unrewritten headers
        a flow's packets carry its key's two endpoints, one way or the other, so the rules
        are matched twice per flow (each way between its key's two endpoints) and each
        packet takes the answer for its direction. That is twice the rule work over the
        flows and a dozen small steps instead of the rule work over the packets, so it is
        done where flows carry more than ``PACKETS_PER_FLOW`` packets on average."""
        seg = sub.seg
        n = sub.ts.shape[0]
        if not sub.original or seg.count * PACKETS_PER_FLOW > n:
            return self._match(sub.src, sub.dst, sub.sport, sub.dport,
                               take(sub.keys[1] & 0xFF, seg.index)) * scale
        # the flow key's endpoints (packets.key_pair): lower first; dir 1 runs higher -> lower
        host = on_host(sub.keys)  # by numpy over the tensors' memory
        k1, k2 = arrays(host, sub.keys)[0]  # rows of the numpy view (not torch's unbind)
        cat = np.concatenate if host else torch.cat
        lo_ip, hi_ip = (k1 >> 32) & MASK32, k1 & MASK32
        lo_port, hi_port, proto = k2 >> 24, (k2 >> 8) & 0xFFFF, k2 & 0xFF
        both = self._match(cat([lo_ip, hi_ip]), cat([hi_ip, lo_ip]), cat([lo_port, hi_port]),
                           cat([hi_port, lo_port]), cat([proto, proto])) * scale
        index, direction = arrays(host, seg.index, sub.dir)
        return take(both, index + direction * seg.count)

    def process(self, sub: Sub):
        existed = self._flows(sub)
        host = on_host(sub.cls)  # the steps over the packets by numpy on a CPU
        session, last, ts = arrays(host, session_rows(sub), sub.seg.last, sub.ts)
        # the ACL's answer is class bit 32 (``states.packet_class``), 64 in a row
        rows = session + arrays(host, self._acl(sub, 64))[0]
        cls = tensor(rows)
        both = None if self.joint is None else self.joint.run(sub, cls, existed)
        if both is None:
            found, after = arrays(host, *self._scan(sub, cls, existed)[:2])
            table, conn_of = self.verdict, None
        else:  # the product machine's states, whose verdicts are the firewall's (``joint``)
            found, after = arrays(host, *both)
            table, conn_of = self.joint.verdict, arrays(host, self.joint.parts[0])[0]
        verdict = take(arrays(host, table.reshape(-1))[0], rows * table.shape[1] + found)
        final = take(after, last)
        if conn_of is not None:
            final = take(conn_of, final)
        self._store(sub, existed, final != 0, {"state": final, "last": take(ts, last)})
        return tensor(verdict)


@dataclass(frozen=True, slots=True)
class _Decisions:
    """A session machine's outcome for the packets of a ``Sub``, from its scan alone."""

    verdict: object
    event: object
    ok: object  # the machine passes the packet
    start: object  # the packet starts a session
    timed_out: object
    rows: object  # positions of the starts
    heads_only: bool  # sessions start only at flows' first packets
    forward: object  # the packet comes from the side that started the session
    final: object  # per flow: the state after its last packet
    keep: object  # per flow: a session is left
    last_ts: object  # per flow: its last packet's time


class _SessionKernel(_Machine):
    """NAT and LB: sessions (``states.session_step``) with a binding and a peer per flow."""

    columns = {"state": 0, "last": 0, "binding": -1, "peer_ip": 0, "peer_port": 0}
    machine = "session"
    collects_releases = False  # the bindings of ended sessions go back somewhere (NAT)

    def __init__(self, spec, table, index: int, device):
        super().__init__(table, index, device, st.session_timeouts_us(spec.timeouts))
        # by (row: class and packet direction, state), as ``next``: whether the packet comes
        # from the side that started the session (a packet that finds none starts one)
        self.forward = torch.tensor([[code == 0 or st.decode(code)[1] == row % 2
                                      for code in range(self.next.shape[1])]
                                     for row in range(self.next.shape[0])], device=device)

    def snapshot(self) -> dict:
        """key -> (state, orient, last, binding, peer address, peer port), the reference's."""
        return {k: (*st.decode(v[0]), *v[1:]) for k, v in self.items().items()}

    def _decide(self, sub: Sub, existed) -> _Decisions:
        """The scan and every per-packet outcome that follows from it alone; shared, like the
        scan, by NFs of one ``Sub`` whose scans are shared (NAT then LB). On a CPU by numpy
        over the tensors' memory (its calls cost less on vectors of a batch): the outcomes
        are then numpy arrays."""
        seg = sub.seg
        cls = session_rows(sub)
        scanned = self._scan(sub, cls, existed)
        got = sub.memo.get((self.machine, "decide"))
        if got is not None and got[0] is scanned:
            return got[1]
        host = on_host(cls)
        found, after, timed_out, cls, first, last, ts, live = arrays(
            host, *scanned, cls, seg.first, seg.last, sub.ts, sub.live)
        verdicts, events, forward = arrays(host, self.verdict.reshape(-1),
                                           self.event.reshape(-1), self.forward.reshape(-1))
        at = cls * self.next.shape[1] + found
        verdict, event, forward = take(verdicts, at), take(events, at), take(forward, at)
        ok = verdict == st.Verdict.PASS
        if live is None:
            last_ts = take(ts, last)
        else:  # the dropped packets leave the state as it was (``takes_live``)
            ok &= live
            # each flow's last live packet, else the table's
            _, at = arrays(host, *seg.ends_of(sub.live))
            last_ts = pick(at >= 0, take(ts, at_least(at, 0)),
                           arrays(host, self._column(sub, "last"))[0])
        start = ok & (event == st.Event.START)
        at_head = take(start, first)
        heads_only = int(start.sum()) == int(at_head.sum())  # starts only at flows' first packets
        final = take(after, last)
        out = _Decisions(
            verdict=verdict, event=event, ok=ok, start=start, timed_out=timed_out,
            rows=first[at_head] if heads_only else nonzero(start),
            heads_only=heads_only, forward=forward,
            final=final, keep=final != 0, last_ts=last_ts)
        sub.memo[(self.machine, "decide")] = (scanned, out)
        return out

    def process(self, sub: Sub):
        seg = sub.seg
        existed = self._flows(sub)
        d = self._decide(sub, existed)
        host = isinstance(d.verdict, np.ndarray)  # numpy's steps on a CPU (``_decide``)
        verdict, event, ok, start, rows = d.verdict, d.event, d.ok, d.start, d.rows
        flow_binding = None  # each flow's binding, where it holds for all its packets
        index, ts, live = arrays(host, seg.index, sub.ts, sub.live)
        peer_ip, peer_port = arrays(host, *self.peer(sub))
        # the flows' (binding, peer address, peer port): three adjacent rows of the state
        j = self.table.index[self.names["binding"]]
        before = arrays(host, sub.state[j:j + 3])[0]
        begun = stack([self.start(sub, rows), take(peer_ip, rows), take(peer_port, rows)])
        if d.heads_only or not bool(take(arrays(host, seg.pos)[0], rows).any()):
            # sessions start only at flows' first packets: one value per flow
            per_flow = before.copy() if host else before.clone()
            put_columns(per_flow, take(index, rows), begun)
            p_ip, p_port = seg.spread(per_flow[1:])
            flow_binding = per_flow[0]
            binding = None  # per packet only where asked (``_packet_binding``)
        else:  # the latest start at or before each packet in its flow, else the table's
            latest = last_marked(start, seg)
            has = latest >= 0
            safe = at_least(latest, 0)
            binding, p_ip, p_port = (pick(has, take(spread(value, rows, ts), safe),
                                          take(col, index)) for value, col in zip(begun, before))
            last = arrays(host, seg.last)[0]
            per_flow = stack([take(binding, last), take(p_ip, last), take(p_port, last)])
        if self.collects_releases:
            self._releases(sub, d.timed_out, event, ok, (binding, flow_binding), before[0])
        fields = {name: arrays(host, getattr(sub, name))[0] for name in REWRITTEN}
        bound = self._bound(seg, ok, (binding, flow_binding))
        if bound is not None:  # the passed packets whose session holds none: dropped
            verdict = self.unbound(ok & ~bound, verdict)
        verdict = self.rewrite(fields, self._sides(sub, d, bound), p_ip, p_port, verdict,
                               self.targets(sub, binding, flow_binding))
        for name, value in fields.items():
            setattr(sub, name, tensor(value))
        self._store(sub, existed, d.keep, {"state": d.final, "last": d.last_ts})
        before[:] = per_flow
        if not bool(verdict.any()):  # one test, before any other step over the packets
            return None
        return tensor(verdict if live is None else verdict * live)

    @staticmethod
    def _sides(sub: Sub, d: _Decisions, bound):
        """(forward, reverse): the passed packets with a binding (``bound``, None: all) that
        come from the side that started the session and from the other; shared by the NFs
        of one ``Sub`` with one outcome where every packet has one (NAT then LB)."""
        if bound is None:
            got = sub.memo.get(("session", "sides"))
            if got is not None and got[0] is d:
                return got[1]
        ok = d.ok if bound is None else d.ok & bound
        sides = (ok & d.forward, ok & ~d.forward)
        if bound is None:
            sub.memo[("session", "sides")] = (d, sides)
        return sides

    def unbound(self, packets, verdict):
        """The verdicts with ``packets`` (passed, no binding) dropped where the NF drops them."""
        return verdict

    @staticmethod
    def _packet_binding(seg: Segments, bindings):
        """Each packet's binding from ``bindings``: (per packet, or None where it holds for
        whole flows; per flow, or None)."""
        binding, flow_binding = bindings
        return binding if binding is not None else seg.spread(flow_binding[None])[0]

    def _bound(self, seg: Segments, ok, bindings):
        """Per packet, whether its session holds a binding (``bindings``: as
        ``_packet_binding``'s); None where every flow with a packet the machine passes holds
        one for all its packets (numpy's: a test over the flows spares the rewrite's steps
        over the packets)."""
        flow_binding = bindings[1]
        if isinstance(flow_binding, np.ndarray) and ok.shape[0]:
            passed = np.logical_or.reduceat(ok, seg.first.numpy())
            if bool(((flow_binding >= 0) | ~passed).all()):
                return None
        return self._packet_binding(seg, bindings) >= 0

    def takes_live(self, sub: Sub) -> bool:
        """Where the scan comes from the firewall's joint one, or is shared with the session
        NF before: there the packets the firewall dropped left the session as it was, so
        they step nothing; a scan of the NF's own would step them."""
        return JOINT in sub.memo or self._shared(sub, session_rows(sub)) is not None

    def _releases(self, sub, timed_out, event, ok, bindings, table_binding):
        """Bindings of sessions that ended in this batch, in arrival order (``bindings``: as
        ``_packet_binding``'s; ``table_binding``: each flow's before the batch)."""
        gone = timed_out | (ok & (event == st.Event.END))
        if not bool(gone.any()):
            return
        binding = self._packet_binding(sub.seg, bindings)
        rows = nonzero(gone)
        pos, index, arrival = arrays(isinstance(gone, np.ndarray), sub.seg.pos, sub.seg.index,
                                     sub.arrival)
        # a time-out ends the session the flow's previous packet left
        prev_binding = pick(take(pos, rows) > 0, take(binding, at_least(rows - 1, 0)),
                            take(table_binding, take(index, rows)))
        values = pick(take(timed_out, rows), prev_binding, take(binding, rows))
        self.released(take(values, stable_order(take(arrival, rows), ARRIVAL_BOUND)))

    def released(self, bindings) -> None:
        pass

    def targets(self, sub: Sub, binding, flow_binding):
        """Per packet, the [address, port] its binding stands for; looked up per flow and
        spread to the packets where ``flow_binding`` holds for a whole flow (a large pool is
        then read once per flow, not at random once per packet)."""
        b = at_least(binding if flow_binding is None else flow_binding, 0)
        got = take_columns(arrays(isinstance(b, np.ndarray), self.target)[0], b)
        return got if flow_binding is None else sub.seg.spread(got)


class NatKernel(_SessionKernel):
    """Source NAT; the free bindings are a ring buffer (``head``, ``free``) on the device."""

    collects_releases = True

    def __init__(self, spec, table, index: int, device):
        super().__init__(spec, table, index, device)
        pool = pool_bindings(spec)
        self.pool_ip = _tensor([a for a, _ in pool], device)
        self.pool_port = _tensor([p for _, p in pool], device)
        self.target = torch.stack([self.pool_ip, self.pool_port])  # a binding's source
        self.size = len(pool)
        self.ring = torch.arange(self.size, dtype=torch.int64, device=device)
        self.head, self.free = 0, self.size
        self.pending = []
        self.translations = self.exhausted = self.peak_in_use = 0

    def start(self, sub: Sub, rows):
        """Bindings for the session starts at ``rows``: the k-th in arrival order takes the
        k-th free one (-1: none left); by numpy on a CPU (``rows`` a numpy array)."""
        if isinstance(rows, np.ndarray):
            arrival = sub.arrival.numpy()[rows]
            k = np.empty_like(arrival)
            k[np.argsort(arrival)] = np.arange(arrival.shape[0])  # arrivals are distinct
            ok = k < self.free
            got = np.where(ok, self.ring.numpy()[(self.head + k) % self.size], -1)
            self._took(int(ok.sum()), int(k.shape[0]))
            return got
        order = stable_order(take(sub.arrival, rows), ARRIVAL_BOUND)
        k = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(),
                                                                   device=order.device))
        ok = k < self.free
        got = take(self.ring, (self.head + k) % self.size)
        self._took(int(ok.sum()), int(order.numel()))
        return pick(ok, got, -1)

    def _took(self, taken: int, starts: int) -> None:
        """``taken`` of ``starts`` session starts got a binding, from the ring's head."""
        self.translations += taken
        self.exhausted += starts - taken
        if taken:
            self.peak_in_use = max(self.peak_in_use, self.size - (self.free - taken))
        self.head = (self.head + taken) % self.size
        self.free -= taken

    def peer(self, sub: Sub):
        return sub.src, sub.sport

    def unbound(self, packets, verdict):
        """Sessions that found the pool empty drop their packets."""
        return pick(packets, int(st.Verdict.POOL_EXHAUSTED), verdict)

    def rewrite(self, fields, sides, p_ip, p_port, verdict, targets):
        """The packets' verdicts; ``fields`` (``REWRITTEN``) rewritten in place (``sides``:
        the packets to rewrite from the session's start side and from the other)."""
        fwd, rev = sides
        fields["src"] = pick(fwd, targets[0], fields["src"])
        fields["sport"] = pick(fwd, targets[1], fields["sport"])
        fields["dst"] = pick(rev, p_ip, fields["dst"])
        fields["dport"] = pick(rev, p_port, fields["dport"])
        return verdict

    def released(self, bindings) -> None:
        self.pending.append(tensor(bindings[bindings >= 0]))

    def _push(self, bindings) -> None:
        """``bindings`` back at the ring's tail (by numpy on a CPU)."""
        r = int(bindings.shape[0])
        if r:
            host = on_host(self.ring)
            ring, bindings = arrays(host, self.ring, bindings)
            step = np.arange(r) if host else torch.arange(r, device=self.device)
            ring[(self.head + self.free + step) % self.size] = bindings
            self.free += r

    def end_batch(self) -> None:
        for part in self.pending:
            self._push(part)
        self.pending = []

    def sweep(self, now_us: int, live=None) -> int:
        at, oldest, live = self._expired(now_us, live)
        slots = take(live[0], at)
        order = key_order(self.table.k1[slots], self.table.k2[slots])
        bindings = self.col("binding")[slots[order]]
        self._push(bindings[bindings >= 0])
        self.forget(slots, live, at)
        return oldest

    def in_use(self) -> int:
        return self.size - self.free - sum(int(p.numel()) for p in self.pending)


class LoadBalancerKernel(_SessionKernel):
    """Maglev load balancer; the table and backend endpoints as tensors."""

    def __init__(self, spec, table, index: int, device, backends: Backends | None = None):
        super().__init__(spec, table, index, device)
        self.backends = backends or Backends(list(spec.backends), spec.table_size)
        self.vip = None if spec.vip == "any" else endpoint(spec.vip)
        self._load()
        self.flows_per_backend: dict[int, int] = {}

    def _load(self) -> None:
        self.maglev = _tensor(self.backends.table, self.device)
        self.ep_ip = _tensor([a for a, _ in self.backends.endpoints], self.device)
        self.ep_port = _tensor([p for _, p in self.backends.endpoints], self.device)
        self.target = torch.stack([self.ep_ip, self.ep_port])  # a binding's backend

    def set_backends(self, names: list[str]) -> None:
        self.backends.set(names)
        self._load()

    def start(self, sub: Sub, rows):
        """The backends of the session starts at ``rows`` (-1: not to the VIP); by numpy on a
        CPU (``rows`` a numpy array: a few dozen steps over the new flows)."""
        host = isinstance(rows, np.ndarray)
        index, keys, maglev, dst, dport = arrays(host, sub.seg.index, sub.keys, self.maglev,
                                                 sub.dst, sub.dport)
        flows = take(index, rows)
        chosen = take(maglev, flow_hash(take(keys[0], flows), take(keys[1], flows))
                      % self.backends.size)
        if self.vip is not None:
            to_vip = take(dst, rows) == self.vip[0]
            if self.vip[1]:
                to_vip &= take(dport, rows) == self.vip[1]
            chosen = pick(to_vip, chosen, -1)
        chosen_ = chosen[chosen >= 0]
        counts = np.bincount(chosen_, minlength=len(self.backends.names)) if host else \
            torch.bincount(chosen_, minlength=len(self.backends.names))
        self._count(counts.tolist())
        return chosen

    def _count(self, counts: list[int]) -> None:
        """New flows per backend (by index) into ``flows_per_backend``."""
        for b, c in enumerate(counts):
            if c:
                self.flows_per_backend[b] = self.flows_per_backend.get(b, 0) + c

    def peer(self, sub: Sub):
        return sub.dst, sub.dport

    def rewrite(self, fields, sides, p_ip, p_port, verdict, targets):
        """The packets' verdicts; ``fields`` (``REWRITTEN``) rewritten in place (``sides``:
        the packets to rewrite from the session's start side and from the other)."""
        fwd, rev = sides
        port = targets[1]
        fields["dst"] = pick(fwd, targets[0], fields["dst"])
        fields["dport"] = pick(fwd & (port > 0), port, fields["dport"])
        fields["src"] = pick(rev, p_ip, fields["src"])
        fields["sport"] = pick(rev, p_port, fields["sport"])
        return verdict
