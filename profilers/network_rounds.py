"""The network probe's timed rounds: round trips between two ranks and AllReduce over
every rank, each size once a round, and the estimate from the rounds.

A round times every message size (``ProbeConfig.per_round`` messages each; its time for a
size is their lower quartile: ``low_quartile``), so a stretch in which other jobs hold the cores slows the rounds it
falls in rather than every message of one size; the estimate of a size is its fastest
round (other jobs only add time), and the median round says how much they added. After
``ProbeConfig.repeats`` rounds, rounds are added (up to ``ProbeConfig.max_rounds``) while
some size's two fastest rounds differ by more than ``AGREE`` (``settled``): the fastest
of a busy machine is then one lucky round or still disturbed, two that agree are what the
link costs when both ends run. Limits: a load that lasts through every round leaves its
share in the fastest; with one round the estimate is that round's median.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .network import ProbeConfig

AGREE = 0.25  # the two fastest rounds of a size within 25% of each other


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


def low_quartile(samples: Sequence[float]) -> float:
    """A round's time for a size: the lower quartile of its messages (of 5, the second
    fastest; of one, that one), which needs only a quarter of them undisturbed.

    >>> low_quartile([5.0, 1.0, 2.0, 9.0, 3.0]), low_quartile([4.0])
    (2.0, 4.0)
    """
    if len(samples) == 1:
        return float(samples[0])
    return statistics.quantiles(samples, n=4, method="inclusive")[0]


def settled(rounds_per_size: Sequence[Sequence[float]], agree: float = AGREE) -> bool:
    """Whether every size's two fastest rounds lie within ``agree`` of each other
    (a size with fewer than two rounds is not settled).

    >>> settled([[1.0, 1.2, 9.0], [2.0, 2.1]]), settled([[1.0, 9.0, 9.0]])
    (True, False)
    """
    for rounds in rounds_per_size:
        if len(rounds) < 2:
            return False
        first, second = sorted(rounds)[:2]
        if second > (1 + agree) * first:
            return False
    return True


def more_rounds(done: int, rounds_per_size: Sequence[Sequence[float]], config: ProbeConfig
                ) -> bool:
    """Whether to time another round after ``done``: below ``config.repeats``, or below
    ``config.max_rounds`` while the rounds have not ``settled``."""
    return done < config.repeats or (done < config.max_rounds and not settled(rounds_per_size))


def pair_rounds(rank: int, i: int, j: int, buffers: dict, config: ProbeConfig, device
                 ) -> tuple[list[list[float]], list[float]]:
    """Round trips between ranks ``i`` and ``j`` (this rank is one of them): per size the
    one-way seconds of each round (the lower quartile of its messages), and the least CPU seconds
    this process spent per message (half a round trip's: one sent, one received).

    Every round times every size (``config.per_round`` messages each, after
    ``config.warmup`` untimed ones per size), so a busy stretch of the machine slows the
    rounds it falls in, whatever the size, instead of every message of one size; rounds
    are added while they have not settled (``more_rounds``).
    """
    import torch
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
    flag = torch.zeros(1, dtype=torch.int32)
    done = 0
    while True:
        for size in config.sizes:
            samples = []
            for _ in range(config.per_round(size)):
                _sync(device)
                t0, c0 = config.clock(), config.cpu_clock()
                trip(buffers[size])
                _sync(device)
                samples.append((config.clock() - t0) / 2)
                cpus[size].append((config.cpu_clock() - c0) / 2)
            walls[size].append(low_quartile(samples))
        done += 1
        if rank == i:  # the lower rank's times are kept: it decides, and tells the other
            flag[0] = int(more_rounds(done, [walls[s] for s in config.sizes], config))
            dist.send(flag, j)
        else:
            dist.recv(flag, i)
        if not flag[0]:
            break
    # other jobs only add CPU time (caches, wake-ups): the least is the message's
    return [walls[s] for s in config.sizes], [min(cpus[s]) for s in config.sizes]


def allreduce_rounds(buffers: dict, config: ProbeConfig, device) -> list[list[float]]:
    """Every rank's AllReduce over each size, in rounds as ``pair_rounds``: per size the
    seconds of each round (the lower quartile over its collectives of the slowest rank's
    time)."""
    import torch
    import torch.distributed as dist

    for size in config.sizes:
        for _ in range(config.warmup):
            dist.all_reduce(buffers[size])
    per_size: list[list[float]] = [[] for _ in config.sizes]
    done = 0
    while True:
        samples: list[float] = []
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
        local = torch.tensor(samples, dtype=torch.float64, device=device)
        dist.all_reduce(local, op=dist.ReduceOp.MAX)  # the slowest rank's is the collective's
        slowest = local.cpu().tolist()
        k = 0
        for index, size in enumerate(config.sizes):
            n = config.per_round(size)
            per_size[index].append(low_quartile(slowest[k:k + n]))
            k += n
        done += 1
        if not more_rounds(done, per_size, config):  # every rank has the same times
            break
    for buf in buffers.values():
        buf.fill_(1.0)
    return per_size
