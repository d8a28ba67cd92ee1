"""The chain's per-flow meters as batched torch kernels: the flow monitor (packets, bytes,
first and last seen, by segmented sums) and the token-bucket rate limiter (a flow's
packets in rounds by their place in it). Their state lives in the chain's flow table
like every NF's (``kernels._Stateful``).
"""

from __future__ import annotations

import numpy as np
import torch

from . import states as st
from .kernels import Sub, _Stateful
from .ops import arrays, at_least, on_host, pick, take, tensor


class MonitorKernel(_Stateful):
    """Packets, bytes, first and last seen per flow (segmented sums)."""

    columns = {"packets": 0, "bytes": 0, "first": 0, "last": 0}

    def __init__(self, spec, table, index: int, device):
        super().__init__(table, index, device)
        self.idle_us = int(round(spec.timeouts.established_s * 1e6))
        self.exported = 0

    def process(self, sub: Sub):
        seg = sub.seg
        existed = self._flows(sub)
        host = on_host(sub.ts) and seg.count > 0  # segmented sums over the runs by numpy
        if host:
            first, last, wire = seg.first.numpy(), seg.last.numpy(), sub.wire.numpy()
            live = None if sub.live is None else sub.live.numpy()
            count = last - first + 1 if live is None else \
                np.add.reduceat(live.view(np.uint8), first, dtype=np.int64)
            size = np.add.reduceat(wire if live is None else wire * live, first)
        else:
            size = torch.zeros(seg.count, dtype=torch.int64, device=self.device)
            count = torch.bincount(seg.index, minlength=seg.count) if sub.live is None else \
                torch.zeros_like(size).index_add_(0, seg.index, sub.live.long())
            size.index_add_(0, seg.index, sub.wire if sub.live is None else sub.wire * sub.live)
        if sub.live is None:
            head, tail, keep = seg.first, seg.last, None
        else:  # only the live packets count; a flow with none is left as it was
            head, tail = seg.ends_of(sub.live)
            keep = existed | tensor(count > 0)
        ts, head, tail, existed_, packets, size_, first_seen, last_seen = arrays(
            host, sub.ts, head, tail, existed, self._column(sub, "packets"),
            self._column(sub, "bytes"), self._column(sub, "first"), self._column(sub, "last"))
        last = take(ts, at_least(tail, 0))
        self._store(sub, existed, keep,
                    {"packets": packets + count, "bytes": size_ + size,
                     "first": pick(existed_, first_seen,
                                   take(ts, pick(head < ts.shape[0], head, ts.shape[0] - 1))),
                     "last": last if keep is None else pick(count > 0, last, last_seen)})
        return None  # the monitor drops nothing

    def takes_live(self, sub: Sub) -> bool:
        return True

    def _timeout_of(self, rows):
        return self.idle_us

    def sweep(self, now_us: int, live=None) -> int:
        at, oldest, live = self._expired(now_us, live)
        self.exported += int(at.numel())
        self.forget(take(live[0], at), live, at)
        return oldest


class RateLimiterKernel(_Stateful):
    """Token bucket per flow; the packets of a flow in rounds by their place in it."""

    columns = {"tokens": 0, "last": 0}

    def __init__(self, spec, table, index: int, device):
        super().__init__(table, index, device)
        self.rate = spec.rate_bytes_per_s
        self.cap = spec.burst_bytes * 1_000_000
        self.max_dt = -(-self.cap // self.rate)
        self.idle_us = int(round(spec.timeouts.established_s * 1e6))

    def _timeout_of(self, rows):
        return self.idle_us

    def process(self, sub: Sub):
        seg = sub.seg
        existed = self._flows(sub)
        tokens = self._column(sub, "tokens").clone()
        last = self._column(sub, "last").clone()
        fresh = ~existed
        verdict = torch.zeros_like(sub.ts)
        for rnd, rows in enumerate(seg.rounds()):
            s = seg.index[rows]
            dt = torch.clamp(sub.ts[rows] - last[s], min=0, max=self.max_dt)
            tok = torch.clamp(tokens[s] + self.rate * dt, max=self.cap)
            if rnd == 0:
                tok = torch.where(fresh[s], torch.full_like(tok, self.cap), tok)
            cost = sub.wire[rows] * 1_000_000
            passed = tok >= cost
            tokens[s] = tok - cost * passed
            last[s] = sub.ts[rows]
            verdict[rows] = torch.where(passed, 0, int(st.Verdict.RATE))
        self._store(sub, existed, None, {"tokens": tokens, "last": last})
        return verdict
