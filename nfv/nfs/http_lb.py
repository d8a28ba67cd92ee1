"""HTTP parser with an L7 load-balancing decision.

For every framed HTTP message it extracts the method (index into
``METHODS``, ``len(METHODS)`` for another token, -1 for a response), the
status (responses; 0 for requests), the ``Content-Length`` value (-1 when
absent or not 1-15 digits), the ``Host`` value (lower case, blanks trimmed)
and the request target, and hashes the last two as big-endian base-256
numbers modulo the prime 2**31-1 (-1 when there is no Host). A request goes to
``backends[key % len(backends)]``, key being the host hash (policy ``host``,
falling back to the URL hash without a Host header) or the URL hash (policy
``url``); responses get -1. Header names match when the line starts with the
name and a colon (``Host:``), as the tensor kernel searches ``\\r\\nhost:``.

The tensor kernel works on the header blocks of the whole share packed back to
back: lower-casing by table lookup, separators found by segment-min over
positions, header values by windowed comparison, next-CR and next-non-blank
positions by reverse cumulative minima, and hashes as segment sums of byte x
256**(distance to end) modulo P.
"""

from __future__ import annotations

import numpy as np
import torch

from ..traffic.http import METHODS
from .base import GpuBatch, Outputs, join_bytes

NAME = "http-lb"
P = 2**31 - 1
MAX_HEADER = 64 * 1024
_POW256 = np.ones(MAX_HEADER + 16, dtype=np.int64)
for _i in range(1, len(_POW256)):
    _POW256[_i] = _POW256[_i - 1] * 256 % P
_POW10 = 10 ** np.arange(16, dtype=np.int64)
_LOWER = np.arange(256, dtype=np.int64)
_LOWER[65:91] += 32
_HOST = b"\r\nhost:"
_CLEN = b"\r\ncontent-length:"


def header_value(low: bytes, name: bytes) -> bytes | None:
    i = low.find(name)
    if i < 0:
        return None
    start = i + len(name)
    return low[start:low.find(b"\r", start)].strip(b" \t")


def parse_message(payload: bytes, header_len: int, kind: int) -> tuple[int, int, int, int, int]:
    """(method, status, content length, host hash, url hash) of one framed HTTP message."""
    head = payload[:header_len]
    low = head.lower()
    sp1 = head.find(b" ")
    if kind == 1:
        token = head[:sp1]
        method = METHODS.index(token) if token in METHODS else len(METHODS)
        url = head[sp1 + 1:head.find(b" ", sp1 + 1)]
        status, url_hash = 0, int.from_bytes(url, "big") % P
    else:
        method, status, url_hash = -1, int(head[sp1 + 1:sp1 + 4]), 0
    host = header_value(low, _HOST)
    host_hash = -1 if host is None else int.from_bytes(host, "big") % P
    value = header_value(low, _CLEN)
    length = int(value) if value is not None and value.isdigit() and len(value) <= 15 else -1
    return method, status, length, host_hash, url_hash


class HttpLb:
    kind = NAME
    portable = False

    def __init__(self, spec, flows) -> None:
        self.backends = len(spec.backends)
        self.by_url = spec.policy == "url"

    def backend(self, kind: int, host_hash: int, url_hash: int) -> int:
        if kind != 1:
            return -1
        key = url_hash if self.by_url or host_hash < 0 else host_hash
        return key % self.backends

    # CPU path -----------------------------------------------------------------
    def cpu_state(self, flow: int):
        return None

    def cpu(self, state, ctx, payload: bytes, out: Outputs) -> bool:
        if ctx.header_len <= 0:
            return True
        method, status, length, host, url = parse_message(payload, ctx.header_len, ctx.kind)
        out.http.append((ctx.flow, ctx.index, ctx.kind, method, status, length, host, url,
                         self.backend(ctx.kind, host, url)))
        return True

    # GPU path -----------------------------------------------------------------
    def gpu(self, batch: GpuBatch, alive: torch.Tensor, out: Outputs) -> torch.Tensor:
        sel = (alive.cpu().numpy()) & (batch.header_len > 0)
        idx = np.flatnonzero(sel)
        if len(idx) == 0:
            return alive
        rows = self._kernel(batch, idx)
        out.add_chunk("http", rows)
        return alive

    def _kernel(self, batch: GpuBatch, idx: np.ndarray) -> np.ndarray:
        dev = batch.device
        hl = batch.header_len[idx]
        m = len(idx)
        flat = np.frombuffer(join_bytes(batch.blob, batch.offset[idx], hl), np.uint8)
        n = flat.shape[0]
        start_np = np.zeros(m, dtype=np.int64)
        np.cumsum(hl[:-1], out=start_np[1:])
        seg_np = np.repeat(np.arange(m, dtype=np.int64), hl)
        raw = torch.from_numpy(flat.astype(np.int64)).to(dev)
        seg = torch.from_numpy(seg_np).to(dev)
        start = torch.from_numpy(start_np).to(dev)
        end = start + torch.from_numpy(hl).to(dev)
        kind = torch.from_numpy(batch.kind[idx].astype(np.int64)).to(dev)
        low = torch.from_numpy(_LOWER).to(dev)[raw]
        pos = torch.arange(n, device=dev)
        big = torch.full((m,), n + 32, dtype=torch.int64, device=dev)

        def seg_min(values: torch.Tensor) -> torch.Tensor:
            return big.scatter_reduce(0, seg, values, "amin")

        is_sp = raw == 32
        sp1 = seg_min(torch.where(is_sp, pos, n + 32))
        sp2 = seg_min(torch.where(is_sp & (pos > sp1[seg]), pos, n + 32))
        # next CR / next non-blank at or after each position; last non-blank at or before
        pad = torch.full((n + 32,), n + 32, dtype=torch.int64, device=dev)
        cr_at = torch.where(raw == 13, pos, n + 32)
        next_cr = torch.flip(torch.cummin(torch.flip(cr_at, [0]), 0).values, [0])
        blank = (raw == 32) | (raw == 9)
        next_nb = torch.flip(torch.cummin(torch.flip(torch.where(blank, n + 32, pos), [0]), 0).values,
                             [0])
        prev_nb = torch.cummax(torch.where(blank, -1, pos), 0).values
        lowp = torch.cat([low, torch.zeros(32, dtype=torch.int64, device=dev)])
        pad[:n] = next_cr
        next_cr_p = pad.clone()
        pad[:n] = next_nb
        next_nb_p = pad.clone()

        def find(name: bytes) -> torch.Tensor:
            hit = torch.ones(n, dtype=torch.bool, device=dev)
            for i, byte in enumerate(name):
                hit &= lowp[i:i + n] == byte
            return seg_min(torch.where(hit, pos, n + 32))

        def value_span(name: bytes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            at = find(name)
            found = at < end
            a = torch.where(found, at + len(name), 0).clamp(max=n - 1)
            vend = next_cr_p[a]
            vstart = torch.minimum(next_nb_p[a], vend)
            last = prev_nb[(vend - 1).clamp(min=0)]
            vend = torch.maximum(last + 1, vstart)
            return found, vstart, vend

        pow256 = torch.from_numpy(_POW256).to(dev)

        def span_hash(values: torch.Tensor, s: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
            inside = (pos >= s[seg]) & (pos < e[seg])
            dist = torch.where(inside, e[seg] - 1 - pos, 0)
            contrib = torch.where(inside, values * pow256[dist], 0)
            return torch.zeros(m, dtype=torch.int64, device=dev).scatter_add_(0, seg, contrib) % P

        found_host, hs, he = value_span(_HOST)
        host_hash = torch.where(found_host, span_hash(low, hs, he), -1)
        url_hash = torch.where(kind == 1, span_hash(raw, sp1 + 1, sp2), 0)
        found_len, ls, le = value_span(_CLEN)
        inside = (pos >= ls[seg]) & (pos < le[seg])
        digit = (raw >= 48) & (raw <= 57)
        bad = torch.zeros(m, dtype=torch.int64, device=dev).scatter_add_(
            0, seg, (inside & ~digit).to(torch.int64))
        width = le - ls
        pow10 = torch.from_numpy(_POW10).to(dev)
        dist = torch.where(inside, le[seg] - 1 - pos, 0).clamp(max=15)
        value = torch.zeros(m, dtype=torch.int64, device=dev).scatter_add_(
            0, seg, torch.where(inside & digit, (raw - 48) * pow10[dist], 0))
        length = torch.where(found_len & (bad == 0) & (width >= 1) & (width <= 15), value, -1)
        # method: compare the first token with each known method
        first8 = torch.from_numpy(_first_bytes(flat, start_np, hl, 8)).to(dev)
        method = torch.full((m,), len(METHODS), dtype=torch.int64, device=dev)
        tok_len = sp1 - start
        for j in range(len(METHODS) - 1, -1, -1):
            name = torch.tensor(list(METHODS[j]), dtype=torch.int64, device=dev)
            k = len(METHODS[j])
            same = (first8[:, :k] == name).all(1) & (tok_len == k)
            method = torch.where(same, j, method)
        method = torch.where(kind == 1, method, -1)
        digits = torch.from_numpy(_first_bytes(flat, start_np + 9, hl - 9, 3)).to(dev) - 48
        status = torch.where(kind == 1, 0, digits[:, 0] * 100 + digits[:, 1] * 10 + digits[:, 2])
        key = torch.where((host_hash < 0) | self.by_url, url_hash, host_hash)
        backend = torch.where(kind == 1, key % self.backends, -1)
        cols = torch.stack([method, status, length, host_hash, url_hash, backend], 1).cpu().numpy()
        return np.concatenate([batch.flow[idx, None], batch.index[idx, None],
                               batch.kind[idx, None].astype(np.int64), cols], axis=1)


def _first_bytes(flat: np.ndarray, start: np.ndarray, avail: np.ndarray, k: int) -> np.ndarray:
    """[m, k] int64: the first ``k`` bytes from each start (0 past ``avail``)."""
    cols = np.arange(k)[None, :]
    index = np.minimum(start[:, None] + cols, max(len(flat) - 1, 0))
    out = flat[index].astype(np.int64) if len(flat) else np.zeros((len(start), k), np.int64)
    return np.where(cols < avail[:, None], out, 0)
