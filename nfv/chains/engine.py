"""Chains of L3/L4 NFs over batches of packets: the reference engine and the tensor engine.

A chain is a list of NFs built from an nf-config's ``l4_chain``, each with its own
per-flow state. Both engines take the same batches (``ChainPackets`` slices) and
return the same ``BatchResult``: per packet, the stage that dropped it (-1: sent),
the reason, and the header fields and checksums it leaves with.

* ``cpu`` — ``ReferenceChain``: packet by packet, NF by NF (``reference.py``).
* ``tensor`` — ``TensorChain``: the batch goes to the device once; the flow
  handler computes every packet's flow key and sorts the batch by flow then
  arrival (two stable sorts); each stage runs its kernel (``kernels.py``) on the
  packets still alive, and the checksums are updated (RFC 1624) at the end. Only
  the per-packet outcome comes back to the host.

At each batch boundary both engines sweep idle flows when ``sweep_interval_s``
of trace time has passed since the last sweep (first batch: none), and NAT's
released bindings return to its pool.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .kernels import (
    FirewallKernel,
    LoadBalancerKernel,
    MonitorKernel,
    NatKernel,
    RateLimiterKernel,
    Sub,
)
from .packets import ChainPackets, flow_hash, key_pair, rewrite_checksums
from .reference import REFERENCE, Pkt
from .scan import Segments
from .states import Verdict, packet_class

KERNELS = {"firewall": FirewallKernel, "nat": NatKernel, "lb": LoadBalancerKernel,
           "monitor": MonitorKernel, "rate-limit": RateLimiterKernel}
ONE_SORT_FROM = 16384  # batch size from which _flow_order sorts once, by hash
REWRITING = ("nat", "lb")  # NFs that rewrite addresses and ports
OUT_FIELDS = ("src", "dst", "sport", "dport", "ip_csum", "l4_csum")


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


def _flow_order(k1, k2, hashes):
    """A permutation that groups the batch's packets by flow, each flow in arrival order.

    In large batches, one sort of (32-bit flow hash, arrival) packed in an int64; in
    small ones (where a step's fixed cost outweighs a sort), or where two flows of the
    batch share a hash (their packets may interleave), two stable sorts by key."""
    n = k1.shape[0]
    if n >= max(2, ONE_SORT_FROM):
        order = torch.sort((hashes << (n - 1).bit_length())
                           | torch.arange(n, device=k1.device)).indices
        h, a, b = hashes[order], k1[order], k2[order]
        if not bool(((h[1:] == h[:-1]) & ((a[1:] != a[:-1]) | (b[1:] != b[:-1]))).any()):
            return order
    order = torch.sort(k2, stable=True).indices
    return order[torch.sort(k1[order], stable=True).indices]


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
        self.nfs = [KERNELS[s.nf.value](s, capacity, self.device) for s in specs]
        self.sweeper = _Sweeper(sweep_interval_s)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run_batch(self, batch: ChainPackets) -> BatchResult:
        n = len(batch)
        cols = {name: torch.from_numpy(np.ascontiguousarray(a)).to(self.device)
                for name, a in batch.columns().items()}
        times = [0.0] * (len(self.nfs) + 1)
        t0 = time.perf_counter()
        if n and self.sweeper.due(int(batch.ts_us[0])):
            for nf in self.nfs:
                nf.sweep(int(batch.ts_us[0]))
        k1, k2, direction = key_pair(cols["src"], cols["sport"], cols["dst"], cols["dport"],
                                     cols["proto"])
        hashes = flow_hash(k1, k2)
        order = _flow_order(k1, k2, hashes)
        s = {name: cols[name][order] for name in ("ts_us", "src", "dst", "sport", "dport",
                                                  "proto", "flags", "wire_bytes")}
        k1, k2, direction, hashes = k1[order], k2[order], direction[order], hashes[order]
        full = Segments.of(k1, k2)
        seg_id = full.index
        base_cls = packet_class(s["flags"], s["proto"], 0)
        stage = torch.full((n,), -1, dtype=torch.int64, device=self.device)
        reason = torch.zeros(n, dtype=torch.int64, device=self.device)
        alive = torch.ones(n, dtype=torch.bool, device=self.device)
        self._sync()
        times[0] = time.perf_counter() - t0
        for k, nf in enumerate(self.nfs):
            t0 = time.perf_counter()
            rows = torch.nonzero(alive).squeeze(1)
            if rows.numel() == 0:  # every packet dropped before this stage
                continue
            everyone = rows.numel() == n  # nothing dropped yet: no gathers, no scatters

            def take(t, rows=rows, everyone=everyone):
                return t if everyone else t[rows]

            sid = seg_id[rows]
            sub = Sub(ts=take(s["ts_us"]), src=take(s["src"]), dst=take(s["dst"]),
                      sport=take(s["sport"]), dport=take(s["dport"]), proto=take(s["proto"]),
                      flags=take(s["flags"]), wire=take(s["wire_bytes"]), k1=take(k1),
                      k2=take(k2), dir=take(direction), arrival=take(order),
                      seg=full if everyone else Segments.of(sid, torch.zeros_like(sid)),
                      hash=take(hashes), cls=take(base_cls),
                      original=not any(m in REWRITING for m in self.names[:k]))
            verdict = nf.process(sub)
            for name, value in (("src", sub.src), ("dst", sub.dst), ("sport", sub.sport),
                                ("dport", sub.dport)):
                if everyone:
                    s[name] = value
                else:
                    s[name][rows] = value
            dropped = verdict != 0
            gone = rows[dropped]
            stage[gone], reason[gone] = k, verdict[dropped]
            alive[gone] = False
            self._sync()
            times[k + 1] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for nf in self.nfs:
            nf.end_batch()
        result = self._egress(cols, s, order, stage, reason)
        times[0] += time.perf_counter() - t0
        return BatchResult(stage=result["stage"], reason=result["reason"],
                           fields={name: result[name] for name in OUT_FIELDS}, stage_s=times)

    def _egress(self, cols, s, order, stage, reason) -> dict[str, np.ndarray]:
        """Checksums, then every per-packet output back in arrival order, on the host."""
        final = {}
        for name in ("src", "dst", "sport", "dport"):
            back = torch.empty_like(s[name])
            back[order] = s[name]
            final[name] = back
        ip_new, l4_new = rewrite_checksums(cols, final, cols["ip_csum"], cols["l4_csum"],
                                           cols["proto"])
        back_stage, back_reason = torch.empty_like(stage), torch.empty_like(reason)
        back_stage[order], back_reason[order] = stage, reason
        final.update(ip_csum=ip_new, l4_csum=l4_new, stage=back_stage, reason=back_reason)
        return {name: t.cpu().numpy() for name, t in final.items()}


def build_chain(specs, engine: str, *, device: str = "cpu", capacity: int = 1024,
                sweep_interval_s: float = 1.0):
    """A ``ReferenceChain`` (engine ``cpu``) or ``TensorChain`` (``tensor``)."""
    if engine == "cpu":
        return ReferenceChain(specs, sweep_interval_s=sweep_interval_s)
    return TensorChain(specs, device=device, capacity=capacity, sweep_interval_s=sweep_interval_s)
