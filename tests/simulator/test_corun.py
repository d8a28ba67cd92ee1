"""Co-run contention (``simulator/corun.py``): CPU devices of one host that compute at the
same time each run slower by the profile's ``co_run_slowdown`` (their updates by its
``update_co_run_slowdown``), in proportion to the overlap and to the data the neighbours
bring beyond one replica's."""

from __future__ import annotations

import dataclasses

import pytest

from dl_nfv.artifacts import Group, ProfileInfo, SyncMethod
from dl_nfv.simulator import simulate
from dl_nfv.simulator.tasks import TaskKind

from .helpers import graph, mesh, one_group, op, plan

SLOW = 1.2


def _cpu(g, slowdown, update_slowdown=None):
    ops = tuple(dataclasses.replace(o, fwd_ms={"cpu": o.fwd_ms[next(iter(o.fwd_ms))]},
                                    bwd_ms={"cpu": o.bwd_ms[next(iter(o.bwd_ms))]})
                for o in g.ops)
    return dataclasses.replace(g, ops=ops, profile=ProfileInfo(
        device_type="cpu", co_run_slowdown=slowdown, update_co_run_slowdown=update_slowdown))


def _updates(result, device: int) -> list[float]:
    tg = result.tasks
    return [tg.duration_ms[t] for t, k in enumerate(tg.kind)
            if k == TaskKind.UPDATE and tg.device[t] == device]


def _compute(result, device: int) -> list[float]:
    tg = result.tasks
    return sorted(tg.duration_ms[t] for t, k in enumerate(tg.kind)
                  if k in (TaskKind.FORWARD, TaskKind.BACKWARD) and tg.device[t] == device)


def _two_apart(slowdown, a_bytes=4, b_bytes=4):
    """Two independent ops, one per device of one host: they compute side by side."""
    g = _cpu(graph([op("a", 2.0, 4.0, param_bytes=a_bytes),
                    op("b", 2.0, 4.0, param_bytes=b_bytes)]), slowdown)
    t = mesh(2, device_type="cpu")
    d = t.device_names
    groups = [Group(id="ga", ops=("a",), devices=(d[0],), sync=SyncMethod.NONE),
              Group(id="gb", ops=("b",), devices=(d[1],), sync=SyncMethod.NONE)]
    return simulate(plan(g, t, groups), g, t)


def _replicas(slowdown, n, param_bytes=3000, output_bytes=0, update_slowdown=None):
    """Data parallelism of one op over ``n`` devices of one host."""
    g = _cpu(graph([op("a", 2.0, 4.0, param_bytes=param_bytes, output_bytes=output_bytes)]),
             slowdown, update_slowdown)
    t = mesh(n, device_type="cpu")
    return simulate(plan(g, t, [one_group(g, t.device_names)]), g, t)


def test_two_replicas_are_stretched_by_the_slowdown():
    """Each replica holds one replica's data (w = 1) beside another (n = 1): s itself."""
    base, slow = _replicas(None, 2), _replicas(SLOW, 2)
    for d in range(2):
        assert _compute(base, d) == pytest.approx([1.0, 2.0], rel=2e-3)  # half the batch each
        assert _compute(slow, d) == pytest.approx([x * SLOW for x in _compute(base, d)])


def test_replicas_updating_at_once_take_the_updates_own_slowdown():
    """The update streams parameters, gradients and state: its own figure, not the
    compute's; without one, the compute's."""
    base = _replicas(None, 2, param_bytes=3 * 2**20)
    own = _replicas(SLOW, 2, param_bytes=3 * 2**20, update_slowdown=1.5)
    same = _replicas(SLOW, 2, param_bytes=3 * 2**20)
    for d in range(2):
        (alone,) = _updates(base, d)
        assert alone > 0
        assert _updates(own, d) == pytest.approx([alone * 1.5])
        assert _updates(same, d) == pytest.approx([alone * SLOW])
        assert _compute(own, d) == pytest.approx([x * SLOW for x in _compute(base, d)])
    # an update figure alone still makes the host contended, for the updates only
    upd = _replicas(None, 2, param_bytes=3 * 2**20, update_slowdown=1.5)
    for d in range(2):
        assert _updates(upd, d) == pytest.approx([_updates(base, d)[0] * 1.5])
        assert _compute(upd, d) == pytest.approx(_compute(base, d))


def test_three_replicas_extrapolate_linearly():
    """Two neighbours of one replica each: twice the slowdown's excess."""
    base, slow = _replicas(None, 3), _replicas(SLOW, 3)
    for d in range(3):
        assert _compute(slow, d) == pytest.approx([x * (1 + 2 * (SLOW - 1))
                                                   for x in _compute(base, d)])


def test_replicas_with_activations_are_charged_what_their_data_exceeds():
    """A replica holds the parameters, gradients and SGD state (3 x 3000 bytes) and half
    the activations (1000 of 2000): w = 10000 / 11000 each, so the pair holds 2w - 1 copies
    more than the alone times paid for."""
    base = _replicas(None, 2, param_bytes=3000, output_bytes=2000)
    slow = _replicas(SLOW, 2, param_bytes=3000, output_bytes=2000)
    w = 10000 / 11000
    for d in range(2):
        assert _compute(slow, d) == pytest.approx([x * (1 + (2 * w - 1) * (SLOW - 1))
                                                   for x in _compute(base, d)])


@pytest.mark.parametrize("a_bytes, b_bytes", [(4, 4), (12, 4), (4, 4000)])
def test_devices_that_share_one_replica_are_not_stretched(a_bytes, b_bytes):
    """A placement or pipeline: the two devices together hold one replica's data, which
    the alone times already computed beside (w + n = 1), however it is divided."""
    base, slow = _two_apart(None, a_bytes, b_bytes), _two_apart(SLOW, a_bytes, b_bytes)
    for d in range(2):
        assert _compute(base, d) == pytest.approx([2.0, 4.0], rel=1e-3)
        assert _compute(slow, d) == _compute(base, d)
    assert slow.iteration_ms == base.iteration_ms


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
    """Ops without bytes (no footprint known): every device counts as one replica. b (6 ms)
    starts with a (2 ms) beside it on the other device: a overlaps b for all of its time
    (n = 1), b for a third of its (n = 1/3)."""
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
