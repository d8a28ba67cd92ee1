"""Micro-batched TAG strategies: the pipeline a strategy becomes is valid and cannot deadlock,
the search finds micro-batching where it is the known best, and `plan tag` is never slower
than the pipeline planner it seeds from."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import from_document
from dl_nfv.planners import run
from dl_nfv.planners.heterog import problem_of
from dl_nfv.planners.learned.decoder import candidates
from dl_nfv.planners.learned.env import GroupStrategy
from dl_nfv.planners.schedules import Schedule
from dl_nfv.planners.tag.batching import (
    ONE,
    BatchedEnv,
    Batching,
    batchings,
    runs,
    valid,
)
from dl_nfv.planners.tag.mcts import search
from dl_nfv.planners.tag.planner import new_net
from dl_nfv.planners.validate import validate_plan
from tests.planners.test_learned import _graph

MIB = 2**20
A, B = ("a/gpu0",), ("b/gpu0",)


def two_v100():
    """Two V100s on two hosts, 25 Gbps NICs to one switch."""
    host = lambda name: {"name": name, "devices": [{"type": "V100-16GB", "count": 1}],  # noqa: E731
                         "nics": [{"switch": "tor", "bandwidth_gbps": 25, "latency_us": 5}]}
    return from_document({"kind": "topology", "schema_version": 1, "name": "two-v100",
                          "hosts": [host("a"), host("b")], "switches": [{"name": "tor"}]})


def _chain(groups: int = 3, param_bytes: int = 64 * MIB):
    """A chain of 6 equal layers of 64 MiB parameters, batch 8, on two V100s: replicating
    costs an AllReduce of the parameters, so splitting the chain and pipelining wins."""
    problem = problem_of(_graph(n=6, param_bytes=param_bytes, batch=8), two_v100(), groups=groups)
    assert len(problem.env.coarsening.groups) == groups
    return problem


def test_batchings_are_the_power_of_two_counts_dividing_the_batch():
    assert batchings(8) == (ONE, *(Batching(m, s) for m in (2, 4, 8) for s in ("gpipe", "1f1b")))
    assert batchings(6, extra=(Batching(3, "1f1b"),)) == (
        ONE, Batching(2, "gpipe"), Batching(2, "1f1b"), Batching(3, "1f1b"))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([A, B, A + B]), min_size=3, max_size=3),
       st.sampled_from(batchings(8)[1:]))
def test_every_strategy_makes_a_valid_pipeline_whose_runs_do_not_deadlock(devices, batching):
    """Any placement of the three groups (a device or both) at any batching: the plan
    validates (every device's actions complete its stages), each run of groups with one
    strategy runs one schedule, and the schedule of the runs passes the dry run."""
    problem = _chain()
    env = BatchedEnv(problem.env)
    strategies = [GroupStrategy(devices=d) for d in devices]
    plan = env.plan_of(strategies, batching)
    validate_plan(plan, problem.env.graph, problem.env.topology, check_fingerprints=False)
    assert plan.pipeline.microbatches == batching.microbatches
    assert plan.pipeline.stages == tuple(g.id for g in plan.groups)
    spans = runs(strategies)
    assert [len(s) for s in spans] == [len(list(k)) for _, k in itertools.groupby(devices)]
    # the first device's actions of a run's first group, as a one-stage schedule, complete
    text = plan.pipeline.schedule[plan.groups[0].devices[0]]
    assert Schedule.from_texts([" ".join(f"0{t[1:]}" for t in text.split() if t[0] == "0")],
                               batching.microbatches).dry_run() is None
    outcome = env.evaluate(strategies, batching)
    assert outcome.iteration_ms > 0


def test_a_batching_is_valid_only_where_each_replica_holds_a_sample_per_microbatch():
    env = BatchedEnv(_chain().env)
    both = [GroupStrategy(devices=A + B)] * 3  # 4 samples on each device
    groups = env.plan_of(both).groups
    assert valid(groups, 8, Batching(4, "gpipe")) and not valid(groups, 8, Batching(8, "gpipe"))
    penalised = env.evaluate(both, Batching(8, "gpipe"))
    assert not penalised.feasible and penalised.reward < -penalised.iteration_ms * 10


@pytest.mark.parametrize("guided", [False, True])
def test_the_search_finds_a_micro_batched_strategy_where_micro_batching_is_best(guided):
    """Every one-microbatch strategy of the toy chain is simulated; from the worst as the
    incumbent, the search (400 playouts, the batching its first decision) returns a
    micro-batched strategy more than 10% faster than the best of them."""
    problem = _chain()
    env = problem.env
    options = [c.strategy for c in candidates(env.cm.cluster)]
    every = {s: env.evaluate(s).reward for s in itertools.product(options, repeat=3)}
    best_one = max(every.values())
    worst = min(every, key=every.get)
    found = search(env, problem.graph, worst, ref_ms=-best_one, net=new_net(0) if guided else None,
                   playouts=400, seed=1, value_weight=0.0, choices=batchings(8))
    assert found.batching.microbatches > 1
    assert found.outcome.feasible
    assert -found.outcome.reward < -best_one * 0.9
    assert len(found.samples) == 3  # the batching decision leaves no policy sample


def test_plan_tag_is_never_slower_than_the_pipeline_planner_and_pipelines_the_toy():
    problem = _chain()
    graph, topology = problem.env.graph, problem.env.topology
    pipeline = run("pipeline", graph, topology)
    plan = run("tag", graph, topology, playouts=60, max_evaluations=60, groups=3, sfb=False,
               priors="uniform")
    validate_plan(plan, graph, topology, check_fingerprints=True)
    assert plan.prediction.iteration_ms <= pipeline.prediction.iteration_ms * (1 + 1e-9)
    assert plan.pipeline is not None and plan.pipeline.microbatches > 1
    alone = run("tag", graph, topology, playouts=60, max_evaluations=60, groups=3, sfb=False,
                priors="uniform", others="")
    assert alone.pipeline is not None and alone.pipeline.microbatches > 1  # found, not seeded
