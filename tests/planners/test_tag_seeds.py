"""Other planners' plans as TAG seeds: the batch shares are the plan's own, a DP baseline
translates exactly (same simulated time, no differences), what TAG cannot express is
listed, and a plan TAG cannot run is rejected with the reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dl_nfv.planners import run
from dl_nfv.planners.heterog import problem_of
from dl_nfv.planners.learned.env import GroupStrategy
from dl_nfv.planners.tag.batching import BatchedEnv, Batching
from dl_nfv.planners.tag.planner import with_plans
from dl_nfv.planners.tag.seeds import Rejected, seed_of_plan
from tests.planners.test_dp_baselines import v100_t4_topology
from tests.planners.test_learned import _graph
from tests.planners.test_tag_batching import _chain


def _v100_t4():
    """The 6-layer chain at batch 8 on a V100 and a T4, 3 op groups."""
    return problem_of(_graph(n=6, param_bytes=1024, batch=8), v100_t4_topology(), groups=3)


@pytest.mark.parametrize("baseline", ["dp-even", "dp-prop"])
def test_a_dp_baseline_translates_to_its_time(baseline):
    """One replica set for every op group with the baseline's own shares: the seed
    simulates to the baseline's predicted time; the one difference listed is the
    baseline's gradient bucket (TAG synchronises per op group), and without it the seed
    is exact."""
    problem = _v100_t4()
    plan = run(baseline, problem.env.graph, problem.env.topology)
    seed = seed_of_plan(plan, problem.env)
    assert all("gradient buckets" in d for d in seed.differences), seed.differences
    assert seed_of_plan(replace(plan, fusion=None), problem.env).exact
    assert seed.batching == Batching()
    assert seed.ms == pytest.approx(plan.prediction.iteration_ms, rel=1e-4)
    made = BatchedEnv(problem.env).plan_of(seed.strategies, seed.batching)
    for group in made.groups:
        assert group.devices == plan.groups[0].devices
        assert group.shares == pytest.approx(plan.groups[0].shares, abs=1e-12)


def test_a_sharded_parameter_server_keeps_its_first_server_and_says_so():
    problem = _v100_t4()
    plan = run("ps-prop", problem.env.graph, problem.env.topology)
    assert len(plan.groups[0].ps_servers) > 1
    seed = seed_of_plan(plan, problem.env)
    assert {s.ps_server for s in seed.strategies} == {plan.groups[0].ps_servers[0]}
    assert any("first parameter server" in d for d in seed.differences)


def test_shares_neither_even_nor_proportional_are_kept_as_given():
    """A plan splitting the batch 7:1 over the V100 and the T4 (TAG's even split is 4:4,
    its speed-proportional one 5:3): the seed keeps 7/8 and 1/8 exactly, as balance
    ``given``; a plan with even shares translates to the even candidate."""
    problem = _v100_t4()
    env = problem.env
    devices = env.devices
    plan = env.plan_of([GroupStrategy(devices=devices, balance="given",
                                      shares=(0.875, 0.125))] * 3)
    seed = seed_of_plan(plan, env)
    assert all(s.balance == "given" and s.shares == (0.875, 0.125) for s in seed.strategies)
    even = env.plan_of([GroupStrategy(devices=devices)] * 3)
    assert seed_of_plan(even, env).strategies == (GroupStrategy(devices=devices),) * 3


def test_a_pipeline_plan_keeps_its_shares_and_says_what_tag_cannot_express():
    """Each op group takes the placement of the plan group holding most of its ops, its
    batch shares exactly; the differences name the schedule or buckets where the plan
    has them, and the simulated comparison where the times differ."""
    problem = _chain()
    graph, topology = problem.env.graph, problem.env.topology
    pipeline = run("pipeline", graph, topology)
    seed = seed_of_plan(pipeline, problem.env)
    assert seed.batching.microbatches == pipeline.pipeline.microbatches
    holder = pipeline.group_of_op
    made = BatchedEnv(problem.env).plan_of(seed.strategies, seed.batching)
    for ops, group in zip(problem.env.coarsening.groups, made.groups):
        majority = max(ops, key=lambda op: sum(holder[o].id == holder[op].id for o in ops))
        assert group.devices == holder[majority].devices
        assert group.shares == pytest.approx(holder[majority].shares, abs=1e-12)
    close = abs(seed.ms - pipeline.prediction.iteration_ms) <= 1e-4 * seed.ms
    assert close or any("simulates to" in d for d in seed.differences)
    if pipeline.fusion is not None and pipeline.fusion.gradient_buckets:
        assert any("gradient buckets" in d for d in seed.differences)


def test_a_replica_with_fewer_samples_than_microbatches_is_rejected():
    """Shares 7/8 and 1/8 of a batch of 8 at 2 microbatches: the second replica holds one
    sample, so TAG cannot run it (the runtime splits rows per microbatch)."""
    problem = _v100_t4()
    env = problem.env
    given = GroupStrategy(devices=env.devices, balance="given", shares=(0.875, 0.125))
    plan = BatchedEnv(env).plan_of([given] * 3, Batching(2, "1f1b"))
    with pytest.raises(Rejected, match="fewer than 2 samples"):
        seed_of_plan(plan, env)


def test_a_plan_on_other_devices_is_rejected():
    problem = _v100_t4()
    plan = run("dp-even", problem.env.graph, problem.env.topology)
    moved = replace(plan, groups=tuple(replace(g, devices=(g.devices[0], "z/gpu0"))
                                       for g in plan.groups))
    with pytest.raises(Rejected, match="devices this cluster lacks: z/gpu0"):
        seed_of_plan(moved, problem.env)


def test_given_shares_must_match_the_devices():
    from dl_nfv.artifacts import BadInput

    with pytest.raises(BadInput, match="given"):
        GroupStrategy(devices=("a/gpu0", "b/gpu0"), balance="given", shares=(0.5,))
    with pytest.raises(BadInput, match="given"):
        GroupStrategy(devices=("a/gpu0", "b/gpu0"), shares=(0.5, 0.5))


def test_tag_with_given_plans_seeds_from_them_and_is_never_slower():
    """``with_plans``: a pipeline plan made once is tag's seed (a note says how exact) and
    fallback, and the DP baselines given are its reference."""
    problem = _chain()
    graph, topology = problem.env.graph, problem.env.topology
    pipeline = run("pipeline", graph, topology)
    baselines = [run(b, graph, topology) for b in ("dp-even", "dp-prop")]
    plan = with_plans(graph, topology, [pipeline], baselines=baselines, playouts=30,
                      max_evaluations=30, groups=3, sfb=False, priors="uniform",
                      others="pipeline")
    assert plan.prediction.iteration_ms <= pipeline.prediction.iteration_ms * (1 + 1e-9)
    assert any(n.startswith("seed from pipeline") for n in plan.notes)
    assert plan.options["others"] == "pipeline"
