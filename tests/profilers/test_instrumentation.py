"""The profiler's clock and the instrumentation it takes off the ops: closed forms, and a
real step whose per-op sum, less the instrumentation, matches its plain step."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from dl_nfv.profilers.capture import capture
from dl_nfv.profilers.measure import (
    TimedRounds,
    cpu_clock,
    less_overhead,
    per_event_overhead,
    time_plain_step,
)


def test_with_one_thread_the_cpu_clock_counts_the_threads_work_not_its_waits():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        t0 = cpu_clock()
        time.sleep(0.05)
        slept = cpu_clock() - t0
        t0, c0 = cpu_clock(), time.thread_time()
        sum(i * i for i in range(200_000))
        worked, thread_cpu = cpu_clock() - t0, time.thread_time() - c0
        torch.set_num_threads(2)
        t0 = cpu_clock()
        time.sleep(0.05)
        wall = cpu_clock() - t0
    finally:
        torch.set_num_threads(threads)
    assert slept < 0.01 and wall >= 0.05
    assert worked > 0 and worked == pytest.approx(thread_cpu, rel=0.05)


def test_overhead_per_event_is_the_excess_over_the_plain_step_per_event():
    assert per_event_overhead(0.015, 0.011, 4) == pytest.approx(0.001)
    assert per_event_overhead(0.015, 0.020, 4) == 0.0  # never negative
    assert per_event_overhead(0.015, 0.011, 0) == 0.0
    assert less_overhead(1.0, 3, 0.1) == pytest.approx(0.7)
    assert less_overhead(0.2, 3, 0.1) == 0.0


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU())
                                      for _ in range(12)])

    def forward(self, x):
        return self.layers(x)


def test_less_its_instrumentation_the_per_op_sum_is_the_plain_step():
    """On one thread (the CPU clock), rounds of tiny ops whose instrumented time is mostly
    hooks: the per-op sum less the measured overhead matches the plain step within 15%
    (with it, it exceeds the plain step by more than 30%)."""
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    module = _Net().train()
    x = torch.randn(4, 64)
    cap = capture(module, (x,))
    loss_fn = lambda out: out.square().mean()  # noqa: E731
    rounds = TimedRounds(cap)
    try:
        torch.set_num_threads(1)
        plains = []
        for _ in range(9):
            plain = time_plain_step(module, (x,), loss_fn, cpu_clock)
            plains.append(sum(plain))
            rounds.round(cpu_clock, module, (x,), loss_fn, plain)
    finally:
        torch.set_num_threads(threads)
    fwd, bwd = rounds.medians_ms(rounds.per_event_ms())
    raw_fwd, raw_bwd = rounds.medians_ms((0.0, 0.0))
    plain_ms = sorted(plains)[len(plains) // 2] * 1e3
    corrected = sum(fwd.values()) + sum(bwd.values())
    raw = sum(raw_fwd.values()) + sum(raw_bwd.values())
    assert raw > 1.3 * plain_ms
    assert corrected == pytest.approx(plain_ms, rel=0.15)
