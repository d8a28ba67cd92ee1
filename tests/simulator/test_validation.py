"""Simulated iterations against closed forms: ring AllReduce, pipeline bubbles, one device, PS."""

from __future__ import annotations

import dataclasses

import pytest

from dl_nfv.artifacts import (
    Collective,
    Fusion,
    Group,
    Op,
    OpKind,
    Optimizer,
    Pipeline,
    ScheduleKind,
    SyncMethod,
)
from dl_nfv.artifacts.devices import CATALOG
from dl_nfv.simulator import CostModel, simulate
from dl_nfv.simulator.synthetic import gpipe, one_f_one_b
from dl_nfv.simulator.tasks import TaskKind

from .helpers import GPU, chain, graph, mesh, one_group, op, plan, star

LAUNCH_MS = CATALOG[GPU].launch_overhead_us / 1e3


def spans(result, kind):
    tg, s = result.tasks, result.schedule
    return [(s.start_ms[t], s.end_ms[t]) for t, k in enumerate(tg.kind) if k == kind]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_allreduce_in_a_data_parallel_iteration(n):
    # one op with a 64 MB gradient over n devices of a 100 Gbps, 2 us mesh
    nbytes, bw, alpha_us = 64 * 2**20, 100.0, 2.0
    g = chain(1, 1.0, 1.0, param_bytes=nbytes, batch_size=8 * n)
    t = mesh(n, bandwidth_gbps=bw, latency_us=alpha_us)
    p = plan(g, t, [one_group(g, t.device_names, collective=Collective.RING)])
    result = simulate(p, g, t)
    (start, end), = spans(result, TaskKind.ALLREDUCE)
    closed = 2 * (n - 1) / n * nbytes / (bw * 1e9 / 8) * 1e3 + 2 * (n - 1) * alpha_us / 1e3
    assert end - start == pytest.approx(closed, rel=0.01)
    # the collective waits for every replica's backward (which adds the gradient into its
    # bucket), the updates (which also zero the bucket) wait for it
    cm = CostModel(g, t)
    d0 = t.device_names[0]
    fwd = LAUNCH_MS + (1.0 - LAUNCH_MS) / n
    add = nbytes * cm.accumulate_ms_per_byte(d0)
    assert start == pytest.approx(2 * fwd + add)
    update = cm.update_ms(nbytes, d0) + cm.upkeep_ms(nbytes, d0, 0)
    assert result.iteration_ms == pytest.approx(2 * fwd + add + closed + update, rel=0.01)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p_stages,m", [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_pipeline_bubble_fraction(schedule, p_stages, m):
    # p equal stages (one op each, forward 2 ms and backward 4 ms per full batch), free transfers
    g = chain(p_stages, 2.0, 4.0, param_bytes=4, edge_bytes=0, batch_size=m)
    t = mesh(p_stages)
    devices = t.device_names
    groups = [Group(id=f"s{i}", ops=(f"op{i}",), devices=(devices[i],), sync=SyncMethod.NONE)
              for i in range(p_stages)]
    make = (lambda s: gpipe(s, m)) if schedule == "gpipe" else \
        (lambda s: one_f_one_b(p_stages, m, s))
    pipe = Pipeline(microbatches=m, stages=tuple(gr.id for gr in groups),
                    schedule_kind=ScheduleKind.GPIPE if schedule == "gpipe" else
                    ScheduleKind.ONE_F_ONE_B,
                    schedule={devices[i]: make(i) for i in range(p_stages)})
    result = simulate(plan(g, t, groups, pipeline=pipe), g, t)
    tg, s = result.tasks, result.schedule
    fb = [t_ for t_, k in enumerate(tg.kind) if k in (TaskKind.FORWARD, TaskKind.BACKWARD)]
    span = max(s.end_ms[t_] for t_ in fb)
    for d in range(p_stages):
        busy = sum(tg.duration_ms[t_] for t_ in fb if tg.device[t_] == d)
        bubble = 1 - busy / span
        assert bubble == pytest.approx((p_stages - 1) / (m + p_stages - 1), rel=0.01)


def test_single_device_is_the_sum_of_its_op_times():
    g = graph([op("x", 0.5, 0.7), op("a", 1.0, 2.0, param_bytes=4000), op("b", 1.5, 2.5),
               op("c", 0.25, 0.5, param_bytes=1000)],
              [("x", "a", 100), ("a", "b", 100), ("b", "c", 100), ("x", "c", 100)])
    t = mesh(1)
    device = t.device_names[0]
    p = plan(g, t, [one_group(g, [device])], optimizer=Optimizer.ADAM)
    result = simulate(p, g, t)
    cm = CostModel(g, t)
    # x has no parameters and nothing before it: no gradient, no backward
    expected = (0.5 + 1.0 + 1.5 + 0.25) + (2.0 + 2.5 + 0.5) + cm.update_ms(5000, device, Optimizer.ADAM) + cm.upkeep_ms(5000, device)
    assert result.iteration_ms == pytest.approx(expected, rel=1e-9)
    assert result.busy_ms[device] == pytest.approx(expected, rel=1e-9)
    assert result.feasible and not result.overflows


def test_ps_iteration_is_bounded_by_the_server_nic():
    workers, nic_gbps, nbytes = 4, 10.0, 50e6
    g = chain(1, 1.0, 1.0, param_bytes=int(nbytes), batch_size=8)
    t = star(workers + 1, nic_gbps=nic_gbps)
    names = t.device_names
    p = plan(g, t, [one_group(g, names[:workers], sync=SyncMethod.PS, ps_servers=(names[-1],))])
    result = simulate(p, g, t)
    nic_ms = workers * nbytes / (nic_gbps * 1e9 / 8) * 1e3  # every gradient in, every model out
    assert result.iteration_ms >= 2 * nic_ms
    (push_start, push_end), = spans(result, TaskKind.PS_PUSH)
    (pull_start, pull_end), = spans(result, TaskKind.PS_PULL)
    assert push_end - push_start == pytest.approx(nic_ms, rel=0.01)
    assert pull_end - pull_start == pytest.approx(nic_ms, rel=0.01)
    # the server updates between push and pull; the workers hold no optimizer state
    server_update, = [t_ for t_, k in enumerate(result.tasks.kind)
                      if k == TaskKind.UPDATE and result.tasks.device[t_] == workers]
    assert push_end <= result.schedule.start_ms[server_update] < pull_start + 1e-12


def test_buckets_overlap_communication_with_the_remaining_backward():
    # 4 ops with 4 MiB each (AllReduce ~1 ms, like each backward); a bucket per op lets the
    # AllReduce of op3 run beside the backward of op2, and so on: 3 of 4 hidden
    g = chain(4, 1.0, 4.0, param_bytes=4 * 2**20, edge_bytes=1000, batch_size=8)
    t = mesh(4, bandwidth_gbps=50.0)
    devices = t.device_names
    plain = simulate(plan(g, t, [one_group(g, devices)]), g, t)
    buckets = Fusion(gradient_buckets=tuple((f"op{i}",) for i in reversed(range(4))))
    bucketed = simulate(plan(g, t, [one_group(g, devices)], fusion=buckets), g, t)
    assert bucketed.iteration_ms < plain.iteration_ms
    assert bucketed.comm_hidden_fraction == pytest.approx(0.75, abs=0.05)
    assert plain.comm_hidden_fraction == 0.0
    first = min(s for s, _ in spans(bucketed, TaskKind.ALLREDUCE))
    last_backward = max(e for _, e in spans(bucketed, TaskKind.BACKWARD))
    assert first < last_backward


def test_cross_group_transfer_moves_overlapping_batch_shares():
    # group a on two devices (shares 0.75/0.25) feeds group b on two devices (0.5/0.5)
    g = graph([op("a", param_bytes=4, output_bytes=800), op("b", param_bytes=4)],
              [("a", "b", 800)])
    t = mesh(4)
    d = t.device_names
    p = plan(g, t, [Group(id="A", ops=("a",), devices=(d[0], d[1]), batch_shares=(0.75, 0.25)),
                    Group(id="B", ops=("b",), devices=(d[2], d[3]))])
    result = simulate(p, g, t)
    tg = result.tasks
    moved = sorted((tg.device_names[tg.info[k][4]], tg.device_names[tg.info[k][5]], tg.nbytes[k])
                   for k, kind in enumerate(tg.kind)
                   if kind == TaskKind.TRANSFER and tg.info[k][1] == "F")
    # [0, .75) x [0, .5) = .5; [0, .75) x [.5, 1) = .25; [.75, 1) x [.5, 1) = .25
    assert moved == [(d[0], d[2], 400.0), (d[0], d[3], 200.0), (d[1], d[3], 200.0)]
    grads = [k for k, kind in enumerate(tg.kind) if kind == TaskKind.TRANSFER and tg.info[k][1] == "B"]
    assert len(grads) == 3


def test_memory_counts_static_state_and_live_activations():
    act = 10 * 2**20
    g = chain(3, 1.0, 1.0, param_bytes=2**20, edge_bytes=act, batch_size=8)
    t = mesh(1)
    device = t.device_names[0]
    result = simulate(plan(g, t, [one_group(g, [device])], optimizer=Optimizer.ADAM), g, t)
    # params + grads + 2 Adam states, and all three outputs alive at the start of the backward
    assert result.peak_memory_bytes[device] == 3 * 2**20 * (2 + 2) + 3 * act


def test_overflow_names_device_time_and_shortfall():
    big = 20 * 2**30  # 20 GiB of activations on a 16 GiB device
    g = chain(2, 1.0, 1.0, param_bytes=4, edge_bytes=big // 2, batch_size=8)
    t = mesh(1)
    device = t.device_names[0]
    result = simulate(plan(g, t, [one_group(g, [device])]), g, t)
    assert not result.feasible
    (name, time_ms, shortfall), = result.overflows
    assert name == device
    assert time_ms == pytest.approx(1.0)  # when op1's forward starts, both outputs are alive
    assert shortfall == result.peak_memory_bytes[device] - CATALOG[GPU].memory_bytes


def test_sfb_compression_replaces_the_allreduce_of_a_wide_layer():
    # a 4096 x 4096 layer on 4 rows per replica: factors are tiny next to the 64 MB gradient
    rows, width = 16, 4096
    g = graph([op("x", output_bytes=rows * width * 4),
               op("fc", 1.0, 2.0, param_bytes=width * width * 4, output_bytes=rows * width * 4,
                  kind=OpKind.MATMUL)], [("x", "fc", rows * width * 4)], batch_size=rows)
    t = star(4, nic_gbps=10.0)
    devices = t.device_names
    plain = simulate(plan(g, t, [one_group(g, devices)]), g, t)
    sfb = simulate(plan(g, t, [one_group(g, devices, compression="sfb")]), g, t)
    kinds = set(sfb.tasks.kind)
    assert TaskKind.ALLGATHER in kinds and TaskKind.ALLREDUCE not in kinds
    assert TaskKind.RECOMPUTE in kinds
    assert sfb.iteration_ms < plain.iteration_ms


@pytest.mark.parametrize("device_type", ["cpu", GPU])
def test_collectives_hold_a_cpu_but_overlap_a_gpus_compute(device_type):
    # two layers with 8 MB gradients each, data parallel over 2 devices, one bucket per layer.
    # op1's AllReduce becomes ready when its backward ends, together with op0's backward.
    # A GPU runs op0's backward while the collective moves op1's gradient; on CPUs the
    # collective library copies and sums on the worker's cores, so they take turns.
    nbytes = 8 * 2**20
    ops = [op(f"op{i}", 1.0, 2.0, param_bytes=nbytes, device_type=device_type) for i in range(2)]
    g = graph(ops, [("op0", "op1", 0)], batch_size=8)
    t = mesh(2, bandwidth_gbps=10.0, device_type=device_type)
    fusion = Fusion(gradient_buckets=(("op1",), ("op0",)))
    p = plan(g, t, [one_group(g, t.device_names, collective=Collective.RING)], fusion=fusion)
    result = simulate(p, g, t)
    cm = CostModel(g, t)
    dev = t.device_names[0]
    f = cm.op_ms("op0", dev, "fwd", 0.5)
    b = cm.op_ms("op0", dev, "bwd", 0.5) + nbytes * cm.accumulate_ms_per_byte(dev)  # + into bucket
    ar = cm.allreduce_ms(t.device_names, nbytes, Collective.RING)
    update = cm.update_ms(2 * nbytes, dev) + cm.upkeep_ms(2 * nbytes, dev, 0)
    assert ar > b  # the first collective outlasts the backward it could hide behind
    if device_type == "cpu":
        closed = 2 * f + b + ar + b + ar + update
    else:
        closed = 2 * f + b + max(ar, b) + ar + update
    assert result.iteration_ms == pytest.approx(closed, rel=1e-6)


@pytest.mark.parametrize("tie_sum_ms", [None, 1.5])
def test_a_tied_weight_is_held_summed_and_updated_on_every_device_that_uses_it(tie_sum_ms):
    # emb owns an 8 MB weight on device 0; head (device 1) uses it too (tied). Device 1
    # holds a copy: the two gradients are summed by an AllReduce once both backwards are
    # done, and each device updates its copy.
    nbytes = 8 * 2**20
    emb = dataclasses.replace(op("emb", 1.0, 2.0, param_bytes=nbytes), params=("w",),
                              tie_sum_ms={GPU: tie_sum_ms} if tie_sum_ms else {})
    head = dataclasses.replace(op("head", 3.0, 4.0), shared_params={"w": nbytes})
    g = graph([emb, head], [("emb", "head", 0)])
    t = mesh(2, bandwidth_gbps=10.0)
    d0, d1 = t.device_names
    p = plan(g, t, [Group(id="a", ops=("emb",), devices=(d0,)),
                    Group(id="b", ops=("head",), devices=(d1,))])
    result = simulate(p, g, t)
    tg = result.tasks
    (ar,) = [k for k, kind in enumerate(tg.kind) if kind == TaskKind.ALLREDUCE]
    assert tg.nbytes[ar] == nbytes
    cm = CostModel(g, t)
    update = cm.update_ms(nbytes, d1) + cm.upkeep_ms(nbytes, d1, 0)
    # head's backward adds its gradient into its copy's bucket; emb's adds its own but no longer
    # sums head's into it in the graph (the AllReduce does): measured, or as three passes
    # over the weight, as many as adding it into the bucket
    add = nbytes * cm.accumulate_ms_per_byte(d1)
    emb_bwd = 2.0 + add - (tie_sum_ms or add)
    closed = 1.0 + 3.0 + 4.0 + add + emb_bwd + cm.allreduce_ms([d0, d1], nbytes) + update
    assert result.iteration_ms == pytest.approx(closed, rel=1e-6)
    assert tg.static_bytes[tg.device_names.index(d1)] == pytest.approx(nbytes * (2 + 1.0))


def _two_stages(f: float, b: float):
    """Two stages of one op each on two GPUs (forward ``f``, backward ``b``, half of whose
    FLOPs compute the input gradient), no transfer; a plan for any two device orders."""
    ops = [Op(id=f"op{i}", name=f"op{i}", param_bytes=4, bwd_flops=2e9, bwd_input_flops=1e9,
              fwd_ms={GPU: f}, bwd_ms={GPU: b}) for i in range(2)]
    g = graph(ops, [("op0", "op1", 0)], batch_size=4)
    t = mesh(2)
    d0, d1 = t.device_names
    groups = [Group(id=f"s{i}", ops=(f"op{i}",), devices=(d,), sync=SyncMethod.NONE)
              for i, d in enumerate((d0, d1))]

    def make(first: str, last: str, m: int = 1):
        pipe = Pipeline(microbatches=m, stages=("s0", "s1"), schedule={d0: first, d1: last})
        return plan(g, t, groups, pipeline=pipe)
    return g, t, make


def test_a_split_backward_lets_the_stage_before_start_after_the_input_gradients():
    # one microbatch: with the last stage running I then W, the first stage's backward starts
    # after the I (half the backward) rather than the whole backward
    f, b = 1.0, 4.0
    g, t, make = _two_stages(f, b)
    whole = simulate(make("0F0 0B0", "1F0 1B0"), g, t)
    split = simulate(make("0F0 0B0", "1F0 1I0 1W0"), g, t)
    cm = CostModel(g, t)
    add = 4 * cm.accumulate_ms_per_byte(t.device_names[1])  # adding the weight gradient: the W's
    assert whole.iteration_ms - split.iteration_ms == pytest.approx(b / 2 + add, rel=1e-9)
    tg, s = split.tasks, split.schedule
    backward = {tg.describe(k): (s.start_ms[k], s.end_ms[k])
                for k, kind in enumerate(tg.kind) if kind == TaskKind.BACKWARD}
    assert backward["backward op1"] == pytest.approx((2 * f, 2 * f + b / 2))
    assert backward["weight gradients op1"] == pytest.approx((2 * f + b / 2, 2 * f + b + add))
    assert backward["backward op0"][0] == pytest.approx(2 * f + b / 2)


def test_validate_plan_follows_split_backwards_and_finds_their_deadlocks():
    from dl_nfv.artifacts import InvalidArtifact
    from dl_nfv.planners.validate import validate_plan

    g, t, make = _two_stages(1.0, 4.0)
    validate_plan(make("0F0 0F1 0B0 0B1", "1F0 1I0 1F1 1I1 1W0 1W1", 2), g, t)
    # stage 0 runs F1 after B0, which waits for stage 1's I0, which comes after I1 (needs F1)
    with pytest.raises(InvalidArtifact, match="deadlocks"):
        validate_plan(make("0F0 0B0 0F1 0B1", "1F0 1F1 1I1 1I0 1W0 1W1", 2), g, t)
    with pytest.raises(ValueError, match="lacks action 1W1"):
        make("0F0 0F1 0B0 0B1", "1F0 1I0 1F1 1I1 1W0", 2)
