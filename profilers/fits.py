"""Lines fitted to the network probe's timings: a link's latency and bandwidth, the CPU per
message.

Each is ``t(s) = a + s x b`` over message sizes ``s``: the slope by least squares over the
larger half of the sizes (large messages are where a link's time goes), the intercept the
median of what it leaves over the smaller half (one slow small message, as a shared machine
gives now and then, does not set it). O(sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LinkFit:
    """A latency + size/bandwidth line fitted to one-way times."""

    latency_us: float
    bandwidth_gbps: float

    def time_s(self, nbytes: float) -> float:
        return self.latency_us * 1e-6 + nbytes * 8 / (self.bandwidth_gbps * 1e9)


def fit_link(sizes: Sequence[int], seconds: Sequence[float]) -> LinkFit:
    """Fit ``t = a + s * b``: ``b`` by least squares over the larger half of the sizes, then
    ``a`` (>= 0) as the median of ``t - s * b`` over the smaller half (one slow small
    message, as a shared machine gives now and then, does not set the latency).

    Large messages (gradients, activations) are where a link's time goes, so they fix
    the bandwidth; the smallest fixes the latency. (A fit of relative error over all
    sizes let mid-sized messages, which copy through the caches on loopback, overstate
    the bandwidth of 64 MiB messages by a third.) O(len(sizes)).
    """
    t = np.asarray(seconds, dtype=float)
    if len(sizes) < 2 or np.any(t <= 0):
        raise ValueError("need at least two sizes with positive times to fit a link")
    a, b = fit_affine(sizes, seconds, least_slope=1e-15)
    return LinkFit(latency_us=a * 1e6, bandwidth_gbps=float(8.0 / (b * 1e9)))


def fit_affine(sizes: Sequence[int], seconds: Sequence[float], least_slope: float = 0.0
               ) -> tuple[float, float]:
    """``(a, b)`` of ``t = a + s * b`` by ``fit_link``'s method: ``b`` (at least
    ``least_slope``) by least squares over the larger half of the sizes, ``a >= 0`` the
    median of ``t - s * b`` over the smaller half. O(len(sizes))."""
    s = np.asarray(sizes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    order = np.argsort(s)
    s, t = s[order], t[order]
    big = slice(len(s) // 2, None) if len(s) >= 4 else slice(None)
    sb, tb = s[big], t[big]
    b = float(np.sum((sb - sb.mean()) * (tb - tb.mean())) / np.sum((sb - sb.mean()) ** 2))
    b = max(b, least_slope)
    small = slice(None, max(1, (len(s) + 1) // 2))
    return max(0.0, float(np.median(t[small] - s[small] * b))), b


def message_cpu(sizes: Sequence[int], cpu_s: Sequence[float]) -> tuple[float, float]:
    """``(message_cpu_us, message_cpu_us_per_mib)`` fitted (``fit_affine``) to the CPU
    seconds one message of each size took its sender or receiver."""
    a, b = fit_affine(sizes, cpu_s)
    return a * 1e6, b * 2**20 * 1e6
