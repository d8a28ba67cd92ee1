"""The network probe's timed rounds: round trips between two ranks and AllReduce over
every rank, each size once a round, and the estimate from the rounds.

A round times every message size (``ProbeConfig.per_round`` messages each; its time for a
size is their median), so a stretch in which other jobs hold the cores slows the rounds it
falls in rather than every message of one size; the estimate of a size is its fastest
round (other jobs only add time), and the median round says how much they added. Limits:
a load that lasts through every round leaves its share in the fastest; with one round
the estimate is that round's median.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .network import ProbeConfig


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fastest_round(rounds: Sequence[float]) -> tuple[float, float]:
    """``(fastest, median)`` of one size's round medians: the fastest is the estimate (other
    jobs only add time: a stretch in which they took the cores slows the rounds it falls
    in), the median says how much the rounds were disturbed. O(rounds log rounds)."""
    if not rounds:
        raise ValueError("no rounds timed")
    return min(rounds), statistics.median(rounds)


def pair_rounds(rank: int, i: int, j: int, buffers: dict, config: ProbeConfig, device
                 ) -> tuple[list[list[float]], list[float]]:
    """Round trips between ranks ``i`` and ``j`` (this rank is one of them): per size the
    one-way seconds of each round (the median of its messages), and the least CPU seconds
    this process spent per message (half a round trip's: one sent, one received).

    Every round times every size (``config.per_round`` messages each, after
    ``config.warmup`` untimed ones per size), so a busy stretch of the machine slows the
    rounds it falls in, whatever the size, instead of every message of one size.
    """
    import torch.distributed as dist

    def trip(buf) -> None:
        if rank == i:
            dist.send(buf, j)
            dist.recv(buf, j)
        else:
            dist.recv(buf, i)
            dist.send(buf, i)

    for size in config.sizes:
        for _ in range(config.warmup):
            trip(buffers[size])
    walls: dict[int, list[float]] = {s: [] for s in config.sizes}
    cpus: dict[int, list[float]] = {s: [] for s in config.sizes}
    for _ in range(config.repeats):
        for size in config.sizes:
            samples = []
            for _ in range(config.per_round(size)):
                _sync(device)
                t0, c0 = config.clock(), config.cpu_clock()
                trip(buffers[size])
                _sync(device)
                samples.append((config.clock() - t0) / 2)
                cpus[size].append((config.cpu_clock() - c0) / 2)
            walls[size].append(statistics.median(samples))
    # other jobs only add CPU time (caches, wake-ups): the least is the message's
    return [walls[s] for s in config.sizes], [min(cpus[s]) for s in config.sizes]


def allreduce_rounds(buffers: dict, config: ProbeConfig, device) -> list[list[float]]:
    """Every rank's AllReduce over each size, in rounds as ``pair_rounds``: per size the
    seconds of each round (the median over its collectives of the slowest rank's time)."""
    import torch
    import torch.distributed as dist

    for size in config.sizes:
        for _ in range(config.warmup):
            dist.all_reduce(buffers[size])
    samples: list[float] = []
    for _ in range(config.repeats):
        for size in config.sizes:
            buf = buffers[size]
            buf.fill_(1.0)
            for _ in range(config.per_round(size)):
                dist.barrier()
                _sync(device)
                t0 = config.clock()
                dist.all_reduce(buf)
                _sync(device)
                samples.append(config.clock() - t0)
    local = torch.tensor(samples, dtype=torch.float64)
    if config.backend == "nccl":
        local = local.to(device)
    dist.all_reduce(local, op=dist.ReduceOp.MAX)  # the slowest rank's time is the collective's
    slowest = local.cpu().tolist()
    per_size: list[list[float]] = [[] for _ in config.sizes]
    k = 0
    for _ in range(config.repeats):
        for index, size in enumerate(config.sizes):
            n = config.per_round(size)
            per_size[index].append(statistics.median(slowest[k:k + n]))
            k += n
    for buf in buffers.values():
        buf.fill_(1.0)
    return per_size
