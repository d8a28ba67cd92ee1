"""How a replicated stage's microbatch may be split over its replicas, for the bound.

A microbatch of ``S = B / m`` samples is split over a stage's ``k`` replicas in whole
samples, ``c_d`` on device ``d``. The stage's busy time scales with the slowest replica's
``m x max_d c_d / (B sigma_d)``, and microbatch 0 leaves the stage when its first replica
is done: at least the smallest share ``c`` on the fastest device. A small ``c`` leaves more
to the other ``k - 1``, so the bound takes every replicated stage in one of a few
*options*, ranges ``lo <= c <= hi`` (``share_buckets``: 1, 2-3, 4-7, the rest), each at
its best for both: the chain at ``lo`` samples, the busy share at least the whole-sample
optimum over the ``k`` devices and over the fastest ``k - 1`` holding ``S - hi`` samples.
Giving samples one at a time to the device that would finish first attains the
whole-sample optimum of this min-max (``slowest_samples``).

Complexity: O(S log S x k) per device set, memoised by its speeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SHARE_OPTIONS = 4  # ranges of a replicated stage's smallest share the DPs tell apart


@dataclass(frozen=True, kw_only=True, slots=True)
class ShareOptions:
    """Per device set (and option): the slowest replica's share of the batch per iteration
    (``busy``, inf where no such option) and the first replica's samples (``first``)."""

    busy: np.ndarray
    first: np.ndarray


def slowest_samples(speeds, samples: int) -> float:
    """The least ``max_d c_d / speeds_d`` over whole-sample splits ``c`` of ``samples``
    (inf with no device and samples left). Giving samples one at a time to the device
    that would finish first attains it, and that takes the values ``j / speeds_d``
    (``j >= 1``) in increasing order: the answer is the ``samples``-th smallest."""
    if samples <= 0:
        return 0.0
    if not len(speeds):
        return np.inf
    values = np.arange(1, samples + 1)[None, :] / np.asarray(speeds, dtype=float)[:, None]
    return float(np.partition(values.ravel(), samples - 1)[samples - 1])


def share_buckets(samples: int, k: int) -> list[tuple[int, int]]:
    """Ranges ``(lo, hi)`` of the smallest replica share (samples of a microbatch) that
    cover every split of ``samples`` over ``k >= 2`` replicas: 1, 2-3, 4-7, then the rest
    up to ``samples // k`` (at least 1: with fewer samples than replicas some replica
    holds one); at most ``SHARE_OPTIONS`` ranges, which bounds the DPs' work."""
    top = max(1, samples // k)
    out, lo = [], 1
    while lo <= top:
        hi = top if len(out) == SHARE_OPTIONS - 1 else min(top, 2 * lo - 1)
        out.append((lo, hi))
        lo = hi + 1
    return out


def _option_shares(speeds, others, buckets, samples: int, m: int, batch: int) -> list[float]:
    """Per option (``buckets``) of replicas of ``speeds``: the slowest one's share,
    ``m x max_d c_d / (B sigma_d)``, at least the whole-sample optimum over all of them
    and over the best of ``others`` (the replicas left beside the first) holding the
    samples less the option's largest first share. One device: the whole microbatch."""
    balanced = m * slowest_samples(speeds, samples) / batch
    if len(speeds) == 1:
        return [balanced]
    return [max(balanced, m * min(slowest_samples(rest, samples - hi) for rest in others) / batch)
            for _, hi in buckets]


def share_options(holders: dict, regions: int, devices: int, batch: int,
                  m: int) -> ShareOptions:
    """Per range ``[i, j)``, device count ``k`` and option: ``busy[i, j, k, o]`` (inf for
    ``k = 0``, no holder or no such option) on the ``k`` fastest of the devices that can
    hold the range (``holders[(i, j)]``, their speeds, fastest first); ``first[k, o]``: the
    chain's samples (the whole microbatch for ``k = 1``; inf for no option)."""
    samples = batch // m
    buckets = {k: share_buckets(samples, k) for k in range(2, devices + 1)}
    options = max([1, *(len(b) for b in buckets.values())])
    first = np.full((devices + 1, options), np.inf)
    first[1, 0] = samples
    for k, bucket in buckets.items():
        first[k, :len(bucket)] = [lo for lo, _ in bucket]
    memo: dict[tuple, np.ndarray] = {}
    out = np.full((regions + 1, regions + 1, devices + 1, options), np.inf)
    for (i, j), speeds in holders.items():
        row = memo.get(speeds)
        if row is None:
            row = np.full((devices + 1, options), np.inf)
            for k in range(1, min(devices, len(speeds)) + 1):
                shares = _option_shares(speeds[:k], [speeds[:k - 1]], buckets.get(k, ()),
                                        samples, m, batch)
                row[k, :len(shares)] = shares
            memo[speeds] = row
        out[i, j] = row
    return ShareOptions(busy=out, first=first)


def class_share_options(vectors, sigma, samples: int, m: int, batch: int) -> ShareOptions:
    """``share_options`` for replicas given as class-count vectors (``[K, o]`` each).

    The first replica (smallest share ``c`` in the option's range) is on some class
    present in the vector; the others are the vector less one device of that class,
    whichever leaves the least busy share.
    """
    totals = [sum(kv) for kv in vectors]
    buckets = {k: share_buckets(samples, k) for k in set(totals) if k >= 2}
    options = max([1, *(len(b) for b in buckets.values())])
    busy = np.full((len(vectors), options), np.inf)
    first = np.full((len(vectors), options), np.inf)
    for n, kv in enumerate(vectors):
        speeds = [sigma[c] for c, k in enumerate(kv) for _ in range(k)]
        if not speeds:
            continue
        bucket = buckets.get(len(speeds), ())
        others = [[sigma[c2] for c2, k2 in enumerate(kv) for _ in range(k2 - (c2 == c))]
                  for c, k in enumerate(kv) if k]
        shares = _option_shares(speeds, others, bucket, samples, m, batch)
        busy[n, :len(shares)] = shares
        first[n, :len(shares)] = [lo for lo, _ in bucket] if bucket else [samples]
    return ShareOptions(busy=busy, first=first)


def fractional_capacity(holders: dict, regions: int, devices: int) -> np.ndarray:
    """``[i, j, k]``: one over the sum of the ``k`` largest speeds among the devices that
    hold range ``[i, j)`` (inf where fewer hold it, or ``k = 0``): a stage's replicas at
    their balanced fractional shares (``sum_d c_d^2 / sigma_d >= S^2 / sum_d sigma_d``)."""
    out = np.full((regions + 1, regions + 1, devices + 1), np.inf)
    memo: dict[tuple, np.ndarray] = {}
    for (i, j), speeds in holders.items():
        row = memo.get(speeds)
        if row is None:
            row = np.full(devices + 1, np.inf)
            row[1:len(speeds) + 1] = 1.0 / np.cumsum(speeds)
            memo[speeds] = row
        out[i, j] = row
    return out
