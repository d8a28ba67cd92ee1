"""The runtime's CPU per unit action (``ProfileInfo.unit_action_ms``, ``op_action_ms``): one
forward and one backward action per runtime unit, replica and microbatch on CPU devices of
the profile's type."""

from __future__ import annotations

import dataclasses

import pytest

from dl_nfv.artifacts import (
    Group,
    Pipeline,
    ProfileInfo,
    ScheduleKind,
    SyncMethod,
)
from dl_nfv.simulator import CostModel, simulate
from dl_nfv.simulator.synthetic import one_f_one_b
from dl_nfv.simulator.tasks import TaskKind

from .helpers import chain, graph, mesh, one_group, op, plan

ACTION_MS = 0.25


def _cpu_chain(n: int, batch: int, action_ms: float | None, op_action_ms: float | None = None):
    g = chain(n, 2.0, 4.0, param_bytes=4, batch_size=batch)
    ops = tuple(dataclasses.replace(o, fwd_ms={"cpu": 2.0}, bwd_ms={"cpu": 4.0}) for o in g.ops)
    return dataclasses.replace(g, ops=ops, profile=ProfileInfo(
        device_type="cpu", unit_action_ms=action_ms, op_action_ms=op_action_ms))


def _compute_busy(result, device: int) -> float:
    tg = result.tasks
    return sum(tg.duration_ms[t] for t, k in enumerate(tg.kind)
               if k in (TaskKind.FORWARD, TaskKind.BACKWARD) and tg.device[t] == device)


def test_one_device_pays_one_forward_and_one_backward_action():
    t = mesh(1, device_type="cpu")
    with_actions = _cpu_chain(3, 8, ACTION_MS)
    without = _cpu_chain(3, 8, None)
    p = plan(without, t, [one_group(without, t.device_names)])
    base = simulate(p, without, t)
    charged = simulate(plan(with_actions, t, [one_group(with_actions, t.device_names)]),
                       with_actions, t)
    f, b = CostModel(without, t).ops_ms(["op0", "op1", "op2"], t.device_names[0], 1.0)
    assert _compute_busy(base, 0) == pytest.approx(f + b)
    assert _compute_busy(charged, 0) == pytest.approx(f + b + 2 * ACTION_MS)
    assert charged.iteration_ms - base.iteration_ms == pytest.approx(2 * ACTION_MS)
    assert CostModel(with_actions, mesh(1)).unit_action_ms(mesh(1).device_names[0]) == 0.0  # a GPU


@pytest.mark.parametrize("m", [2, 4])
def test_a_pipeline_stage_pays_two_actions_per_microbatch(m):
    t = mesh(2, device_type="cpu")
    devices = t.device_names
    g = _cpu_chain(4, 4 * m, ACTION_MS)
    groups = [Group(id="s0", ops=("op0", "op1"), devices=(devices[0],), sync=SyncMethod.NONE),
              Group(id="s1", ops=("op2", "op3"), devices=(devices[1],), sync=SyncMethod.NONE)]
    pipe = Pipeline(microbatches=m, stages=("s0", "s1"), schedule_kind=ScheduleKind.ONE_F_ONE_B,
                    schedule={devices[i]: one_f_one_b(2, m, i) for i in range(2)})
    result = simulate(plan(g, t, groups, pipeline=pipe), g, t)
    bare = _cpu_chain(4, 4 * m, None)
    base = simulate(plan(bare, t, groups, pipeline=pipe), bare, t)
    cm = CostModel(bare, t)
    for d in range(2):  # the stage's ops at 1/m of the batch, m times, and 2 actions each
        f, b = cm.ops_ms([f"op{2 * d}", f"op{2 * d + 1}"], devices[d], 1 / m)
        assert _compute_busy(base, d) == pytest.approx(m * (f + b))
        assert _compute_busy(result, d) == pytest.approx(m * (f + b) + 2 * m * ACTION_MS)


OP_ACTION_MS = 0.04


@pytest.mark.parametrize(("split", "units_per_device"), [
    ((("op0", "op1"), ("op2", "op3")), 1),  # each device one run of ops: one unit
    ((("op0", "op2"), ("op1", "op3")), 2),  # the devices take turns: every op its own unit
])
def test_an_op_placement_pays_two_actions_per_run_of_ops(split, units_per_device):
    t = mesh(2, device_type="cpu")
    devices = t.device_names
    groups = [Group(id=f"on{d}", ops=ops, devices=(devices[d],), sync=SyncMethod.NONE)
              for d, ops in enumerate(split)]
    bare = _cpu_chain(4, 8, None)
    base = simulate(plan(bare, t, groups), bare, t)
    measured = _cpu_chain(4, 8, ACTION_MS, OP_ACTION_MS)
    older = _cpu_chain(4, 8, ACTION_MS)  # a profile without the per-op figure
    result = simulate(plan(measured, t, groups), measured, t)
    fallback = simulate(plan(older, t, groups), older, t)
    for d in range(2):
        extra = _compute_busy(result, d) - _compute_busy(base, d)
        assert extra == pytest.approx(2 * units_per_device * OP_ACTION_MS)
        # without it, each group pays as a pipeline stage does: two actions
        assert _compute_busy(fallback, d) - _compute_busy(base, d) == pytest.approx(2 * ACTION_MS)


def _diamond():
    """a -> b, a -> c, b -> d, c -> d; every op 2 ms forward, 4 ms backward, with parameters."""
    ops = [op(name, 2.0, 4.0, param_bytes=4, output_bytes=1024) for name in "abcd"]
    return graph(ops, [("a", "b", 1024), ("a", "c", 1024), ("b", "d", 1024), ("c", "d", 1024)])


def _spans(result, kind: TaskKind, device: int) -> list[tuple[float, float]]:
    tg, s = result.tasks, result.schedule
    return sorted((s.start_ms[t], s.end_ms[t]) for t, k in enumerate(tg.kind)
                  if k == kind and tg.device[t] == device)


def test_a_runtime_unit_of_an_op_placement_is_one_task():
    """A chain a -> b -> c -> d with a, b on one device and c, d on the other runs as two
    runtime units: one forward and one backward task each, of their ops' summed times."""
    t = mesh(2)
    devices = t.device_names
    g = chain(4, 2.0, 4.0, edge_bytes=1024)
    groups = [Group(id="first", ops=("op0", "op1"), devices=(devices[0],), sync=SyncMethod.NONE),
              Group(id="second", ops=("op2", "op3"), devices=(devices[1],), sync=SyncMethod.NONE)]
    result = simulate(plan(g, t, groups), g, t)
    for d in range(2):
        assert [e - s for s, e in _spans(result, TaskKind.FORWARD, d)] == [pytest.approx(4.0)]
        assert [e - s for s, e in _spans(result, TaskKind.BACKWARD, d)] == [pytest.approx(8.0)]
    (f0,), (f1,) = _spans(result, TaskKind.FORWARD, 0), _spans(result, TaskKind.FORWARD, 1)
    (b0,), (b1,) = _spans(result, TaskKind.BACKWARD, 0), _spans(result, TaskKind.BACKWARD, 1)
    assert f1[0] >= f0[1] and b1[0] >= f1[1] and b0[0] >= b1[1]  # the chain, in order


def test_an_op_that_sends_to_another_device_ends_its_unit():
    """a, c on one device and b, d on the other, in the diamond: a feeds b, so a ends its
    unit and b runs beside c (the step is not one chain through a+c, then b+d)."""
    t = mesh(2)
    devices = t.device_names
    g = _diamond()
    groups = [Group(id="first", ops=("a", "c"), devices=(devices[0],), sync=SyncMethod.NONE),
              Group(id="second", ops=("b", "d"), devices=(devices[1],), sync=SyncMethod.NONE)]
    result = simulate(plan(g, t, groups), g, t)
    (_, c), (b, _) = _spans(result, TaskKind.FORWARD, 0), _spans(result, TaskKind.FORWARD, 1)
    assert b[0] < c[1] and c[0] < b[1]  # b and c overlap
    assert result.iteration_ms < 24.0  # less than every forward and backward in a line


@pytest.mark.parametrize("order", [("z", "r", "s", "t", "u"), ("r", "s", "z", "t", "u"),
                                   ("r", "s", "t", "u", "z")])
def test_groups_that_share_a_device_run_in_the_devices_order(order):
    """Two groups on one device, in any order the device may take: the run is cut where
    the group changes along that order, never into units that wait on each other, and the
    step is every op once, as the same ops in one group."""
    t = mesh(1)
    device = t.device_names[0]
    ops = [op(name, 1.0 + i, 2.0 + i, param_bytes=4) for i, name in enumerate("rstuz")]
    g = graph(ops, [("r", "s", 0), ("s", "t", 0), ("t", "u", 0)])
    two = [Group(id="g1", ops=("r", "s"), devices=(device,), sync=SyncMethod.NONE),
           Group(id="g2", ops=("z", "t", "u"), devices=(device,), sync=SyncMethod.NONE)]
    split = simulate(plan(g, t, two, order={device: order}), g, t)
    whole = simulate(plan(g, t, [one_group(g, (device,))], order={device: order}), g, t)
    assert split.iteration_ms == pytest.approx(whole.iteration_ms)
    assert _compute_busy(split, 0) == pytest.approx(sum(1.0 + i + 2.0 + i for i in range(5)))


def test_a_runtime_unit_runs_no_backward_for_its_ops_that_need_no_gradient():
    """x (no parameters, nothing before it has any) and a with parameters are one unit on
    the first device: its backward is a's alone, as autograd runs no backward for x."""
    t = mesh(2)
    devices = t.device_names
    ops = [op("x", 2.0, 4.0), op("a", 2.0, 4.0, param_bytes=4), op("b", 2.0, 4.0, param_bytes=4)]
    g = graph(ops, [("x", "a", 1024), ("a", "b", 1024)])
    groups = [Group(id="first", ops=("x", "a"), devices=(devices[0],), sync=SyncMethod.NONE),
              Group(id="second", ops=("b",), devices=(devices[1],), sync=SyncMethod.NONE)]
    result = simulate(plan(g, t, groups), g, t)
    assert [e - s for s, e in _spans(result, TaskKind.FORWARD, 0)] == [pytest.approx(4.0)]
    assert [e - s for s, e in _spans(result, TaskKind.BACKWARD, 0)] == [pytest.approx(4.0)]


TURN_MS = 0.3


def _turning_chain(batch: int, turn_ms: float | None, fixed: tuple[float, ...] | None = None):
    g = _cpu_chain(4, batch, None)
    ops = tuple(dataclasses.replace(
        o, fwd_fixed_ms={} if fixed is None else {"cpu": fixed[i]},
        bwd_fixed_ms={} if fixed is None else {"cpu": 2 * fixed[i]}) for i, o in enumerate(g.ops))
    return dataclasses.replace(g, ops=ops, profile=dataclasses.replace(g.profile, turn_ms=turn_ms))


@pytest.mark.parametrize("kind", [ScheduleKind.ONE_F_ONE_B, ScheduleKind.GPIPE])
@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("fixed", [None, (0.1, 0.3, 0.2, 0.4), (0.01,) * 4])
def test_an_action_that_does_not_turn_takes_a_turn_less_than_the_op_times(kind, m, fixed):
    """The op times hold a turn (forward-then-backward steps), so each action of a device's
    schedule in the direction of the action before it costs the stage's share of
    ``turn_ms`` less (by the ops' batch-independent times), at most the action's
    batch-independent time (none where no fixed parts were measured). A GPipe stage's
    forwards and backwards after its first, a 1F1B stage's warm-up and cool-down; a
    schedule that turns at every action (one microbatch, 1F1B's last stage) costs what the
    op times say."""
    from dl_nfv.simulator.synthetic import gpipe

    t = mesh(2, device_type="cpu")
    devices = t.device_names
    groups = [Group(id="s0", ops=("op0", "op1"), devices=(devices[0],), sync=SyncMethod.NONE),
              Group(id="s1", ops=("op2", "op3"), devices=(devices[1],), sync=SyncMethod.NONE)]
    schedule = {devices[i]: (one_f_one_b(2, m, i) if kind == ScheduleKind.ONE_F_ONE_B
                             else gpipe(i, m)) for i in range(2)}
    pipe = Pipeline(microbatches=m, stages=("s0", "s1"), schedule_kind=kind, schedule=schedule)
    bare, turning = _turning_chain(4 * m, None, fixed), _turning_chain(4 * m, TURN_MS, fixed)
    base = simulate(plan(bare, t, groups, pipeline=pipe), bare, t)
    result = simulate(plan(turning, t, groups, pipeline=pipe), turning, t)
    cm = CostModel(turning, t)
    saved = 0.0
    for d in range(2):
        ways = [part.lstrip("0123456789")[0] == "F" for part in schedule[devices[d]].split()]
        straight = [a for a, b in zip(ways[1:], ways) if a == b]  # True: a forward
        assert len(straight) == (2 * (m - 1) if kind == ScheduleKind.GPIPE
                                 else 2 * min(m - 1, 1 - d))  # 1F1B: stage 0 a forward ahead
        ops = groups[d].ops
        every = [cm.fixed_ms([o], devices[d]) for o in ("op0", "op1", "op2", "op3")]
        mine = cm.fixed_ms(ops, devices[d])
        if fixed is not None:  # (None: the cost model's own, a launch per op)
            assert mine == pytest.approx((sum(fixed[2 * d:2 * d + 2]),
                                          2 * sum(fixed[2 * d:2 * d + 2])))
        turn = TURN_MS * sum(mine) / sum(map(sum, every))
        expected = sum(min(turn, mine[0] if f else mine[1]) for f in straight)
        assert _compute_busy(base, d) - _compute_busy(result, d) == pytest.approx(expected)
        saved += expected
    if m == 1 or not saved:
        assert result.iteration_ms == pytest.approx(base.iteration_ms)
    else:
        assert result.iteration_ms < base.iteration_ms


def test_a_turn_less_comes_off_an_actions_tasks_in_order_and_none_below_zero():
    """An action of several units: what its first task cannot give comes off the next."""
    from types import SimpleNamespace

    from dl_nfv.simulator.lower import _Lowering

    lowering = SimpleNamespace(tg=SimpleNamespace(duration_ms=[0.1, 0.5, 1.0, 2.0]))
    _Lowering._take_off(lowering, [0, 1, 2], 0.4)
    assert lowering.tg.duration_ms == pytest.approx([0.0, 0.2, 1.0, 2.0])
    _Lowering._take_off(lowering, [1, 2], 5.0)
    assert lowering.tg.duration_ms == pytest.approx([0.0, 0.0, 0.0, 2.0])


def test_a_negative_turn_is_refused_and_other_devices_pay_none():
    with pytest.raises(ValueError, match="turn_ms must be >= 0, got -0.1"):
        ProfileInfo(device_type="cpu", turn_ms=-0.1)
    g = _turning_chain(8, TURN_MS)
    assert CostModel(g, mesh(1)).turn_ms(mesh(1).device_names[0], ["op0"]) == 0.0  # a GPU
    cpu = mesh(1, device_type="cpu")
    assert CostModel(g, cpu).turn_ms(cpu.device_names[0], ["op0"]) == pytest.approx(TURN_MS / 4)


COLD = (0.5, 0.2)


@pytest.mark.parametrize("m", [1, 4])
def test_each_devices_first_forward_and_backward_of_a_step_pay_for_what_it_left_cold(m):
    """Data parallelism: each replica runs every op, and pays the whole ``cold_fwd_ms`` and
    ``cold_bwd_ms`` once a step; a pipeline stage its ops' share, once a step whatever the
    microbatches; a GPU nothing."""
    t = mesh(2, device_type="cpu")
    devices = t.device_names
    bare = _turning_chain(8, None, (0.1, 0.3, 0.2, 0.4))
    cold = dataclasses.replace(bare, profile=dataclasses.replace(
        bare.profile, cold_fwd_ms=COLD[0], cold_bwd_ms=COLD[1]))
    dp = [one_group(bare, devices, sync=SyncMethod.ALLREDUCE)]
    base, charged = (simulate(plan(g, t, dp), g, t) for g in (bare, cold))
    for d in range(2):
        assert _compute_busy(charged, d) - _compute_busy(base, d) == pytest.approx(sum(COLD))
    groups = [Group(id="s0", ops=("op0", "op1"), devices=(devices[0],), sync=SyncMethod.NONE),
              Group(id="s1", ops=("op2", "op3"), devices=(devices[1],), sync=SyncMethod.NONE)]
    pipe = Pipeline(microbatches=m, stages=("s0", "s1"), schedule_kind=ScheduleKind.ONE_F_ONE_B,
                    schedule={devices[i]: one_f_one_b(2, m, i) for i in range(2)})
    base, charged = (simulate(plan(g, t, groups, pipeline=pipe), g, t) for g in (bare, cold))
    for d, share in ((0, 0.4), (1, 0.6)):  # by the fixed parts 0.1 + 0.3 and 0.2 + 0.4
        assert _compute_busy(charged, d) - _compute_busy(base, d) == pytest.approx(
            sum(COLD) * share)
    assert CostModel(cold, mesh(1)).cold_ms(mesh(1).device_names[0], ["op0"]) == (0.0, 0.0)
    with pytest.raises(ValueError, match="cold_fwd_ms must be >= 0, got -1"):
        ProfileInfo(device_type="cpu", cold_fwd_ms=-1)
