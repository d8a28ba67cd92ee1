"""The loss (``ProfileInfo.loss_ms``, ``loss_fixed_ms``): outside the graph, computed by the
runtime on every microbatch of the unit that ends the model, at the microbatch's rows."""

from __future__ import annotations

import dataclasses

import pytest

from dl_nfv.artifacts import Group, Pipeline, ProfileInfo, ScheduleKind, SyncMethod
from dl_nfv.simulator import CostModel, simulate
from dl_nfv.simulator.synthetic import one_f_one_b
from dl_nfv.simulator.tasks import TaskKind

from .helpers import chain, mesh, one_group, plan

LOSS_MS, FIXED_MS = 1.2, 0.4


def _cpu_chain(n: int, batch: int, loss_ms: float | None, fixed_ms: float | None = FIXED_MS):
    g = chain(n, 2.0, 4.0, param_bytes=4, batch_size=batch)
    ops = tuple(dataclasses.replace(o, fwd_ms={"cpu": 2.0}, bwd_ms={"cpu": 4.0}) for o in g.ops)
    return dataclasses.replace(g, ops=ops, profile=ProfileInfo(
        device_type="cpu", loss_ms=loss_ms, loss_fixed_ms=fixed_ms if loss_ms else None))


def _busy(result, device: int) -> float:
    tg = result.tasks
    return sum(tg.duration_ms[t] for t, k in enumerate(tg.kind)
               if k in (TaskKind.FORWARD, TaskKind.BACKWARD) and tg.device[t] == device)


def test_the_loss_is_affine_in_the_batch_fraction_on_the_profiles_device_type():
    g = _cpu_chain(2, 8, LOSS_MS)
    cpu = mesh(1, device_type="cpu")
    cm = CostModel(g, cpu)
    name = cpu.device_names[0]
    assert cm.loss_ms(name) == pytest.approx(LOSS_MS)
    assert cm.loss_ms(name, 0.25) == pytest.approx(FIXED_MS + (LOSS_MS - FIXED_MS) / 4)
    unsplit = CostModel(_cpu_chain(2, 8, LOSS_MS, fixed_ms=None), cpu)
    assert unsplit.loss_ms(name, 0.25) == pytest.approx(LOSS_MS)  # no fixed part: all of it
    assert CostModel(_cpu_chain(2, 8, None), cpu).loss_ms(name) == 0.0  # not measured
    assert CostModel(g, mesh(1)).loss_ms(mesh(1).device_names[0]) == 0.0  # a GPU type


def test_one_device_pays_the_loss_once_a_step():
    t = mesh(1, device_type="cpu")
    with_loss, bare = _cpu_chain(3, 8, LOSS_MS), _cpu_chain(3, 8, None)
    base = simulate(plan(bare, t, [one_group(bare, t.device_names)]), bare, t)
    charged = simulate(plan(with_loss, t, [one_group(with_loss, t.device_names)]), with_loss, t)
    assert _busy(charged, 0) - _busy(base, 0) == pytest.approx(LOSS_MS)
    assert charged.iteration_ms - base.iteration_ms == pytest.approx(LOSS_MS)


@pytest.mark.parametrize("m", [2, 4])
def test_the_last_pipeline_stage_pays_the_loss_on_every_microbatch(m):
    t = mesh(2, device_type="cpu")
    devices = t.device_names
    groups = [Group(id="s0", ops=("op0", "op1"), devices=(devices[0],), sync=SyncMethod.NONE),
              Group(id="s1", ops=("op2", "op3"), devices=(devices[1],), sync=SyncMethod.NONE)]
    pipe = Pipeline(microbatches=m, stages=("s0", "s1"), schedule_kind=ScheduleKind.ONE_F_ONE_B,
                    schedule={devices[i]: one_f_one_b(2, m, i) for i in range(2)})
    g, bare = _cpu_chain(4, 4 * m, LOSS_MS), _cpu_chain(4, 4 * m, None)
    result = simulate(plan(g, t, groups, pipeline=pipe), g, t)
    base = simulate(plan(bare, t, groups, pipeline=pipe), bare, t)
    assert _busy(result, 0) == pytest.approx(_busy(base, 0))  # the first stage: no loss
    per_microbatch = FIXED_MS + (LOSS_MS - FIXED_MS) / m
    assert _busy(result, 1) - _busy(base, 1) == pytest.approx(m * per_microbatch)


def test_data_parallel_replicas_pay_the_loss_at_their_share():
    t = mesh(2, device_type="cpu")
    g, bare = _cpu_chain(2, 8, LOSS_MS), _cpu_chain(2, 8, None)
    result = simulate(plan(g, t, [one_group(g, t.device_names)]), g, t)
    base = simulate(plan(bare, t, [one_group(bare, t.device_names)]), bare, t)
    for d in range(2):
        assert _busy(result, d) - _busy(base, d) == pytest.approx(FIXED_MS + (LOSS_MS - FIXED_MS) / 2)
