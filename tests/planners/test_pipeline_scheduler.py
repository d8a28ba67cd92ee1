"""The pipeline scheduler: closed forms, memory caps, and agreement with the shared simulator;
the stage-balanced bound never above a simulated plan."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import Fusion, Plan, TieSync, fingerprint, from_data
from dl_nfv.artifacts.topology import Topology
from dl_nfv.planners import run
from dl_nfv.planners.bounds.classes import slowest_backward
from dl_nfv.planners.bounds.stage_balanced import inputs as bound_inputs
from dl_nfv.planners.pipeline.build import (
    all_replicas,
    groups_and_pipeline,
    stage_buckets,
    stage_costs,
)
from dl_nfv.planners.pipeline.partition import Layout, StageSpec
from dl_nfv.planners.pipeline.problem import Problem
from dl_nfv.planners.pipeline.scheduler import (
    Policy,
    StageCosts,
    auto_schedule,
    flush_estimate_ms,
    round_trip_caps,
)
from dl_nfv.planners.pipeline.scheduler import run as schedule_run
from dl_nfv.simulator import simulate
from tests.planners.test_pipeline import GIB, V100, chain, hosts, nvlink


def costs(f, b, *, send=0.0, sync=None, caps=None, m=8):
    S = len(f)
    return StageCosts(f_ms=tuple(f), b_ms=tuple(b), send_ms={(s, s + 1): send for s in range(S - 1)},
                      sync_ms=tuple(sync or [0.0] * S), caps=tuple(caps or [m] * S), microbatches=m)


@pytest.mark.parametrize("policy", [Policy.GPIPE, Policy.ONE_F_ONE_B, Policy.LIST])
@pytest.mark.parametrize("stages,m", [(1, 1), (2, 4), (4, 8), (4, 2)])
def test_equal_stages_closed_form(policy, stages, m):
    """p equal stages, m microbatches, free links: (m + p - 1)(f + b) (GPipe and 1F1B alike)."""
    c = costs([1.0] * stages, [2.0] * stages, m=m, sync=[0.5] * stages)
    timed = schedule_run(c, policy)
    assert timed.makespan_ms == pytest.approx((m + stages - 1) * 3.0 + 0.5)
    assert timed.schedule.deadlock_free()


def test_list_scheduler_hides_slow_links_where_1f1b_stalls():
    """Transfers as long as a stage: 1F1B's stages - s microbatches in flight cannot cover the
    round trip, the list scheduler's round-trip caps can (and stay below GPipe's m)."""
    c = costs([1.0] * 4, [2.0] * 4, send=3.0, m=16)
    one = schedule_run(c, Policy.ONE_F_ONE_B).makespan_ms
    caps = round_trip_caps(c)
    listed = schedule_run(c, Policy.LIST, caps=caps)
    assert listed.makespan_ms < one
    assert caps[0] > 4 and max(caps) < 16
    assert all(k <= cap for k, cap in zip(listed.schedule.max_in_flight(), caps))
    # the bottleneck (every stage: 3 ms per microbatch) runs back to back after the fill
    fill = 3 * 1.0 + 3 * 3.0
    assert listed.makespan_ms <= fill + 16 * 3.0 + 3 * (2.0 + 3.0) + 1e-9


def test_memory_caps_are_kept():
    c = costs([1.0] * 3, [2.0] * 3, caps=[2, 2, 1], m=8)
    best = auto_schedule(c)
    assert all(k <= cap for k, cap in zip(best.schedule.max_in_flight(), [2, 2, 1]))
    with pytest.raises(ValueError, match="no schedule fits"):
        auto_schedule(c, allowed=(Policy.GPIPE,))


def test_scheduler_estimate_matches_the_simulator():
    graph = chain(8, param_bytes=GIB)
    topo = nvlink(4)
    plan = run("pipeline", graph, topo, microbatches=8, max_stages=4)
    sim = simulate(plan, graph, topo, check_fingerprints=False).iteration_ms
    best_own = next(n for n in plan.notes if n.startswith("searched"))
    estimate = float(best_own.rsplit("best own layout ", 1)[1].split(" ms")[0])
    assert sim == pytest.approx(estimate, rel=0.02)


def test_transfers_sharing_a_link_queue_on_it():
    """Stage 1's inbound link carries the activations from stage 0 and the gradients from
    stage 2: per microbatch two transfers of 5 ms, so m microbatches keep it busy 2 m 5 ms;
    on links of their own the two directions overlap."""
    m, send = 8, 5.0
    base = costs([0.1] * 3, [0.1] * 3, send=send, m=m)
    shared = replace(base, links={(0, 1, "F"): frozenset({"sw->h1"}),
                                  (1, 2, "B"): frozenset({"sw->h1"}),
                                  (1, 2, "F"): frozenset({"sw->h2"}),
                                  (0, 1, "B"): frozenset({"sw->h0"})})
    assert shared.channels(0, 1, "F") == ("sw->h1",)
    assert base.channels(0, 1, "F") == ((0, 1, "F"),)
    for policy in (Policy.ONE_F_ONE_B, Policy.LIST):
        alone = schedule_run(base, policy).makespan_ms
        queued = schedule_run(shared, policy).makespan_ms
        assert queued >= 2 * m * send
        assert alone < 2 * m * send - 10
    # the screening estimate counts the shared link's load too
    assert flush_estimate_ms(shared) >= 2 * m * send > flush_estimate_ms(base) - (m - 1) * send


@pytest.mark.parametrize("policy,split", [(Policy.GPIPE, False), (Policy.ONE_F_ONE_B, False),
                                          (Policy.LIST, False), (Policy.LIST, True)])
def test_scheduler_matches_the_simulator_when_stages_share_nics(policy, split):
    """One GPU per host behind a 25 Gbps switch, activations large enough that links bind:
    the middle stage's NIC carries activations in and gradients back, and the scheduler
    queues them as the simulator's links do (with a channel per stage pair instead, it put
    the list schedule at 146 ms against 250 ms simulated). With ``split``, the layers'
    input gradients are 40% of their backwards and the later stages split theirs."""
    graph = chain(6, out_bytes=256 * 2**20, param_bytes=GIB // 64)
    if split:
        graph = replace(graph, ops=tuple(replace(op, bwd_flops=5e9, bwd_input_flops=2e9)
                                         for op in graph.ops))
    topo = _topology([V100] * 3)
    problem = Problem(graph, topo)
    layout = Layout(tuple(StageSpec(2 * i, 2 * i + 2, (f"h{i}/gpu0",)) for i in range(3)), 8)
    reps = all_replicas(problem, layout)
    timed = schedule_run(stage_costs(problem, layout, reps), policy, backward_first=split,
                         split=split)
    assert timed.label.startswith("list-zb") == split
    groups, pipeline = groups_and_pipeline(problem, layout, reps, timed.schedule)
    plan = Plan(planner="pipeline", graph_sha256=fingerprint(graph),
                topology_sha256=fingerprint(topo),
                batch_size=graph.model.batch_size, groups=tuple(groups),
                pipeline=pipeline, fusion=stage_buckets(problem, layout, reps))
    sim = simulate(plan, graph, topo, check_fingerprints=False).iteration_ms
    assert sim == pytest.approx(timed.makespan_ms, rel=1e-6)


def test_a_first_stage_of_few_parameters_takes_small_buckets():
    """A first stage of four 1 MiB layers replicated across a 10 Gbps switch: in one 25 MiB
    bucket its AllReduce (3.4 ms) waits for the end of the last backward; in DDP's 1 MiB
    buckets, one per layer, three of the four run while the backward still does, so only
    the last layer's (0.9 ms) and what queues before it is left. The stage takes the small
    buckets, the scheduler charges what they leave as the simulator does, and the plan
    simulates over a millisecond faster than with one bucket."""
    graph = chain(8, fwd_ms=2.0, bwd_ms=4.0, param_bytes=2**20, out_bytes=2**16)
    topo = hosts(3, 1, nic_gbps=10)
    problem = Problem(graph, topo)
    layout = Layout((StageSpec(0, 4, ("h0/gpu0", "h1/gpu0")), StageSpec(4, 8, ("h2/gpu0",))), 4)
    reps = all_replicas(problem, layout)
    timed = schedule_run(stage_costs(problem, layout, reps), Policy.GPIPE)
    fusion = stage_buckets(problem, layout, reps)
    assert fusion.gradient_buckets == (("l3",), ("l2",), ("l1",), ("l0",))
    groups, pipeline = groups_and_pipeline(problem, layout, reps, timed.schedule)

    def simulated(buckets) -> float:
        plan = Plan(planner="pipeline", graph_sha256=fingerprint(graph),
                    topology_sha256=fingerprint(topo), batch_size=graph.model.batch_size,
                    groups=tuple(groups), pipeline=pipeline, fusion=buckets)
        return simulate(plan, graph, topo, check_fingerprints=False).iteration_ms

    small = simulated(fusion)
    assert small == pytest.approx(timed.makespan_ms, rel=1e-3)
    assert small < simulated(Fusion(gradient_buckets=(("l3", "l2", "l1", "l0"),))) - 1.0


def _topology(types):
    return from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": "t",
        "hosts": [{"name": f"h{i}", "devices": [{"type": t}],
                   "nics": [{"switch": "sw", "bandwidth_gbps": 25, "latency_us": 5}]}
                  for i, t in enumerate(types)],
        "switches": [{"name": "sw"}]})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(2, 6), types=st.lists(st.sampled_from([V100, "P100"]), min_size=2, max_size=4),
       gib=st.sampled_from([0.05, 1.0, 2.0]), batch=st.sampled_from([4, 8, 12]),
       slow=st.floats(1.0, 3.0))
# mixed devices: the microbatch count of the best plan (4) must not be skipped before its
# class bound is computed (the least cheap bound, of 2 microbatches, refined above the plan)
@example(layers=3, types=[V100, "P100"], gib=0.05, batch=4, slow=1.125)
def test_bound_never_above_a_simulated_plan(layers, types, gib, batch, slow):
    _assert_bound_holds(chain(layers, param_bytes=int(gib * GIB), batch=batch,
                              slower={"P100": slow}), _topology(types))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(2, 6), types=st.lists(st.sampled_from([V100, "P100"]), min_size=2, max_size=4),
       gib=st.sampled_from([0.05, 1.0]), batch=st.sampled_from([4, 8]), slow=st.floats(1.0, 3.0),
       share=st.sampled_from([0.2, 0.5, 0.8]))
def test_bound_holds_for_plans_that_split_their_backwards(layers, types, gib, batch, slow, share):
    # with input-gradient FLOPs profiled, plans may run a stage's weight gradients after its
    # gradients went back: the bound's chain, around and chain-offset busy terms take the
    # input gradients alone (the first stage's whole backward)
    graph = chain(layers, param_bytes=int(gib * GIB), batch=batch, slower={"P100": slow})
    graph = replace(graph, ops=tuple(replace(op, bwd_flops=2e9, bwd_input_flops=2e9 * share)
                                     for op in graph.ops))
    _assert_bound_holds(graph, _topology(types))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), layers=st.integers(2, 6),
       types=st.lists(st.sampled_from([V100, "P100"]), min_size=2, max_size=4),
       gib=st.sampled_from([0.05, 1.0, 3.0]), batch=st.sampled_from([4, 8]))
def test_bound_holds_where_a_type_is_slower_on_some_layers_than_on_others(data, layers, types,
                                                                           gib, batch):
    # the class DP takes each class's own time of a range of ops, not its best speed over all
    # ops: here the P100 is 1-3x slower layer by layer, forwards and backwards apart
    graph = chain(layers, param_bytes=int(gib * GIB), batch=batch)
    slow = st.floats(1.0, 3.0)
    ops = tuple(replace(op, fwd_ms={**op.fwd_ms, "P100": op.fwd_ms[V100] * data.draw(slow)},
                        bwd_ms={**op.bwd_ms, "P100": op.bwd_ms[V100] * data.draw(slow)})
                for op in graph.ops)
    _assert_bound_holds(replace(graph, ops=ops), _topology(types))


def test_class_bound_drains_the_chain_at_the_slow_type_s_own_backward():
    """Five 1 GiB layers on a V100 and two P100s over 25 Gbps, batch 4; the P100 as fast
    forwards, 2x slower backwards on the first three layers and 3x on the last two. The
    plan runs layer 0 on a P100, layers 1-3 on the V100 and layer 4 on the other P100, four
    microbatches. The class DP's chain through the first stage takes its backward at the
    P100's time (10 ms a sample), but the drain taken off it before the V100 stage's busy
    term was the V100's (5 ms): the bound was 5 ms too high for that layout and above the
    simulated plan (found by hypothesis). The drain takes each region's slowest class."""
    graph = chain(5, param_bytes=GIB, batch=4)
    slower = (2.0, 2.0, 2.0, 3.0, 3.0)
    ops = tuple(replace(op, fwd_ms={**op.fwd_ms, "P100": op.fwd_ms[V100]},
                        bwd_ms={**op.bwd_ms, "P100": op.bwd_ms[V100] * k})
                for op, k in zip(graph.ops, slower))
    graph, topo = replace(graph, ops=ops), _topology([V100, "P100", "P100"])
    problem = Problem(graph, topo)
    x = bound_inputs(problem, list(problem.devices), problem.tie_sync)
    # the regions before each cut, each at the P100's backward (the slowest class)
    most = np.cumsum([0.0] + [op.bwd_ms["P100"] for op in ops])
    assert slowest_backward(x) == pytest.approx(most, abs=0.01 * len(ops))
    plan = run("pipeline", graph, topo)
    assert plan.bound_ms <= plan.prediction.iteration_ms * (1 + 1e-9)
    _assert_bound_holds(graph, topo)


def test_bound_takes_the_slow_type_s_own_time_of_its_layers():
    """An embedding a P100 runs as fast as a V100, then two 3 GiB layers it runs 3x slower.
    The two layers do not fit one 16 GiB device (with gradients and momentum), so the P100
    runs one: 90 ms of compute, adding one microbatch's gradients into their buckets, zeroing
    them and its update (five passes over the parameters, as torch's fused SGD with
    momentum runs it), at least 134 ms. Taking the P100 at its best speed (the embedding's,
    a V100's) the bound was 114.1 ms, under the update's pass count then; the plan
    simulates at 171.9."""
    graph = chain(3, param_bytes=3 * GIB, batch=4, slower={"P100": 3.0})
    embedding = replace(graph.ops[0], param_bytes=2**20, fwd_ms={V100: 5.0, "P100": 5.0},
                        bwd_ms={V100: 10.0, "P100": 10.0})
    graph = replace(graph, ops=(embedding, *graph.ops[1:]))
    topo = _topology([V100, "P100"])
    plan = run("pipeline", graph, topo)
    cm, p100 = Problem(graph, topo).cm, "h1/gpu0"
    floor_ms = 90.0 + 3 * GIB * (cm.accumulate_ms_per_byte(p100) + cm.upkeep_ms_per_byte(p100, 0)
                                 + cm.update_ms_per_byte(p100))
    assert floor_ms == pytest.approx(134.0, abs=0.1)
    assert floor_ms <= plan.bound_ms <= plan.prediction.iteration_ms


def test_bound_counts_every_sample_s_way_through_replicated_stages():
    """Four layers on two hosts of four V100s over 25 Gbps, batch 16. The chain through a
    replicated stage was its smallest share's (one sample on one replica, the rest on the
    others); but every sample passes every stage, and averaged over the samples a stage
    holds each for its replica's whole share, at least the balanced share's time: the
    bound counted only that way (the same DP with each stage on its fastest holders at
    their fractional balance) rose from 32.5 to 36.9 ms, under the update's pass count
    then (36.6 with the fused step's five); the plan simulates at 43.7."""
    graph = chain(4, param_bytes=GIB // 4, batch=16)
    plan = run("pipeline", graph, hosts(2, 4, 25))
    assert 36.5 <= plan.bound_ms <= plan.prediction.iteration_ms


def test_class_bound_counts_every_sample_s_way_through_replicated_stages():
    """Six layers on three hosts of two GPUs over 50 Gbps (V100s; P100s 1.2x slower on the
    first layer and 1.6x on the next four; a light last layer of 0.1 GiB), batch 16. On mixed
    clusters the class DP also runs along the samples' average way, each stage's replicas
    at their fractional balance with each class at its own time of the range: the bound rose
    from 36.5 to 39.1 ms; the plan simulates at 44.9."""
    graph = chain(6, param_bytes=10 * 2**20, batch=16, slower={"P100": 1.6})
    first = replace(graph.ops[0], fwd_ms={V100: 10.0, "P100": 12.0},
                    bwd_ms={V100: 20.0, "P100": 24.0})
    head = replace(graph.ops[-1], param_bytes=GIB // 10, fwd_ms={V100: 1.0, "P100": 1.2},
                   bwd_ms={V100: 2.0, "P100": 2.4})
    graph = replace(graph, ops=(first, *graph.ops[1:-1], head))
    plan = run("pipeline", graph, hosts(3, 2, 50, (V100, "P100", "P100")))
    assert 39.0 <= plan.bound_ms <= plan.prediction.iteration_ms


def test_round_trip_term_counts_the_ws_after_the_first_i():
    """Six layers on six V100s over 25 Gbps, one sample, input gradients 30% of each backward:
    a stage's W's cannot start before its first I, which waits for the round trip, so the
    round-trip term counted from the forward chain takes the whole backward and the update
    (the bound was 115.7 ms with the I's alone there; the plan, six single-layer stages,
    simulates at 124.2)."""
    graph = chain(6, param_bytes=int(0.05 * GIB), batch=1)
    graph = replace(graph, ops=tuple(replace(op, bwd_flops=2e9, bwd_input_flops=0.6e9)
                                     for op in graph.ops))
    plan = run("pipeline", graph, _topology([V100] * 6))
    assert 118.0 <= plan.bound_ms <= plan.prediction.iteration_ms


def _assert_bound_holds(graph, topo):
    """Each pipeline-family planner's bound (dp's: the pipeline planner's) is at most the
    simulated time of its plan."""
    for planner in ("pipeline", "gpipe", "1f1b", "pipedream", "dp"):
        try:
            plan = run(planner, graph, topo)
        except Exception as exc:  # infeasible for this planner: nothing to compare
            assert "GiB" in str(exc) or "stages" in str(exc)
            continue
        bound = run("pipeline", graph, topo).bound_ms if planner == "dp" else plan.bound_ms
        assert bound <= plan.prediction.iteration_ms * (1 + 1e-9), planner


def _tied(graph, nbytes: int):
    """``graph`` with its last op using the first op's weight (an embedding and its head)."""
    import dataclasses

    first = dataclasses.replace(graph.ops[0], params=("layers.0.weight",))
    head = dataclasses.replace(graph.ops[-1], shared_params={"layers.0.weight": nbytes})
    return dataclasses.replace(graph, ops=(first, *graph.ops[1:-1], head))


def test_a_split_tie_adds_its_allreduce_floor_to_the_bound():
    """Four layers that fit one per device, so every plan splits the tie between the first
    and the last: its 1 GiB gradient must be summed over two devices behind 25 Gbps NICs
    after the first layer's last backward, at least 1 GiB x 8 / 25 Gbps = 344 ms."""
    graph = chain(4, param_bytes=4 * GIB)
    topo = _topology([V100] * 4)
    untied = run("pipeline", graph, topo)
    tied_graph = _tied(graph, GIB)
    tied = run("pipeline", tied_graph, topo)
    floor_ms = GIB * 8 / 25e9 * 1e3
    assert untied.bound_ms < floor_ms <= tied.bound_ms <= tied.prediction.iteration_ms
    assert tied.bound_ms >= untied.bound_ms


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(3, 6), types=st.lists(st.sampled_from([V100, "P100"]), min_size=2, max_size=4),
       gib=st.sampled_from([0.05, 1.0, 3.0]), tie=st.sampled_from([0.01, 0.3, 1.0]),
       batch=st.sampled_from([4, 8]), lookup=st.booleans())
def test_bound_with_tied_weights_never_above_a_simulated_plan(layers, types, gib, tie, batch,
                                                              lookup):
    # (with a lookup owner the pipeline planner's plans exchange the tie)
    graph = _tied(chain(layers, param_bytes=int(gib * GIB), batch=batch), int(tie * GIB))
    _assert_bound_holds(_looked_up(graph) if lookup else graph, _topology(types))


def test_the_pipeline_family_reports_one_bound_for_an_exchangeable_tie():
    """A looked-up embedding tied to the last layer: the pipeline planner's plans exchange it,
    the baselines' AllReduce it, and all report the family's bound (which takes the rows'
    floor), so their ratios to it compare like with like; it is at most every plan's time
    and below the bound of AllReduced ties alone."""
    from dl_nfv.planners.bounds.stage_balanced import stage_balanced_bound_ms
    from dl_nfv.planners.pipeline.problem import Problem

    graph = _looked_up(_tied(chain(4, param_bytes=4 * GIB), GIB))
    topo = _topology([V100] * 4)
    plans = {name: run(name, graph, topo) for name in ("pipeline", "gpipe", "1f1b", "pipedream")}
    bounds = {name: plan.bound_ms for name, plan in plans.items()}
    assert len(set(bounds.values())) == 1, bounds
    assert all(b <= plans[n].prediction.iteration_ms * (1 + 1e-9) for n, b in bounds.items())
    allreduced = stage_balanced_bound_ms(Problem(graph, topo))  # AllReduced ties only
    assert bounds["gpipe"] < allreduced


def test_a_tie_holds_back_every_holder_s_update():
    """Two stages holding a tied weight: its AllReduce starts when the later of their last
    backwards ends, and both update after it; the other stage's sync is not held back."""
    m = 4
    base = costs([1.0] * 3, [2.0] * 3, sync=[1.0, 5.0, 1.5], m=m)
    tied = replace(base, ties=(((0, 2), 10.0),))
    free = schedule_run(base, Policy.GPIPE)
    held = schedule_run(tied, Policy.GPIPE)
    # GPipe, equal stages: the last forward ends at m + 2, stage 0's last backward 4 m + 4 later
    last_b0 = (m + 2) * 3.0
    assert free.makespan_ms == pytest.approx(last_b0 - 2.0 + 5.0)  # stage 1: its sync
    assert held.makespan_ms == pytest.approx(last_b0 + 10.0 + 1.5)
    assert flush_estimate_ms(tied) == pytest.approx(flush_estimate_ms(base) - 5.0 + 11.5)


@pytest.mark.parametrize("nics,policy", [(True, Policy.GPIPE), (True, Policy.LIST),
                                         (False, Policy.GPIPE), (False, Policy.ONE_F_ONE_B),
                                         (False, Policy.LIST)])
def test_scheduler_matches_the_simulator_with_a_tie_across_stages(nics, policy):
    """An embedding tied to the head, one stage per GPU (behind 25 Gbps NICs, or on
    NVLink): the tie's AllReduce ends the iteration on both holders, in the scheduler as
    in the simulator. (1F1B behind NICs is left out: the scheduler hands a link to
    transfers in the order their senders start, the simulator in the order they become
    ready, and here that puts 1F1B 2% apart.)"""
    graph = _tied(chain(4, param_bytes=GIB // 4), GIB // 4)
    topo = _topology([V100] * 4) if nics else nvlink(4)
    problem = Problem(graph, topo)
    layout = Layout(tuple(StageSpec(i, i + 1, (d,)) for i, d in enumerate(problem.devices[:4])), 8)
    reps = all_replicas(problem, layout)
    c = stage_costs(problem, layout, reps)
    assert [stages for stages, _ in c.ties] == [(0, 3)]
    timed = schedule_run(c, policy)
    groups, pipeline = groups_and_pipeline(problem, layout, reps, timed.schedule)
    plan = Plan(planner="pipeline", graph_sha256=fingerprint(graph),
                topology_sha256=fingerprint(topo), batch_size=graph.model.batch_size,
                groups=tuple(groups), pipeline=pipeline,
                fusion=stage_buckets(problem, layout, reps))
    sim = simulate(plan, graph, topo, check_fingerprints=False).iteration_ms
    assert sim == pytest.approx(timed.makespan_ms, rel=1e-6)


def _looked_up(graph, ids_bytes: int = 4096):
    """``graph`` with its first op reading token ids from an input (a lookup)."""
    from dl_nfv.artifacts import Edge, Op, OpKind

    ids = Op(id="ids", name="ids", kind=OpKind.INPUT, output_bytes=ids_bytes)
    return replace(graph, ops=(ids, *graph.ops),
                   edges=(Edge(src="ids", dst=graph.ops[0].id, bytes=ids_bytes), *graph.edges))


def test_only_a_lookup_tie_between_two_single_devices_is_exchanged():
    """The rule the simulator, the planner and the runtime share (``exchangeable``)."""
    from dl_nfv.simulator.costs import exchangeable, lookup_rows

    lookups = lookup_rows(_looked_up(_tied(chain(4), GIB // 4)))
    assert set(lookups) == {"l0"} and lookup_rows(_tied(chain(4), GIB // 4)) == {}
    assert exchangeable(lookups, "l0", ["a"], [["b"]])
    assert exchangeable(lookups, "l0", ["a"], [["b"], ["b"]])  # two sharers on one device
    assert not exchangeable(lookups, "l1", ["a"], [["b"]])  # not a lookup
    assert not exchangeable(lookups, "l0", ["a", "c"], [["b"]])  # replicated owner
    assert not exchangeable(lookups, "l0", ["a"], [["b", "c"]])  # replicated sharer
    assert not exchangeable(lookups, "l0", ["a"], [["b"], ["c"]])  # three holders
    assert not exchangeable(lookups, "l0", ["a"], [["a"]])  # one holder: nothing to sum


@pytest.mark.parametrize("nics,policy", [(True, Policy.GPIPE), (True, Policy.LIST),
                                         (False, Policy.GPIPE), (False, Policy.ONE_F_ONE_B),
                                         (False, Policy.LIST)])
def test_scheduler_matches_the_simulator_with_a_tie_exchanged(nics, policy):
    """The embedding is a lookup, so the tie is summed by exchange: the head's 256 MiB
    dense gradient goes to stage 0 when stage 3's tasks are done, and the embedding's rows
    (one per output position: 4 MiB, plus the ids) come back after stage 0's. The
    scheduler times it as the simulator does, and the iteration is shorter than with the
    AllReduce."""
    graph = _looked_up(_tied(chain(4, param_bytes=GIB // 4), GIB // 4))
    topo = _topology([V100] * 4) if nics else nvlink(4)
    times = {}
    for sync in TieSync:
        problem = Problem(graph, topo, tie_sync=sync)
        assert problem.cm.tie_rows == {"l0": 4 * 2**20 + 4096}
        # the input rides with the first layer
        cuts = [0, 2, 3, 4, 5]
        layout = Layout(tuple(StageSpec(a, b, (d,)) for a, b, d in
                              zip(cuts, cuts[1:], problem.devices[:4])), 8)
        reps = all_replicas(problem, layout)
        c = stage_costs(problem, layout, reps)
        exchanged = sync is TieSync.EXCHANGE
        assert [(e[0], e[1]) for e in c.exchanges] == ([(0, 3)] if exchanged else [])
        assert [stages for stages, _ in c.ties] == ([] if exchanged else [(0, 3)])
        timed = schedule_run(c, policy)
        groups, pipeline = groups_and_pipeline(problem, layout, reps, timed.schedule)
        plan = Plan(planner="pipeline", graph_sha256=fingerprint(graph),
                    topology_sha256=fingerprint(topo), batch_size=graph.model.batch_size,
                    groups=tuple(groups), pipeline=pipeline,
                    fusion=stage_buckets(problem, layout, reps), tie_sync=sync)
        times[sync] = simulate(plan, graph, topo, check_fingerprints=False).iteration_ms
        if exchanged or not nics:
            assert times[sync] == pytest.approx(timed.makespan_ms, rel=1e-6)
    assert times[TieSync.EXCHANGE] < times[TieSync.ALLREDUCE]


def test_boundary_refinement_keeps_the_ops_and_never_loses():
    """Every neighbour moves one boundary by one unit and keeps all ops in non-empty
    stages; refining never returns a slower layout than it started from."""
    from dl_nfv.planners.pipeline.scheduler import Policy as P
    from dl_nfv.planners.pipeline.search import boundary_moves, evaluate, refine

    graph = chain(8, param_bytes=GIB // 8, slower={"P100": 2.0})
    topo = _topology([V100, "P100", V100])
    problem = Problem(graph, topo)
    layout = Layout((StageSpec(0, 2, ("h0/gpu0",)), StageSpec(2, 6, ("h1/gpu0",)),
                     StageSpec(6, 8, ("h2/gpu0",))), 4)
    moves = boundary_moves(layout)
    assert len(moves) == 4
    for lay in moves:
        assert lay.stages[0].start == 0 and lay.stages[-1].stop == 8
        assert all(a.stop == b.start for a, b in zip(lay.stages, lay.stages[1:]))
        assert all(st.stop > st.start for st in lay.stages)
        assert sum(abs(a.stop - b.stop) for a, b in zip(lay.stages, layout.stages)) == 1
    start = evaluate(problem, layout, full=True, policies=tuple(P))
    budget = [10_000]
    better, cut = refine(problem, start, tuple(P), budget)
    assert not cut and better.makespan_ms <= start.makespan_ms
    # the slow middle stage sheds ops to the fast ends
    assert better.layout.stages[1].stop - better.layout.stages[1].start < 4
    assert better.makespan_ms < start.makespan_ms and budget[0] < 10_000
    # past its deadline a climb schedules nothing more and says it was cut
    left = [10_000]
    assert refine(problem, start, tuple(P), left, deadline=0.0) == (start, True)
    assert left == [10_000]


def test_shift_moves_pass_one_unit_between_stages_apart():
    """Each shift passes one unit from one stage to another at least two apart; the
    stages in between keep their sizes and the ops stay covered in order."""
    from dl_nfv.planners.pipeline.search import shift_moves

    sizes = (1, 3, 2, 2)
    cuts = [0, 1, 4, 6, 8]
    layout = Layout(tuple(StageSpec(a, b, (f"h{k}/gpu0",))
                          for k, (a, b) in enumerate(zip(cuts, cuts[1:]))), 4)
    moves = shift_moves(layout)
    changes = set()
    for lay in moves:
        assert lay.stages[0].start == 0 and lay.stages[-1].stop == 8
        assert all(a.stop == b.start for a, b in zip(lay.stages, lay.stages[1:]))
        assert [st.devices for st in lay.stages] == [st.devices for st in layout.stages]
        new = tuple(st.stop - st.start for st in lay.stages)
        delta = [n - o for n, o in zip(new, sizes)]
        gain, loss = delta.index(1), delta.index(-1)
        assert abs(gain - loss) >= 2 and sorted(delta) == [-1, 0, 0, 1]
        changes.add((loss, gain))
    # every ordered pair two or more apart, except taking from the one-unit first stage
    assert changes == {(0, 2), (2, 0), (0, 3), (3, 0), (1, 3), (3, 1)} - {(0, 2), (0, 3)}


def _diamond(width: int, *, gib: float = 1.0, batch: int = 8):
    """a -> (b0 .. b{width-1}) -> d, every op measured on a V100 (10 ms fwd, 20 ms bwd)."""
    from dl_nfv.artifacts import Edge, ModelRef, Op, OpGraph, OpKind

    names = ["a", *(f"b{i}" for i in range(width)), "d"]
    ops = tuple(Op(id=n, name=n, kind=OpKind.BLOCK, flops=1e9, param_bytes=int(gib * GIB),
                   output_bytes=2**20, fwd_ms={V100: 10.0}, bwd_ms={V100: 20.0}) for n in names)
    edges = tuple([Edge(src="a", dst=f"b{i}", bytes=2**20) for i in range(width)]
                  + [Edge(src=f"b{i}", dst="d", bytes=2**20) for i in range(width)])
    return OpGraph(model=ModelRef(name="diamond", source="test", batch_size=batch), ops=ops, edges=edges)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(width=st.integers(2, 4), gib=st.sampled_from([0.1, 2.5]), devices=st.integers(2, 4))
def test_bound_holds_on_branchy_graphs(width, gib, devices):
    """Stages of a diamond need not be ranges of one order; the relaxed bound still holds."""
    graph = _diamond(width, gib=gib)
    topo = nvlink(devices)
    for planner in ("pipeline", "gpipe", "pipedream"):
        try:
            plan = run(planner, graph, topo)
        except Exception as exc:
            assert "GiB" in str(exc) or "stages" in str(exc)
            continue
        assert plan.bound_ms <= plan.prediction.iteration_ms * (1 + 1e-9), planner


def _ring(bandwidths, types):
    """Single-GPU hosts cabled in a ring of direct links of ``bandwidths`` Gbps (no switch)."""
    n = len(types)
    return from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": "ring",
        "hosts": [{"name": f"r{i}", "devices": [{"type": t}]} for i, t in enumerate(types)],
        "links": [{"endpoints": [f"r{i}/gpu0", f"r{(i + 1) % n}/gpu0"],
                   "bandwidth_gbps": bw, "latency_us": 5} for i, bw in enumerate(bandwidths)]})


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), layers=st.integers(2, 6), hosts=st.integers(3, 6),
       gib=st.sampled_from([0.01, 0.3, 4.0]), out_mib=st.sampled_from([4, 256, 1024]),
       batch=st.sampled_from([4, 8]), fwd=st.sampled_from([0.2, 10.0]),
       policy=st.sampled_from(list(Policy)))
def test_bound_never_above_any_simulated_layout_on_a_ring(data, layers, hosts, gib, out_mib,
                                                          batch, fwd, policy):
    """Any layout (stages, replicas, microbatches) on a ring of uneven direct links, where
    activations and AllReduces cross other GPUs' links, simulates at or above the bound:
    its AllReduce floors (over every group's own cost) and the boundaries' transfers
    hold for plans no planner would make."""
    from dl_nfv.planners.bounds.stage_balanced import stage_balanced_bound_ms

    types = data.draw(st.lists(st.sampled_from([V100, "P100"]), min_size=hosts, max_size=hosts))
    bws = data.draw(st.lists(st.sampled_from([10, 25, 100]), min_size=hosts, max_size=hosts))
    graph = chain(layers, fwd_ms=fwd, bwd_ms=2 * fwd, param_bytes=int(gib * GIB),
                  out_bytes=out_mib * 2**20, batch=batch, slower={"P100": 1.5})
    topo = _ring(bws, types)
    problem = Problem(graph, topo)
    devices = data.draw(st.permutations(problem.devices))
    stages = data.draw(st.integers(1, min(layers, hosts)))
    cuts = sorted(data.draw(st.lists(st.integers(1, layers - 1), min_size=stages - 1,
                                     max_size=stages - 1, unique=True)))
    counts = data.draw(st.lists(st.integers(1, 2), min_size=stages, max_size=stages))
    while sum(counts) > hosts:
        counts[counts.index(max(counts))] -= 1
    bounds = [0, *cuts, layers]
    specs, used = [], 0
    for s in range(stages):
        specs.append(StageSpec(bounds[s], bounds[s + 1], tuple(devices[used:used + counts[s]])))
        used += counts[s]
    m = data.draw(st.sampled_from([d for d in (1, 2, 4, 8) if batch % d == 0]))
    layout = Layout(tuple(specs), m)
    reps = all_replicas(problem, layout)
    try:
        timed = schedule_run(stage_costs(problem, layout, reps), policy)
    except ValueError:  # a stage that cannot hold a microbatch
        return
    groups, pipeline = groups_and_pipeline(problem, layout, reps, timed.schedule)
    plan = Plan(planner="pipeline", graph_sha256=fingerprint(graph),
                topology_sha256=fingerprint(topo), batch_size=batch, groups=tuple(groups),
                pipeline=pipeline, fusion=stage_buckets(problem, layout, reps))
    result = simulate(plan, graph, topo, check_fingerprints=False)
    if result.feasible:
        assert stage_balanced_bound_ms(problem) <= result.iteration_ms * (1 + 1e-9)


def test_device_swaps_trade_devices_between_stages_and_with_idle_ones():
    """Stages on (a, b) and (c) with d idle: every pair from different stages, or a stage's
    device with the idle one, and nothing inside one stage (that changes no plan)."""
    from dl_nfv.planners.pipeline.search import device_swaps

    problem = Problem(chain(4), nvlink(4))
    a, b, c, d = problem.devices
    layout = Layout((StageSpec(0, 2, (a, b)), StageSpec(2, 4, (c,))), 4)
    got = {tuple(st.devices for st in lay.stages) for lay in device_swaps(problem, layout)}
    assert got == {((c, b), (a,)), ((a, c), (b,)), ((d, b), (c,)), ((a, d), (c,)),
                   ((a, b), (d,))}
    assert all(lay.microbatches == 4 and [(st.start, st.stop) for st in lay.stages]
               == [(0, 2), (2, 4)] for lay in device_swaps(problem, layout))


@pytest.mark.parametrize("head_splits", [False, True])
@pytest.mark.parametrize("sync", list(TieSync))
def test_scheduler_matches_the_simulator_with_split_backwards_and_a_tie(head_splits, sync):
    """Split backwards next to ops that defer nothing: layers 0, 1 and 3 have half their
    backward FLOPs in input gradients, layer 2's split was not profiled (and shares a stage
    with layer 1), and the head, which uses layer 0's weight, one way or the other. An op
    that defers nothing keeps its adding into buckets in the I, in the scheduler as in the
    simulator, with the tie AllReduced or exchanged. (The tie's two users are alone in
    their stages: the scheduler starts the tie's sum after a stage's last task, the
    simulator after the user's own.)"""
    split = {"l0": 0.5, "l1": 0.5, "l3": 0.5, "l4": 0.5 if head_splits else None}
    graph = _looked_up(_tied(chain(5, param_bytes=GIB // 4), GIB // 4))
    graph = replace(graph, ops=tuple(
        replace(op, bwd_flops=4e9, bwd_input_flops=4e9 * split[op.id])
        if split.get(op.id) is not None else op for op in graph.ops))
    topo = nvlink(4)
    problem = Problem(graph, topo, tie_sync=sync)
    cuts = [0, 2, 4, 5, 6]
    layout = Layout(tuple(StageSpec(a, b, (d,)) for a, b, d in
                          zip(cuts, cuts[1:], problem.devices[:4])), 8)
    reps = all_replicas(problem, layout)
    c = stage_costs(problem, layout, reps)
    assert c.splittable() == (False, True, True, head_splits)
    timed = schedule_run(c, Policy.LIST, backward_first=True, split=True)
    assert timed.label.startswith("list-zb")
    groups, pipeline = groups_and_pipeline(problem, layout, reps, timed.schedule)
    plan = Plan(planner="pipeline", graph_sha256=fingerprint(graph),
                topology_sha256=fingerprint(topo), batch_size=graph.model.batch_size,
                groups=tuple(groups), pipeline=pipeline,
                fusion=stage_buckets(problem, layout, reps), tie_sync=sync)
    sim = simulate(plan, graph, topo, check_fingerprints=False).iteration_ms
    assert sim == pytest.approx(timed.makespan_ms, rel=1e-6)


