"""Co-run contention (``simulator/corun.py``): CPU devices of one host that compute at the
same time each run slower by the profile's ``co_run_slowdown``, in proportion to the
overlap."""

from __future__ import annotations

import dataclasses

import pytest

from dl_nfv.artifacts import Group, ProfileInfo, SyncMethod
from dl_nfv.simulator import simulate
from dl_nfv.simulator.tasks import TaskKind

from .helpers import graph, mesh, op, plan

SLOW = 1.2


def _cpu(g, slowdown):
    ops = tuple(dataclasses.replace(o, fwd_ms={"cpu": o.fwd_ms[next(iter(o.fwd_ms))]},
                                    bwd_ms={"cpu": o.bwd_ms[next(iter(o.bwd_ms))]})
                for o in g.ops)
    return dataclasses.replace(g, ops=ops, profile=ProfileInfo(device_type="cpu",
                                                               co_run_slowdown=slowdown))


def _compute(result, device: int) -> list[float]:
    tg = result.tasks
    return sorted(tg.duration_ms[t] for t, k in enumerate(tg.kind)
                  if k in (TaskKind.FORWARD, TaskKind.BACKWARD) and tg.device[t] == device)


def _two_apart(slowdown):
    """Two independent ops, one per device of one host: they compute side by side."""
    g = _cpu(graph([op("a", 2.0, 4.0, param_bytes=4), op("b", 2.0, 4.0, param_bytes=4)]),
             slowdown)
    t = mesh(2, device_type="cpu")
    d = t.device_names
    groups = [Group(id="ga", ops=("a",), devices=(d[0],), sync=SyncMethod.NONE),
              Group(id="gb", ops=("b",), devices=(d[1],), sync=SyncMethod.NONE)]
    return simulate(plan(g, t, groups), g, t)


def test_side_by_side_compute_is_stretched_by_the_slowdown():
    base, slow = _two_apart(None), _two_apart(SLOW)
    for d in range(2):  # each op overlaps the other device's whole time: k = 1
        assert _compute(base, d) == pytest.approx([2.0, 4.0])
        assert _compute(slow, d) == pytest.approx([2.0 * SLOW, 4.0 * SLOW])
    # (the updates, of 4 bytes, overlap too: microseconds)
    assert slow.iteration_ms - base.iteration_ms == pytest.approx(6.0 * (SLOW - 1.0), rel=1e-3)


def test_compute_that_never_overlaps_is_not_stretched():
    """A chain across two devices: one computes while the other waits."""
    g = _cpu(graph([op("a", 2.0, 4.0, param_bytes=4), op("b", 3.0, 5.0, param_bytes=4)],
                   [("a", "b", 0)]), SLOW)
    t = mesh(2, device_type="cpu")
    d = t.device_names
    groups = [Group(id="ga", ops=("a",), devices=(d[0],), sync=SyncMethod.NONE),
              Group(id="gb", ops=("b",), devices=(d[1],), sync=SyncMethod.NONE)]
    result = simulate(plan(g, t, groups), g, t)
    # (b's update, of 4 bytes, runs beside a's backward: microseconds)
    assert _compute(result, 0) == pytest.approx([2.0, 4.0], rel=1e-3)
    assert _compute(result, 1) == pytest.approx([3.0, 5.0], rel=1e-3)
    assert _compute(result, 0)[0] == 2.0 and _compute(result, 1)[0] == 3.0  # forwards


def test_a_partial_overlap_stretches_by_its_share():
    """b (6 ms) starts with a (2 ms) beside it on the other device: a overlaps b for all of
    its time (k = 1), b for a third of its (k = 1/3)."""
    g = _cpu(graph([op("a", 2.0, 0.0), op("b", 6.0, 0.0)]), SLOW)
    t = mesh(2, device_type="cpu")
    d = t.device_names
    groups = [Group(id="ga", ops=("a",), devices=(d[0],), sync=SyncMethod.NONE),
              Group(id="gb", ops=("b",), devices=(d[1],), sync=SyncMethod.NONE)]
    result = simulate(plan(g, t, groups), g, t)
    assert _compute(result, 0) == pytest.approx([2.0 * SLOW])
    assert _compute(result, 1) == pytest.approx([6.0 * (1 + (SLOW - 1) / 3)])


def test_gpus_and_other_hosts_are_not_stretched():
    g = graph([op("a", 2.0, 4.0, param_bytes=4), op("b", 2.0, 4.0, param_bytes=4)])
    g = dataclasses.replace(g, profile=ProfileInfo(device_type="cpu", co_run_slowdown=SLOW))
    t = mesh(2)  # GPUs: the CPU profile's slowdown does not apply
    d = t.device_names
    groups = [Group(id="ga", ops=("a",), devices=(d[0],), sync=SyncMethod.NONE),
              Group(id="gb", ops=("b",), devices=(d[1],), sync=SyncMethod.NONE)]
    result = simulate(plan(g, t, groups), g, t)
    assert _compute(result, 0) == pytest.approx([2.0, 4.0])
