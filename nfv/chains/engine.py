"""Chains of L3/L4 NFs over batches of packets: the reference engine and the tensor engine.

A chain is a list of NFs built from an nf-config's ``l4_chain``, each with its own
per-flow state. Both engines take the same batches (``ChainPackets`` slices) and
return the same ``BatchResult``: per packet, the stage that dropped it (-1: sent),
the reason, and the header fields and checksums it leaves with.

* ``cpu`` — ``ReferenceChain``: packet by packet, NF by NF (``reference.py``).
* ``tensor`` — ``TensorChain``: the batch goes to the device once; the flow
  handler computes every packet's flow key and sorts the batch by flow then
  arrival (``_flow_order``); the batch's flows are looked up (new ones inserted)
  once in the chain's one flow table and their rows gathered once; each stage runs
  its kernel (``kernels.py``) on the packets still alive, reading and writing its
  columns in those rows; the rows are scattered back and the checksums updated
  (RFC 1624) at the end. Only the per-packet outcome comes back to the host.

At each batch boundary both engines sweep idle flows when ``sweep_interval_s``
of trace time has passed since the last sweep (first batch: none), and NAT's
released bindings return to its pool.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..traffic.pcap import TCP, UDP
from .flowtable import DeviceFlowTable
from .joint import carry
from .kernels import HOLDERS, FirewallKernel, LoadBalancerKernel, NatKernel, Sub
from .meters import MonitorKernel, RateLimiterKernel
from .ops import (
    arrays,
    nonzero,
    on_host,
    pick,
    put,
    put_columns,
    put_rows_t,
    sort_values,
    take,
    take_columns,
    take_rows_t,
    tensor,
)
from .packets import (
    ChainPackets,
    endpoint_keys,
    endpoint_pair,
    key_pair,
    mix_hash,
    rewrite_checksum_rows,
    rewrite_checksums,
)
from .reference import REFERENCE, Pkt
from .scan import Segments
from .states import Verdict, packet_class

KERNELS = {"firewall": FirewallKernel, "nat": NatKernel, "lb": LoadBalancerKernel,
           "monitor": MonitorKernel, "rate-limit": RateLimiterKernel}
# batch size from which _flow_order sorts once, by hash: on one core torch's stable sort with
# indices takes ~16x numpy's sort of values at 8k int64s (ops.sort_values)
ONE_SORT_FROM = 256
REWRITING = ("nat", "lb")  # NFs that rewrite addresses and ports
OUT_FIELDS = ("src", "dst", "sport", "dport", "ip_csum", "l4_csum")
# the columns the NFs read: ChainPackets' first fields, in its order
SORTED = ("ts_us", "src", "dst", "sport", "dport", "proto", "flags", "wire_bytes")
PER_PACKET = ("ts", "src", "dst", "sport", "dport", "wire", "dir", "arrival",
              "cls")  # Sub's per-packet fields


@dataclass(slots=True)
class BatchResult:
    """Per packet of a batch, in arrival order."""

    stage: np.ndarray  # -1: forwarded, else the index of the NF that dropped it
    reason: np.ndarray  # Verdict value
    fields: dict[str, np.ndarray]  # OUT_FIELDS
    stage_s: list[float] = field(default_factory=list)


class _Sweeper:
    def __init__(self, interval_s: float):
        self.interval_us = int(round(interval_s * 1e6))
        self.last_us: int | None = None

    def due(self, now_us: int) -> bool:
        if self.last_us is None:
            self.last_us = now_us
            return False
        if now_us - self.last_us >= self.interval_us:
            self.last_us = now_us
            return True
        return False


def _flow_order(k1, k2, hashes=None):
    """A permutation that groups the batch's packets by flow, each flow in arrival order;
    where the sorted batch's flows start (None: not computed); the keys, sorted. ``k1``,
    ``k2``: two words that tell the flows apart (the key's; on a CPU ``endpoint_pair``'s),
    int64 tensors or numpy arrays (a CPU's: numpy's calls cost less than torch's here).

    One sort of (flow hash, arrival) packed in an int64 (``hashes``, or ``packets.mix_hash``
    in the bits arrival leaves); in the smallest batches (where the hash's steps cost more
    than sorts of a few hundred keys), or where two flows of the batch share a hash (their
    packets may interleave), two stable sorts by key."""
    n = k1.shape[0]
    host = isinstance(k1, np.ndarray)
    if n >= max(2, ONE_SORT_FROM):
        shift = (n - 1).bit_length()
        if host:  # in place: no temporaries
            packed = mix_hash(k1, k2, 63 - shift) if hashes is None else hashes.copy()
            packed <<= shift
            packed |= np.arange(n)
            packed.sort()
        else:
            if hashes is None:
                hashes = mix_hash(k1, k2, 63 - shift)
            packed = sort_values((hashes << shift) | torch.arange(n, device=k1.device))
        order, h = packed & ((1 << shift) - 1), packed >> shift
        a, b = take(k1, order), take(k2, order)
        other = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
        if not bool(((h[1:] == h[:-1]) & other).any()):
            if host:
                start = np.ones(n, dtype=bool)
            else:
                start = torch.ones(n, dtype=torch.bool, device=k1.device)
            start[1:] = other
            return order, start, a, b
    if host:
        order = np.argsort(k2, kind="stable")
        order = order[np.argsort(k1[order], kind="stable")]
        return order, None, k1[order], k2[order]
    order = torch.sort(k2, stable=True).indices
    order = take(order, torch.sort(take(k1, order), stable=True).indices)
    return order, None, take(k1, order), take(k2, order)


def _compact(sub: Sub, kept):
    """The packets ``kept`` (positions in ``sub``) of ``sub``, as a new ``Sub`` with its own
    copy of the state of their flows; and those flows' positions in ``sub.state``."""
    sid = take(sub.seg.index, kept)
    seg = Segments.of(sid)
    flows = take(sid, seg.first)
    # row by row: stacking them first would be one more pass over the batch's memory
    packets = {name: take(getattr(sub, name), kept) for name in PER_PACKET}
    return Sub(**packets, keys=take_columns(sub.keys, flows), seg=seg,
               state=take_columns(sub.state, flows), held=take(sub.held, flows),
               original=sub.original, memo=carry(sub.memo, kept)), flows


class ReferenceChain:
    """The chain packet by packet (``--engine cpu``)."""

    def __init__(self, specs, *, sweep_interval_s: float = 1.0):
        self.names = [s.nf.value for s in specs]
        self.nfs = [REFERENCE[s.nf.value](s) for s in specs]
        self.sweeper = _Sweeper(sweep_interval_s)

    def run_batch(self, batch: ChainPackets) -> BatchResult:
        n = len(batch)
        if n and self.sweeper.due(int(batch.ts_us[0])):
            for nf in self.nfs:
                nf.sweep(int(batch.ts_us[0]))
        stage = np.full(n, -1, dtype=np.int64)
        reason = np.zeros(n, dtype=np.int64)
        out = {name: np.zeros(n, dtype=np.int64) for name in OUT_FIELDS}
        cols = [c.tolist() for c in (batch.ts_us, batch.src, batch.dst, batch.sport, batch.dport,
                                     batch.proto, batch.flags, batch.wire_bytes, batch.ip_csum,
                                     batch.l4_csum)]
        started = time.perf_counter()
        for i, (ts, src, dst, sport, dport, proto, flags, wire, ipc, l4c) in enumerate(zip(*cols)):
            k1, k2, direction = key_pair(src, sport, dst, dport, proto)
            p = Pkt(ts, src, dst, sport, dport, proto, flags, wire, (k1, k2), direction)
            for k, nf in enumerate(self.nfs):
                verdict = nf.process(p)
                if verdict != Verdict.PASS:
                    stage[i], reason[i] = k, int(verdict)
                    break
            new = {"src": p.src, "dst": p.dst, "sport": p.sport, "dport": p.dport}
            ip_new, l4_new = rewrite_checksums({"src": src, "dst": dst, "sport": sport,
                                                "dport": dport}, new, ipc, l4c, proto)
            for name, value in (*new.items(), ("ip_csum", ip_new), ("l4_csum", l4_new)):
                out[name][i] = value
        for nf in self.nfs:
            nf.end_batch()
        return BatchResult(stage=stage, reason=reason, fields=out,
                           stage_s=[time.perf_counter() - started])


class TensorChain:
    """The chain as batched torch kernels on ``device`` (``--engine tensor``)."""

    def __init__(self, specs, *, device="cpu", capacity: int = 1024,
                 sweep_interval_s: float = 1.0):
        self.device = torch.device(device)
        self.names = [s.nf.value for s in specs]
        self.table = DeviceFlowTable(capacity, self.device, {HOLDERS: 0})
        self.nfs = [KERNELS[s.nf.value](s, self.table, k, self.device)
                    for k, s in enumerate(specs)]
        for nf, after in zip(self.nfs, self.nfs[1:]):  # a firewall and the session NF after it
            if isinstance(nf, FirewallKernel) and isinstance(after, (NatKernel,
                                                                     LoadBalancerKernel)):
                nf.join(after)
        self.sweeper = _Sweeper(sweep_interval_s)
        # states.packet_class without the ACL bit by the flags' low five bits (SYN, ACK, FIN,
        # RST) + 32 for UDP
        self.flag_class = torch.tensor([packet_class(f & 0x1F, UDP if f & 0x20 else TCP, 0)
                                        for f in range(64)], dtype=torch.int64,
                                       device=self.device)
        # the same by the flags' byte + 256 for UDP (a CPU's ingress: one step fewer)
        self.byte_class = self.flag_class.numpy().take(
            [(f & 0x1F) + 32 * (f >> 8) for f in range(512)]) if self.device.type == "cpu" \
            else None
        self._fills, self._bits = self._column_fills()
        # a lower bound on every last-seen time in the table (None: the first batch's
        # start, set by the first batch), and the shortest idle time-out (``_sweep``)
        self.oldest: int | None = None
        self.min_timeout = min(nf.min_timeout() for nf in self.nfs)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _sweep(self, now_us: int) -> None:
        """Every NF forgets its flows idle past their time-out; entries nobody keeps go.

        Skipped where none can be: every last-seen time in the table is at least
        ``oldest`` (the oldest kept at the previous sweep, or the earliest packet since),
        so no flow is idle past the NFs' shortest time-out before ``oldest`` plus it. Else
        the live rows are gathered once ([flows, columns]) and every NF reads them."""
        if self.oldest is not None and now_us - self.oldest <= self.min_timeout:
            return
        live = self.nfs[0]._live()
        self.oldest = min([now_us] + [nf.sweep(now_us, live) for nf in self.nfs])
        slots, rows = live
        self.table.delete(slots[rows[:, self.table.index[HOLDERS]] == 0])

    def _flows(self, keys):
        """Every flow of the batch (``keys``: [2, flows]) in the table: its slots (the new
        flows inserted, in one probe for most: ``DeviceFlowTable.upsert``) and whether it was
        there before."""
        return self.table.upsert(keys[0], keys[1])

    @torch.inference_mode()  # no autograd bookkeeping: a few microseconds less per step
    def run_batch(self, batch: ChainPackets) -> BatchResult:
        n = len(batch)
        block = torch.from_numpy(batch.block())  # [columns, n], ChainPackets' field order
        if self.device.type != "cpu":
            block = block.to(self.device)
        times = [0.0] * (len(self.nfs) + 1)
        t0 = time.perf_counter()
        if n and self.sweeper.due(int(batch.ts_us[0])):
            self._sweep(int(batch.ts_us[0]))
        if n:
            earliest = int(batch.ts_us.min())
            self.oldest = earliest if self.oldest is None else min(self.oldest, earliest)
        order, sub = self._ingress(batch, block)
        out = torch.empty((4, n), dtype=torch.int64, device=self.device)
        slots, present = self._flows(sub.keys)
        state, sub.held = self._rows(slots, present)
        sub.state = state
        host = on_host(block)
        drops = []  # (stage, flow-sorted positions, reasons) of the packets each NF dropped
        rows = None  # the packets still alive (None: all of them)
        nested = []  # (parent state, flows, state) of each compaction
        self._sync()
        times[0] = time.perf_counter() - t0
        for k, nf in enumerate(self.nfs):
            t0 = time.perf_counter()
            sub.original = not any(m in REWRITING for m in self.names[:k])
            if sub.live is not None and not nf.takes_live(sub):  # the dropped packets out
                self._put_back(out, sub, rows)
                kept = torch.nonzero(sub.live).squeeze(1)
                rows = kept if rows is None else take(rows, kept)
                parent = sub.state
                sub, flows = _compact(sub, kept)
                nested.append((parent, flows, sub.state))
            # the verdicts by numpy on a CPU: steps over the batch cost less there
            verdict, live, alive = arrays(host, nf.process(sub), sub.live, rows)
            if verdict is not None and bool(verdict.any()):
                dropped = nonzero(verdict)
                drops.append((k, dropped if rows is None else take(alive, dropped),
                              take(verdict, dropped)))
                live = (verdict == 0) if live is None else live & (verdict == 0)
                sub.live = tensor(live)
            self._sync()
            times[k + 1] = time.perf_counter() - t0
            if live is not None and not bool(live.any()):  # every packet dropped
                break
        t0 = time.perf_counter()
        self._put_back(out, sub, rows)
        for nf in self.nfs:
            nf.end_batch()
        for parent, flows, inner in reversed(nested):  # compacted flows back into the parent
            put_columns(parent, flows, inner)
        put_rows_t(self.table.values, slots, state)
        # the entries no NF keeps (numpy's steps on a CPU)
        kept, flows = arrays(host, state[self.table.index[HOLDERS]], slots)
        self.table.delete(flows[kept == 0])
        result = self._egress(block, out, order, drops)
        times[0] += time.perf_counter() - t0
        return BatchResult(stage=result[6], reason=result[7],
                           fields=dict(zip(OUT_FIELDS, result)), stage_s=times)

    def _ingress(self, batch: ChainPackets, block):
        """The flow handling: the permutation that sorts the batch by flow then arrival, the
        columns the NFs read (the block's first rows) flow-sorted in one gather, and the
        ``Sub`` of every packet (its flows' table rows not yet read). On a CPU the keys, the
        sort, the segments and the classes by numpy over the block's memory."""
        if not on_host(block):
            k1, k2, direction = key_pair(block[1], block[3], block[2], block[4], block[5])
            order, start, k1, k2 = _flow_order(k1, k2)
            seg = Segments.of(k1, k2) if start is None else Segments.starting(start)
            keys = torch.stack([take(k1, seg.first), take(k2, seg.first)])
            s = dict(zip(SORTED, take_columns(block[:len(SORTED)], order)))
            cls = take(self.flag_class, (s["flags"] & 0x1F) + (s["proto"] == UDP) * 32)
            direction = take(direction, order)
        else:
            # the packets grouped by their endpoints, the key's words made per flow only
            lo, hi, direction = endpoint_pair(batch.src, batch.sport, batch.dst, batch.dport,
                                              batch.proto)
            order, start, lo, hi = _flow_order(lo, hi)
            if start is None:
                start = np.ones(lo.shape[0], dtype=bool)
                start[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
            first = start.nonzero()[0]
            last = np.append(first[1:], lo.shape[0]) - 1 if first.shape[0] else first
            seg = Segments(index=torch.from_numpy(np.cumsum(start) - 1),
                           first=torch.from_numpy(first), last=torch.from_numpy(last))
            keys = torch.from_numpy(np.stack(endpoint_keys(lo.take(first), hi.take(first))))
            direction = torch.from_numpy(direction.take(order))
            # the rows the NFs read, flow-sorted, and the flag classes, from the flags and the
            # protocol in arrival order (two rows fewer to gather)
            blk = block.numpy()
            s = dict(zip(SORTED[:5], np.take(blk[:5], order, axis=1)))
            s["wire_bytes"] = blk[SORTED.index("wire_bytes")].take(order)
            at = (blk[SORTED.index("proto")] == UDP) * 256
            at += blk[SORTED.index("flags")]
            cls = self.byte_class.take(at).take(order)
            s, cls = {name: torch.from_numpy(row) for name, row in s.items()}, \
                torch.from_numpy(cls)
            order = torch.from_numpy(order)
        sub = Sub(ts=s["ts_us"], src=s["src"], dst=s["dst"], sport=s["sport"], dport=s["dport"],
                  wire=s["wire_bytes"], keys=keys, dir=direction, arrival=order, seg=seg,
                  state=None, held=None, cls=cls)
        return order, sub

    def _column_fills(self):
        """Per table column, its fill value and the holder bit of the NF that owns it (the
        holders column: 0), as [columns, 1]."""
        index = self.table.index
        fills = torch.tensor([self.table.fills[name] for name in index], dtype=torch.int64,
                             device=self.device)
        bits = [0] * len(index)
        for nf in self.nfs:
            for name in nf.names.values():
                bits[index[name]] = nf.bit
        return fills.unsqueeze(1), torch.tensor(bits, dtype=torch.int64,
                                                device=self.device).unsqueeze(1)

    def _rows(self, slots, present):
        """The table rows at ``slots`` as [columns, flows], each NF's columns at their fills
        where the NF does not keep the flow (new flows, not ``present``: every column); the
        holder bits. On a CPU by numpy, which reads the rows of the present flows only (a new
        flow's row, at a random slot, is a cache miss that holds nothing it keeps)."""
        h = self.table.index[HOLDERS]
        if not on_host(slots):
            rows = take_rows_t(self.table.values, slots)
            own = (rows[h] & self._bits) != 0
            own[h] = True
            state = pick(own, rows, self._fills)
            return state, state[h].clone()
        bits, fills, slots, present = arrays(True, self._bits, self._fills, slots, present)
        state = np.repeat(fills, slots.shape[0], axis=1)
        at = present.nonzero()[0]
        if at.shape[0]:
            rows = np.take(self.table.values.numpy(), slots.take(at), axis=0).T
            own = (rows[h] & bits) != 0
            own[h] = True
            state[:, at] = np.where(own, rows, fills)
        return tensor(state), tensor(state[h].copy())

    @staticmethod
    def _put_back(out, sub: Sub, rows) -> None:
        """The rewritten addresses and ports of ``sub``'s packets into ``out``'s rows (flow
        order; ``rows``: the packets of ``sub``, None: all of them)."""
        if rows is None:
            torch.stack([sub.src, sub.dst, sub.sport, sub.dport], out=out)
        elif rows.numel():
            for row, name in enumerate(("src", "dst", "sport", "dport")):
                put(out[row], rows, getattr(sub, name))

    def _egress(self, block, out, order, drops) -> np.ndarray:
        """Every per-packet output back in arrival order, on the host: rows ``OUT_FIELDS``,
        stage, reason (``block``: the batch's columns as captured; ``out``: the header rows in
        flow order, scattered back in one call; stage and reason set for the dropped packets
        only; the checksums computed in arrival order, by numpy on a CPU)."""
        back = torch.empty((8, out.shape[1]), dtype=torch.int64, device=self.device)
        put_columns(back[:4], order, out)
        host = on_host(back)  # numpy's steps over the same memory cost less
        b, arrival = arrays(host, back, order)
        b[6] = -1
        b[7] = 0
        for k, gone, why in drops:  # the drops' positions and reasons: numpy's on a CPU
            at = take(arrival, gone)
            b[6][at] = k
            put(b[7], at, why)
        if host:
            c = block.numpy()
            b[4:6] = rewrite_checksum_rows(c[1:5], b[:4], c[8:10], c[5])
        else:
            back[4:6] = rewrite_checksum_rows(block[1:5], back[:4], block[8:10], block[5])
        return back.cpu().numpy()


def build_chain(specs, engine: str, *, device: str = "cpu", capacity: int = 1024,
                sweep_interval_s: float = 1.0):
    """A ``ReferenceChain`` (engine ``cpu``) or ``TensorChain`` (``tensor``)."""
    if engine == "cpu":
        return ReferenceChain(specs, sweep_interval_s=sweep_interval_s)
    return TensorChain(specs, device=device, capacity=capacity, sweep_interval_s=sweep_interval_s)
