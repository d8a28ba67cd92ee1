"""The network probe's rounds: a busy stretch of the machine slows rounds, not the estimate.

The slow stretch is injected into the probe's timing source (a wrapped ``perf_counter`` and
``process_time`` that add time to the end readings of chosen messages), deterministically.
The AllReduce rounds run in this process, in a one-rank gloo group, on a clock that ticks a
fixed step per reading, so every round's time is known exactly; the whole probe (two spawned
processes, gloo, real messages: seconds of start-up) is ``slow``.
"""

from __future__ import annotations

import time

import pytest

from dl_nfv.profilers.network import ProbeConfig, probe_network
from dl_nfv.profilers.network_rounds import (
    AGREE,
    allreduce_rounds,
    fastest_round,
    more_rounds,
    settled,
)

SIZES = (1024, 4096, 16384)  # up to 1 MiB: 5 messages of each size a round
ROUNDS = 3
EXTRA_S = 0.05  # added to a slowed message's end reading (wall and CPU)
STEP_S = 1e-4  # what the ticking clock advances per reading: every message takes this


class Ticks:
    """A clock that advances ``STEP_S`` at every reading (picklable)."""

    def __init__(self):
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        return self.readings * STEP_S


class SlowStretches:
    """A clock that reads ``base`` plus ``EXTRA_S`` at the end readings (odd calls) of the
    calls in ``stretches`` (half-open ranges of call indices): the messages timed there
    look ``EXTRA_S`` slower. Picklable, for the spawned workers."""

    def __init__(self, base, stretches):
        self.base, self.stretches, self.calls = base, stretches, 0

    def __call__(self) -> float:
        k, self.calls = self.calls, self.calls + 1
        slow = k % 2 == 1 and any(a <= k < b for a, b in self.stretches)
        return self.base() + (EXTRA_S if slow else 0.0)


def test_the_fastest_round_is_the_estimate_and_the_median_round_is_kept():
    assert fastest_round([3.0, 1.0, 2.0, 9.0]) == (1.0, 2.5)
    with pytest.raises(ValueError):
        fastest_round([])


def test_rounds_are_added_while_a_sizes_two_fastest_disagree_up_to_the_most():
    config = ProbeConfig(sizes=SIZES, repeats=3, max_rounds_factor=2)  # 3 to 6 rounds
    agreeing = [[1.0, 1.0 + AGREE, 5.0]] * 2
    assert settled(agreeing)
    assert not settled([[1.0, 1.01 + AGREE, 5.0], [1.0, 1.0]])  # one size disagrees
    assert not settled([[1.0]])  # one round says nothing
    assert more_rounds(2, agreeing, config)  # fewer than repeats
    assert not more_rounds(3, agreeing, config)
    assert more_rounds(3, [[1.0, 9.0, 9.0]], config)
    assert not more_rounds(6, [[1.0, 9.0, 9.0, 9.0, 9.0, 9.0]], config)  # the most


@pytest.fixture
def one_rank_group():
    """A gloo process group of this process alone, taken down after the test."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield {s: torch.ones(s // 4) for s in SIZES}
    finally:
        dist.destroy_process_group()


def _allreduce_config(slowed: tuple[int, int], max_rounds_factor: int) -> ProbeConfig:
    """AllReduce rounds on the ticking clock, rounds ``slowed[0]`` up to ``slowed[1]`` slowed."""
    per_round = 2 * sum(ProbeConfig().per_round(s) for s in SIZES)  # readings a round
    clock = SlowStretches(Ticks(), ((slowed[0] * per_round, slowed[1] * per_round),))
    return ProbeConfig(sizes=SIZES, repeats=ROUNDS, warmup=1, clock=clock,
                       max_rounds_factor=max_rounds_factor)


FAST, SLOW = STEP_S, STEP_S + EXTRA_S  # a round's time for every size, undisturbed or slowed


@pytest.mark.parametrize("slowed,factor,expected,estimate,median", [
    # two of three slowed, no room for more: the third is the estimate, a slowed one the median
    ((0, 2), 1, [SLOW, SLOW, FAST], FAST, SLOW),
    # one fast round of three is not trusted until a second agrees with it
    ((1, 3), 2, [FAST, SLOW, SLOW, FAST], FAST, (FAST + SLOW) / 2),
    # ... nor when none comes before the most rounds (2 x 3)
    ((1, 6), 2, [FAST, SLOW, SLOW, SLOW, SLOW, SLOW], FAST, SLOW),
    # three that agree, slowed or not, are settled: a load through every round stays in
    ((0, 3), 2, [SLOW, SLOW, SLOW], SLOW, SLOW),
], ids=["estimate-undisturbed", "added-until-two-agree", "added-up-to-the-most", "settled"])
def test_allreduce_rounds_of_a_busy_stretch(one_rank_group, slowed, factor, expected, estimate,
                                            median):
    import torch

    rounds = allreduce_rounds(one_rank_group, _allreduce_config(slowed, factor),
                              torch.device("cpu"))
    assert rounds == [pytest.approx(expected)] * len(SIZES)
    assert [fastest_round(r) for r in rounds] == [pytest.approx((estimate, median))] * len(SIZES)


@pytest.mark.slow
def test_a_busy_stretch_over_two_of_three_rounds_leaves_the_probes_figures_alone():
    # no added rounds (max_rounds_factor 1): the stretches fall where the test puts them
    config = ProbeConfig(sizes=SIZES, repeats=ROUNDS, warmup=1, max_rounds_factor=1)
    per_round = 2 * sum(config.per_round(s) for s in SIZES)  # clock reads per rank and round
    pairs_end = ROUNDS * per_round  # then the AllReduce rounds, as many reads
    stretches = ((0, 2 * per_round), (pairs_end, pairs_end + 2 * per_round))
    topology, report = probe_network(
        2, sizes=SIZES, repeats=ROUNDS, warmup=1, backend="gloo", threads=1,
        clock=SlowStretches(time.perf_counter, stretches),
        cpu_clock=SlowStretches(time.process_time, stretches), max_rounds_factor=1)
    assert report.rounds == ROUNDS
    slowed = EXTRA_S / 2  # one way: half the round trip
    # the median round is a slowed one, for every size of the pair and of the AllReduce ...
    assert all(t >= slowed for t in report.p2p_median_round_s["0-1"])
    assert all(t >= EXTRA_S for t in report.allreduce_median_round_s)
    # ... the estimate is the undisturbed round: a loopback message of <= 16 KiB takes well
    # under a millisecond on a quiet machine, a few on a busy one, never the stretch's 25 ms
    assert all(t < slowed / 2 for t in report.p2p_s["0-1"])
    assert all(t < EXTRA_S / 2 for t in report.allreduce_s)
    assert all(t < slowed / 2 for t in report.p2p_cpu_s["0-1"])  # least over messages
    assert report.fits["0-1"]["latency_us"] < slowed / 2 * 1e6
    ic = topology.hosts[0].interconnect
    assert ic.latency_us < slowed / 2 * 1e6 and ic.message_cpu_us < slowed / 2 * 1e6
    assert f"{ROUNDS} at most" in topology.description
    assert "the median round took" in topology.description
