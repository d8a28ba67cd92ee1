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
back: it finds every CRLF, compares the start of each header line with the
names it needs (lower-cased by table lookup), gathers only the bytes of the
start lines and of the values it extracts, trims blanks by segment min/max,
and hashes as segment sums of byte x 256**(distance to end) modulo P. Its work
is proportional to header lines and extracted bytes, not to whole headers.
"""

from __future__ import annotations

import numpy as np

from ..traffic.http import METHODS
from .base import GpuBatch, Outputs, join_bytes
from .lazy_torch import torch

NAME = "http-lb"
P = 2**31 - 1
MAX_HEADER = 64 * 1024


def _powers_of_256(n: int) -> np.ndarray:
    """``256**i % P`` for ``i < n``: 256 powers times the powers of ``256**256`` (products
    of two residues below 2**31 fit in int64), not a Python loop over ``n``."""
    low = np.ones(256, dtype=np.int64)
    for i in range(1, 256):
        low[i] = low[i - 1] * 256 % P
    high = np.ones(-(-n // 256), dtype=np.int64)
    step = pow(256, 256, P)
    for i in range(1, len(high)):
        high[i] = high[i - 1] * step % P
    return (high[:, None] * low[None, :] % P).ravel()[:n]


_POW256 = _powers_of_256(MAX_HEADER + 16)
_POW10 = 10 ** np.arange(16, dtype=np.int64)
_LOWER = np.arange(256, dtype=np.int64)
_LOWER[65:91] += 32
_HOST = b"\r\nhost:"
_CLEN = b"\r\ncontent-length:"


def header_value(low: bytes, name: bytes) -> bytes | None:
    """Value of the first header line ``name`` (given as ``\\r\\nname:``), blanks trimmed."""
    i = low.find(name)
    if i < 0:
        return None
    start = i + len(name)
    return low[start:low.find(b"\r\n", start)].strip(b" \t")


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
        """Parse the header blocks of messages ``idx`` at once (see the module docstring).

        Work is proportional to the header lines and to the bytes of the start
        lines and of the values it extracts, not to whole headers.
        """
        dev = batch.device
        hl = batch.header_len[idx]
        m = len(idx)
        flat = np.frombuffer(join_bytes(batch.blob, batch.offset[idx], hl), np.uint8)
        start_np = np.zeros(m, dtype=np.int64)
        np.cumsum(hl[:-1], out=start_np[1:])
        h = torch.from_numpy(flat.copy()).to(dev)
        n = h.numel()
        start = torch.from_numpy(start_np).to(dev)
        kind = torch.from_numpy(batch.kind[idx].astype(np.int64)).to(dev)
        lower = torch.from_numpy(_LOWER.astype(np.uint8)).to(dev)
        # every CRLF; the message it belongs to; the next CRLF of the same message
        crlf = ((h[:-1] == 13) & (h[1:] == 10)).nonzero().squeeze(1)
        seg = torch.searchsorted(start, crlf, right=True) - 1
        nxt = torch.cat([crlf[1:], crlf.new_full((1,), n)])
        same = torch.cat([seg[1:] == seg[:-1], seg.new_zeros(1, dtype=torch.bool)])
        line_len = torch.where(same, nxt - crlf - 2, -1)
        big = torch.full((m,), n + 1, dtype=torch.int64, device=dev)
        first_crlf = big.scatter_reduce(0, seg, crlf, "amin")

        line_first = lower[h[(crlf + 2).clamp(max=n - 1)].long()]

        def value_span(name: bytes):
            """(found, value start, value end) of the first header line ``name:``; only
            lines starting with the name's first letter are compared further."""
            width = len(name) - 2  # without the leading CRLF
            cand = ((line_first == name[2]) & (line_len >= width)).nonzero().squeeze(1)
            cols = torch.arange(width, device=dev)
            at = (crlf[cand, None] + 2 + cols).clamp(max=n - 1)
            want = torch.tensor(list(name[2:]), dtype=torch.uint8, device=dev)
            hit = cand[(lower[h[at].long()] == want).all(1)]
            first = torch.full((m,), len(crlf), dtype=torch.int64, device=dev).scatter_reduce(
                0, seg[hit], hit, "amin")
            found = first < len(crlf)
            j = first.clamp(max=max(len(crlf) - 1, 0))
            a = torch.where(found, crlf[j] + 2 + width, 0)
            e = torch.where(found, nxt[j], 0)
            return found, a, e

        pow256 = torch.from_numpy(_POW256).to(dev)

        def trimmed(a: torch.Tensor, e: torch.Tensor, fold: bool, trim: bool):
            """Bytes of spans [a, e) blank-trimmed: (values, span id, position from the end,
            start, end) of the kept bytes."""
            lengths = (e - a).clamp(min=0)
            span = torch.repeat_interleave(torch.arange(m, device=dev), lengths)
            base = torch.repeat_interleave(a - torch.cumsum(lengths, 0) + lengths, lengths)
            pos = base + torch.arange(span.numel(), device=dev)
            v = h[pos]
            if fold:
                v = lower[v.long()]
            v = v.long()
            s, t = a, e
            if trim:
                keep = (v != 32) & (v != 9)
                s = torch.full((m,), n + 1, dtype=torch.int64, device=dev).scatter_reduce(
                    0, span, torch.where(keep, pos, n + 1), "amin")
                t = torch.full((m,), -1, dtype=torch.int64, device=dev).scatter_reduce(
                    0, span, torch.where(keep, pos, -1), "amax") + 1
                s = torch.minimum(s, e)
                t = torch.maximum(t, s)
            inside = (pos >= s[span]) & (pos < t[span])
            return v, span, torch.where(inside, t[span] - 1 - pos, -1), s, t

        def span_hash(a, e, fold, trim):
            v, span, dist, _, _ = trimmed(a, e, fold, trim)
            contrib = torch.where(dist >= 0, v * pow256[dist.clamp(min=0)], 0)
            return torch.zeros(m, dtype=torch.int64, device=dev).scatter_add_(0, span, contrib) % P

        # start line: the method token ends at the first space (within 17 bytes); a request
        # line ends with " HTTP/1.x", so its second space is 9 bytes before the CRLF
        first17 = torch.from_numpy(_first_bytes(flat, start_np, hl, 17)).to(dev)
        sp1 = start + (first17 == 32).to(torch.int8).argmax(1)
        sp2 = first_crlf - 9
        found_host, ha, he = value_span(_HOST)
        host_hash = torch.where(found_host, span_hash(ha, he, True, True), -1)
        url_hash = torch.where(kind == 1, span_hash(torch.where(kind == 1, sp1 + 1, 0),
                                                    torch.where(kind == 1, sp2, 0), False, False),
                               0)
        found_len, la, le = value_span(_CLEN)
        v, span, dist, ls, lt = trimmed(la, le, False, True)
        digit = (v >= 48) & (v <= 57)
        bad = torch.zeros(m, dtype=torch.int64, device=dev).scatter_add_(
            0, span, ((dist >= 0) & ~digit).to(torch.int64))
        pow10 = torch.from_numpy(_POW10).to(dev)
        value = torch.zeros(m, dtype=torch.int64, device=dev).scatter_add_(
            0, span, torch.where((dist >= 0) & digit, (v - 48) * pow10[dist.clamp(0, 15)], 0))
        width = lt - ls
        length = torch.where(found_len & (bad == 0) & (width >= 1) & (width <= 15), value, -1)
        # method: compare the first token with each known method
        first8 = first17[:, :8]
        tok_len = sp1 - start
        cols8 = torch.arange(8, device=dev)
        shifts = 8 * (7 - cols8)
        key = torch.where(cols8 < tok_len[:, None], first8.long() << shifts, 0).sum(1)
        names = [int.from_bytes(mname.ljust(8, b"\0"), "big") for mname in METHODS]
        same = ((key[:, None] == torch.tensor(names, device=dev))
                & (tok_len[:, None] == torch.tensor([len(x) for x in METHODS], device=dev)))
        method = torch.where(same.any(1), same.to(torch.int8).argmax(1), len(METHODS))
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
