"""The profiler's clock and the instrumentation it takes off the ops: closed forms, and a
real step whose per-op sum, less the instrumentation, matches its plain step."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from torch import nn

from dl_nfv.profilers.capture import capture
from dl_nfv.profilers.measure import (
    TimedRounds,
    bounded_overhead,
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
    hooks: with it the per-op sum exceeds the plain step by more than 30%; less the
    measured overhead, at least half of that excess is gone (typically 70-90% on a busy
    machine) and the sum is no less than the plain step's 80% (medians over 15 rounds; the
    estimate, from the fastest rounds, leaves on the ops what other jobs add to the longer
    instrumented step)."""
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
        for _ in range(15):
            plain = time_plain_step(module, (x,), loss_fn, cpu_clock)
            plains.append(sum(plain))
            rounds.round(cpu_clock, module, (x,), loss_fn, plain)
    finally:
        torch.set_num_threads(threads)
    fwd, bwd = rounds.medians_ms(rounds.per_event_ms())
    raw_fwd, raw_bwd = rounds.medians_ms((0.0, 0.0))
    plain_ms = statistics.median(plains) * 1e3
    corrected = sum(fwd.values()) + sum(bwd.values())
    raw = sum(raw_fwd.values()) + sum(raw_bwd.values())
    assert raw > 1.3 * plain_ms
    assert 0.8 * plain_ms <= corrected <= plain_ms + (raw - plain_ms) / 2


class _SlowableClock:
    """The 1-thread CPU clock, made slow on demand: while ``slow`` is on, every reading is
    ``delay_s`` later than the last, so every interval it times is that much longer (a round
    that another job disturbed, injected deterministically)."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.slow = False
        self.offset = 0.0

    def __call__(self) -> float:
        if self.slow:
            self.offset += self.delay_s
        return cpu_clock() + self.offset


def _rounds(batch: int, count: int, slow_rounds: set[int], delay_s: float = 1e-3):
    torch.manual_seed(0)
    module = _Net().train()
    x = torch.randn(batch, 64)
    cap = capture(module, (x,))
    loss_fn = lambda out: out.square().mean()  # noqa: E731
    rounds, clock = TimedRounds(cap), _SlowableClock(delay_s)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for k in range(count):
            plain = time_plain_step(module, (x,), loss_fn, cpu_clock)
            clock.slow = k in slow_rounds
            rounds.round(clock, module, (x,), loss_fn, plain)
            clock.slow = False
    finally:
        torch.set_num_threads(threads)
    return rounds


def test_a_slow_majority_of_rounds_does_not_inflate_the_instrumentation_estimate():
    """Three of five instrumented rounds slowed by 1 ms per clock reading: the per-op
    medians (and an estimate from them) carry it, the fastest round of each kind does not."""
    rounds = _rounds(4, 5, {0, 2, 4})
    fwd_events, bwd_events = (sum(e.values()) for e in rounds.events)
    sums = [sum(v[k] for v in rounds.fwd_runs.values()) for k in range(5)]
    plain = [p[0] for p in rounds.plain]
    assert min(sums[k] - plain[k] for k in (0, 2, 4)) / fwd_events > 1e-3  # injected: > 1 ms
    per_f, per_b = rounds.per_event_ms()
    assert per_f == pytest.approx(max(0.0, min(sums[1], sums[3]) - min(plain)) / fwd_events * 1e3)
    assert per_f < 0.2 and per_b < 0.2  # tens of µs of Python per event
    # the estimate from the medians, which such rounds drive up by their delay
    median_sum = sum(statistics.median(v) for v in rounds.fwd_runs.values())
    assert per_event_overhead(median_sum, statistics.median(plain), fwd_events) * 1e3 > 1.0
    fwd, bwd = rounds.medians_ms(rounds.per_event_ms())
    raw_fwd, _ = rounds.medians_ms((0.0, 0.0))
    assert all(0 <= fwd[k] <= raw_fwd[k] for k in fwd) and bwd_events > 0


def test_the_full_batch_estimate_is_bounded_by_the_small_batch_one():
    """Every full-batch round slowed (a machine busy throughout), the small batch's rounds
    not: the bound takes the small batch's figure; undisturbed, the smaller one stands."""
    full = _rounds(64, 3, {0, 1, 2}).per_event_ms()
    small = _rounds(8, 3, set()).per_event_ms()
    assert full[0] > 1.0
    assert bounded_overhead(full, small) == (min(full[0], small[0]), min(full[1], small[1]))
    assert bounded_overhead(full, small)[0] == small[0] < 0.2
    assert bounded_overhead(full, None) == full


def test_unit_actions_are_timed_through_the_runtimes_units_against_plain_steps():
    """Two units of a real model on one device, 4 microbatches, and every op a unit: a
    figure per action that is positive (a separate autograd pass per unit costs something)
    and below a whole step's time, one per further action, and the microbatch counts that
    divide the batch."""
    from dl_nfv.profilers import zoo
    from dl_nfv.profilers.actions import microbatches, unit_action_ms

    assert [microbatches(b) for b in (8, 6, 3, 1)] == [4, 2, 1, 1]
    ref = zoo.model_ref("mlp-tiny", batch_size=8)
    workload = zoo.instantiate(ref, seed=0)
    module = workload.module.train()
    inputs, _ = workload.make_batch(8, 0)
    cap = capture(module, inputs)
    ms, per_op, turn, note = unit_action_ms(cap, workload, module, 8, 0, rounds=9)
    plain = min(sum(time_plain_step(module, inputs, lambda out: workload.loss(out, _target(
        workload)), cpu_clock)) for _ in range(5)) * 1e3
    assert ms is not None and 0 < ms < plain and "2 units x 4 microbatches" in note
    ops = len([o for o in cap.op_ids if o not in set(cap.input_ops)])
    assert per_op is not None and 0 <= per_op < plain
    assert f"every op a unit of its own ({ops} units, 2 row(s) per microbatch)" in note
    assert turn is not None and 0 <= turn < plain and "per further turn" in note
    assert torch.get_num_threads() == 1  # restored (the suite runs one thread)


def _target(workload):
    return workload.make_batch(8, 0)[1]


class _RoundClock:
    """A clock for ``unit_action_ms`` that makes each step of round ``r`` (in the probe's
    order) take ``ms[name][r - 1]`` milliseconds; round 0 (settling, read once per step) and
    the real time the steps take do not count."""

    def __init__(self, names: list[str], ms: dict[str, list[float]]):
        self.names, self.ms = names, ms
        self.t, self.calls = 0.0, 0

    def __call__(self) -> float:
        n = len(self.names)
        k, self.calls = self.calls, self.calls + 1
        if k < n:  # round 0: one reading per step
            return self.t
        k -= n
        r, i, end = k // (2 * n) + 1, k % (2 * n) // 2, k % 2
        if end:
            self.t += self.ms[self.names[i]][r - 1] / 1e3
        return self.t


def test_unit_action_figures_are_the_median_of_differences_taken_within_a_round():
    """The probe's steps run side by side in every round; each figure is the median over
    rounds of a round's difference, so a round where one step alone ran fast (the machine's
    moment) moves nothing, where the difference of fastest rounds would take it whole."""
    from dl_nfv.profilers import zoo
    from dl_nfv.profilers.actions import paired_ms, unit_action_ms

    assert paired_ms([3.0, 5.0, 4.0, 2.0, 3.0], [1.0, 1.0, 3.5, 1.5, 2.0]) == 1000.0
    assert paired_ms([1.0], [2.0]) == 0.0
    # the rounds' signs as a coin's could give them: not resolved, whatever the median
    assert paired_ms([3.0, 5.0, 4.0, 2.0], [1.0, 1.0, 3.5, 1.5]) == 0.0  # 4 of 4: p 1/16
    assert paired_ms([9.0, 9.0, 9.0, 0.0, 0.0, 9.0], [1.0] * 6) == 0.0  # 4 of 6 above
    ref = zoo.model_ref("mlp-tiny", batch_size=8)
    workload = zoo.instantiate(ref, seed=0)
    module = workload.module.train()
    cap = capture(module, workload.make_batch(8, 0)[0])
    ops = len([o for o in cap.op_ids if o not in set(cap.input_ops)])
    rounds = 5
    plain = [10.0, 12.0, 11.0, 4.0, 10.5]  # round 4: the plain step alone ran fast
    ms = {"plain": plain,
          "halves": [p + 1.6 for p in (10.0, 12.0, 11.0, 10.0, 10.5)],  # 16 actions: 0.1 ms
          "grouped": [p + 1.6 - 0.6 for p in (10.0, 12.0, 11.0, 10.0, 10.5)],  # 6 turns
          "small ops": [p + 1.6 + 0.02 * (2 * ops * 4 - 16)
                        for p in (10.0, 12.0, 11.0, 10.0, 10.5)]}
    clock = _RoundClock(["halves", "grouped", "small ops", "plain"], ms)
    unit, per_op, turn, note, *_ = unit_action_ms(cap, workload, module, 8, 0, rounds=rounds,
                                                  clock=clock)
    assert clock.calls == 4 + 2 * 4 * rounds  # the order and rounds the clock assumed
    assert unit == pytest.approx(0.1) and turn == pytest.approx(0.1)
    assert per_op == pytest.approx(0.02)
    assert f"median of {rounds} rounds' differences" in note
    # from the fastest rounds: (10 + 1.6 - 4) / 16 actions
    assert (min(ms["halves"]) - min(plain)) / 16 == pytest.approx(0.475)


def test_the_probe_adds_rounds_until_its_differences_are_resolved():
    """Two rounds of five where the step of units ran no longer than the plain one leave
    the sign test unresolved (3 of 5 above: 0 by the rounds given); the probe times more
    rounds, until 9 of 11 are above (p 0.033), and the figure is their median."""
    from dl_nfv.profilers import zoo
    from dl_nfv.profilers.actions import paired_ms, resolved, unit_action_ms

    ref = zoo.model_ref("mlp-tiny", batch_size=8)
    workload = zoo.instantiate(ref, seed=0)
    module = workload.module.train()
    cap = capture(module, workload.make_batch(8, 0)[0])
    ops = len([o for o in cap.op_ids if o not in set(cap.input_ops)])
    plain = [10.0] * 20
    over = [1.6, -0.5, 1.6, -0.5, 1.6] + [1.6] * 15  # halves' excess: 16 actions of 0.1 ms
    ms = {"plain": plain, "halves": [p + d for p, d in zip(plain, over)],
          "grouped": [p + d - 0.6 for p, d in zip(plain, over)],
          "small ops": [p + d + 0.02 * (2 * ops * 4 - 16) for p, d in zip(plain, over)]}
    assert paired_ms(ms["halves"][:5], plain[:5]) == 0.0 and not resolved(ms["halves"][:10],
                                                                          plain[:10])
    clock = _RoundClock(["halves", "grouped", "small ops", "plain"], ms)
    unit, per_op, turn, note = unit_action_ms(cap, workload, module, 8, 0, rounds=5,
                                              clock=clock)
    assert clock.calls == 4 + 2 * 4 * 11
    assert unit == pytest.approx(0.1) and "median of 11 rounds' differences" in note
    assert turn == pytest.approx(0.1) and per_op == pytest.approx(0.02)


def test_a_long_steps_unit_actions_are_taken_at_a_few_rows_or_not_at_all():
    """A one-thread step over ``FULL_BATCH_S``: the halves and the plain steps run at
    ``SMALL_ROWS`` rows per microbatch too; a round estimated over ``BUDGET_S``: no figure,
    and the note says why."""
    from dl_nfv.profilers import zoo
    from dl_nfv.profilers.actions import BUDGET_S, FULL_BATCH_S, SMALL_ROWS, unit_action_ms

    ref = zoo.model_ref("mlp-tiny", batch_size=16)
    workload = zoo.instantiate(ref, seed=0)
    module = workload.module.train()
    cap = capture(module, workload.make_batch(16, 0)[0])
    ms, per_op, turn, note = unit_action_ms(cap, workload, module, 16, 0, rounds=2,
                                            step_s=2 * FULL_BATCH_S)
    assert ms is not None and per_op is not None and turn is not None
    assert f"4 microbatches at {SMALL_ROWS} row(s) per microbatch" in note
    # 4 steps a round (halves, grouped halves, plain, every op a unit) at half the batch
    over = BUDGET_S / 2 * 1.01
    assert unit_action_ms(cap, workload, module, 16, 0, step_s=over) == (
        None, None, None, f"no unit actions measured (a round of the probe would take about "
                          f"{2 * over:.0f} s at one thread, over its {BUDGET_S:.0f} s); ")
    assert torch.get_num_threads() == 1


def test_the_turn_probe_runs_the_halves_in_1f1b_turns_and_in_gpipe_order():
    """The probe's step takes turns per microbatch; grouped, it runs every forward first, so
    it turns once where the other turns ``2 M - 1`` times, and each half's actions back to
    back (the head's forwards, the tail's, the tail's backwards, the head's)."""
    from dl_nfv.profilers import zoo
    from dl_nfv.profilers.actions import _UnitStep
    from dl_nfv.profilers.probe import probe

    ref = zoo.model_ref("mlp-tiny", batch_size=8)
    workload = zoo.instantiate(ref, seed=0)
    module = workload.module.train()
    cap = capture(module, workload.make_batch(8, 0)[0])
    ops = [o for o in cap.op_ids if o not in set(cap.input_ops)]
    halves = {op: ("head", "tail")[k >= len(ops) // 2] for k, op in enumerate(ops)}
    info = probe(cap.graph_module, lambda rows: workload.make_batch(rows, 0)[0])
    step = _UnitStep(cap, workload, info, halves, 8, 4, 0)

    def directions(grouped: bool) -> list[str]:
        step(grouped=grouped)
        names = [name for category, name, _, _ in step.comm.timeline.spans
                 if category == "compute"]
        units.append([name.split()[1] for name in names])
        return [name.split()[0] for name in names]

    def turns(seq: list[str]) -> int:
        return sum(a != b for a, b in zip(seq, seq[1:]))

    units: list[list[str]] = []
    taking_turns, grouped = directions(False), directions(True)
    assert sorted(taking_turns) == sorted(grouped) == ["backward"] * 8 + ["forward"] * 8
    assert grouped == ["forward"] * 8 + ["backward"] * 8
    assert turns(taking_turns) == 2 * 4 - 1 and turns(grouped) == 1
    assert units[0] == ["head", "tail", "tail", "head"] * 4
    assert units[1] == ["head"] * 4 + ["tail"] * 8 + ["head"] * 4
