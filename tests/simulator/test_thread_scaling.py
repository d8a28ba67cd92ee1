"""A CPU profile's op times carried to each device's cores: closed forms of the scaling law,
the cost model's per-device columns, and the notes that say where it extrapolates."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dl_nfv.artifacts import Op, ProfileInfo, Topology, from_data
from dl_nfv.simulator import CostModel
from dl_nfv.simulator.extrapolation import (
    SCALING,
    SCALING_BEYOND,
    SCALING_NONE,
    at_threads,
    extrapolation_notes,
)

from .helpers import graph


def _cpu_host(cores: list[int]) -> Topology:
    return from_data(Topology, {"name": "cpus", "hosts": [{
        "name": "h", "devices": [{"type": "cpu", "count": 1, "cores": c, "prefix": f"c{c}x"}
                                 for c in cores],
        "interconnect": {"kind": "loopback", "bandwidth_gbps": 10.0, "latency_us": 10.0}}]})


def _profiled(threads: int, counts: tuple[int, ...], fwd: dict[int, float], bwd: dict[int, float],
              fixed: float = 0.0):
    """One op timed at ``counts`` threads (``fwd``/``bwd`` per count), profiled at ``threads``."""
    others = {str(n): fwd[n] for n in counts if n != threads}
    op = Op(id="a", name="a", param_bytes=4, fwd_ms={"cpu": fwd[threads]},
            bwd_ms={"cpu": bwd[threads]}, fwd_fixed_ms={"cpu": fixed} if fixed else {},
            fwd_ms_by_threads=others,
            bwd_ms_by_threads={str(n): bwd[n] for n in counts if n != threads})
    g = graph([op])
    return dataclasses.replace(g, profile=ProfileInfo(device_type="cpu", threads=threads,
                                                      thread_counts=counts))


def test_measured_counts_are_used_as_measured_and_between_them_linear_in_one_over_n():
    # t(n) = 1 + 6 / n: t(1) = 7, t(2) = 4, t(6) = 2; at 3 between 2 and 6: 1 + 6/3 = 3
    points = {1: 7.0, 2: 4.0, 6: 2.0}
    assert at_threads(points, 2) == 4.0
    assert at_threads(points, 3) == pytest.approx(3.0)
    assert at_threads(points, 4) == pytest.approx(2.5)


def test_beyond_the_largest_count_the_line_is_held_between_perfect_scaling_and_the_slowest():
    assert at_threads({1: 7.0, 2: 4.0}, 6) == pytest.approx(2.0)  # a = 1, b = 6
    assert at_threads({1: 4.0, 2: 1.0}, 4) == pytest.approx(0.5)  # the line says -0.5
    assert at_threads({1: 2.0, 2: 3.0}, 8) == pytest.approx(3.0)  # slower with threads: held
    assert at_threads({3: 5.0}, 1) == 5.0  # one measurement: used as measured


@given(st.floats(0.01, 100), st.floats(0.01, 100), st.integers(1, 64))
def test_scaled_times_stay_within_perfect_scaling_and_the_slowest_measurement(t1, t2, n):
    got = at_threads({1: t1, 2: t2}, n)
    assert min(t1 / n, t2 * 2 / n, t1, t2) - 1e-9 <= got <= max(t1, t2) + 1e-9


def test_each_device_gets_its_ops_at_its_own_cores():
    # profiled at 2 threads, also timed at 1 and 4
    g = _profiled(2, (1, 2, 4), {1: 8.0, 2: 5.0, 4: 3.5}, {1: 16.0, 2: 10.0, 4: 7.0}, fixed=2.0)
    cm = CostModel(g, _cpu_host([1, 2, 3, 4]))
    by_cores = {c: f"h/c{c}x0" for c in (1, 2, 3, 4)}
    assert cm.op_ms("a", by_cores[1]) == 8.0 and cm.op_ms("a", by_cores[1], "bwd") == 16.0
    assert cm.op_ms("a", by_cores[2]) == 5.0 and cm.op_ms("a", by_cores[4]) == 3.5
    # 3 cores, between 2 and 4: 5 + (3.5 - 5) (1/3 - 1/2) / (1/4 - 1/2) = 4.0
    assert cm.op_ms("a", by_cores[3]) == pytest.approx(4.0)
    # the batch-independent part scales with the op: at 1 core 2 x 8 / 5 = 3.2 of 8
    assert cm.op_ms("a", by_cores[1], batch_fraction=0.5) == pytest.approx(3.2 + (8 - 3.2) / 2)
    assert cm.type_index["cpu"] == cm.device_type_index[by_cores[1]]  # the type's first column


def test_a_profile_without_other_thread_counts_is_used_as_measured_and_said_so():
    g = _profiled(2, (), {2: 5.0}, {2: 10.0})
    t = _cpu_host([1, 2])
    cm = CostModel(g, t)
    assert cm.op_ms("a", "h/c1x0") == 5.0
    (note,) = extrapolation_notes(t.device_names, g, t)
    assert note == ("h/c1x0 has 1 core, but the graph was profiled with 2 threads: its op times "
                    f"are extrapolated (scaling: {SCALING_NONE})")


def test_notes_name_interpolated_and_extrapolated_devices_and_leave_measured_ones_out():
    g = _profiled(2, (1, 2, 4), {1: 8.0, 2: 5.0, 4: 3.5}, {1: 16.0, 2: 10.0, 4: 7.0})
    t = _cpu_host([1, 3, 4, 6])
    assert extrapolation_notes(t.device_names, g, t) == (
        f"h/c3x0 has 3 cores, but the graph was timed at 1, 2, 4 threads: its op times are "
        f"interpolated (scaling: {SCALING})",
        f"h/c6x0 has 6 cores, but the graph was timed at 1, 2, 4 threads: its op times are "
        f"extrapolated (scaling: {SCALING_BEYOND})")


def test_fixed_parts_measured_at_each_thread_count_are_carried_like_the_op():
    # fixed parts timed at 2 threads (2.0) and at 1 (1.5): at 1 core the measurement, not
    # 2.0 scaled by the op's factor 8 / 5 (3.2); at 4 cores the line through 1 and 2
    g = _profiled(2, (1, 2), {1: 8.0, 2: 5.0}, {1: 16.0, 2: 10.0}, fixed=2.0)
    op = dataclasses.replace(g.ops[0], fwd_fixed_ms_by_threads={"1": 1.5},
                             bwd_fixed_ms_by_threads={"1": 3.0}, bwd_fixed_ms={"cpu": 2.5})
    g = dataclasses.replace(g, ops=(op,))
    cm = CostModel(g, _cpu_host([1, 2, 4]))
    assert cm.op_ms("a", "h/c1x0", batch_fraction=0.5) == pytest.approx(1.5 + (8 - 1.5) / 2)
    assert cm.op_ms("a", "h/c1x0", "bwd", 0.25) == pytest.approx(3.0 + (16 - 3.0) / 4)
    assert cm.op_ms("a", "h/c2x0", batch_fraction=0.5) == pytest.approx(2.0 + (5 - 2.0) / 2)
    # at 4: 1.5 + (2.0 - 1.5) (1/4 - 1) / (1/2 - 1) = 2.25, above perfect scaling's 1.0 and
    # held at the slowest measurement (2.0)
    fixed_4 = at_threads({1: 1.5, 2: 2.0}, 4)
    assert cm.op_ms("a", "h/c4x0", batch_fraction=0.5) == pytest.approx(
        fixed_4 + (cm.op_ms("a", "h/c4x0") - fixed_4) / 2)


def test_an_op_measured_at_zero_at_the_profiles_threads_takes_its_time_at_the_cores():
    g = _profiled(2, (1, 2), {1: 0.4, 2: 0.0}, {1: 0.2, 2: 0.0})
    cm = CostModel(g, _cpu_host([1]))
    assert cm.op_ms("a", "h/c1x0") == pytest.approx(0.4)
    assert cm.op_ms("a", "h/c1x0", "bwd") == pytest.approx(0.2)
