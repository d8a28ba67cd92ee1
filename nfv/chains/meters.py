"""The chain's per-flow meters as batched torch kernels: the flow monitor (packets, bytes,
first and last seen, by segmented sums) and the token-bucket rate limiter (a flow's
packets in rounds by their place in it). Their state lives in the chain's flow table
like every NF's (``kernels._Stateful``).
"""

from __future__ import annotations

import torch

from . import states as st
from .kernels import Sub, _Stateful
from .ops import pick, take


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
        size = torch.zeros(seg.count, dtype=torch.int64, device=self.device)
        if sub.live is None:
            count = torch.bincount(seg.index, minlength=seg.count)
            size.index_add_(0, seg.index, sub.wire)
            head, tail, keep = seg.first, seg.last, None
        else:  # only the live packets count; a flow with none is left as it was
            count = torch.zeros_like(size).index_add_(0, seg.index, sub.live.long())
            size.index_add_(0, seg.index, sub.wire * sub.live)
            head, tail = seg.ends_of(sub.live)
            keep = existed | (count > 0)
        last = take(sub.ts, torch.clamp(tail, min=0))
        self._store(sub, existed, keep,
                    {"packets": self._column(sub, "packets") + count,
                     "bytes": self._column(sub, "bytes") + size,
                     "first": pick(existed, self._column(sub, "first"),
                                   take(sub.ts, torch.clamp(head, max=sub.ts.shape[0] - 1))),
                     "last": last if keep is None else pick(count > 0, last,
                                                            self._column(sub, "last"))})
        return torch.zeros_like(sub.ts)

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
