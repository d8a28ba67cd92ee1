"""HeteroG's micro-batched strategies: the batching searched jointly with the placement.

Hand case: a chain of four layers (1 ms forward, 2 ms backward each on a V100, 64 MiB of
parameters each) on two V100 hosts joined by 25 Gbps NICs. Replicating any layer costs
an AllReduce of its 64 MiB over the NICs (over 20 ms), far more than its 3 ms of
compute; one device runs the step in 12 ms; the two halves on the two devices as one
batch also take 12 ms plus the transfers, and only a pipeline of microbatches overlaps
them. Every strategy of the two op groups (6 candidates each) under every batching is
simulated (enumeration), and ``plan heterog`` must reach the enumerated best, which is
micro-batched.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import pytest

from dl_nfv.artifacts import from_document, load
from dl_nfv.planners import run
from dl_nfv.planners.heterog import best_baseline, problem_of
from dl_nfv.planners.learned.decoder import candidates
from dl_nfv.planners.learned.env import GroupStrategy
from dl_nfv.planners.learned.pipelined import pipelined, stage_starts, stages
from dl_nfv.planners.tag.batching import BatchedEnv, Batching, batchings
from dl_nfv.planners.validate import validate_plan
from tests.planners.test_learned import _graph

BATCH = 16


def _two_v100s():
    host = lambda name: {"name": name, "devices": [{"type": "V100-16GB", "count": 1}],  # noqa: E731
                         "nics": [{"switch": "tor", "bandwidth_gbps": 25, "latency_us": 5}]}
    return from_document({"kind": "topology", "schema_version": 1, "name": "two-v100",
                          "hosts": [host("a"), host("b")], "switches": [{"name": "tor"}]})


def test_heterog_finds_the_enumerated_best_which_is_micro_batched():
    graph, topology = _graph(n=4, param_bytes=64 * 2**20, batch=BATCH), _two_v100s()
    env = problem_of(graph, topology, groups=2).env
    batched = BatchedEnv(env)
    options = [c.strategy for c in candidates(env.cm.cluster)]
    scored = {(b, pair): batched.evaluate(pair, b)
              for b in batchings(BATCH) for pair in product(options, repeat=2)}
    (b_best, pair_best), best = max(scored.items(), key=lambda kv: kv[1].reward)
    one_batch = max(o.reward for (b, _), o in scored.items() if b.microbatches == 1)
    assert b_best.microbatches > 1 and best.reward > one_batch * 0.9  # pipelining wins by > 10%
    assert [len(s.devices) for s in pair_best] == [1, 1] and pair_best[0] != pair_best[1]

    plan = run("heterog", graph, topology, groups=2, max_evaluations=100)
    validate_plan(plan, graph, topology, check_fingerprints=True)
    assert plan.pipeline is not None and plan.pipeline.microbatches > 1
    assert abs(plan.prediction.iteration_ms - best.iteration_ms) <= 1e-6 * best.iteration_ms
    assert plan.prediction.iteration_ms < best_baseline(graph, topology, "sgd").prediction.iteration_ms
    assert any("run as a pipeline" in n for n in plan.notes), plan.notes


def test_with_one_microbatch_heterog_is_the_published_strategy_space():
    graph, topology = _graph(n=4, param_bytes=64 * 2**20, batch=BATCH), _two_v100s()
    plan = run("heterog", graph, topology, groups=2, max_evaluations=100, microbatches=1)
    assert plan.pipeline is None or plan.pipeline.microbatches == 1


def test_stage_starts_cut_the_work_in_proportion_to_speed():
    """Eight equal layers in four groups on the V100 + T4 toy (the T4 half as fast): the
    V100's stage takes two thirds of the work, rounded to whole groups by midpoints."""
    from tests.planners.test_dp_baselines import v100_t4_topology

    env = problem_of(_graph(n=8), v100_t4_topology(), groups=4).env
    v100, t4 = (GroupStrategy(devices=(d,)) for d in env.devices)
    assert stages(env, [v100, t4]) == (v100, v100, v100, t4)
    assert stages(env, [t4, v100]) == (t4, v100, v100, v100)
    got = pipelined(env, (v100,) * 4, max_evaluations=50)
    assert got.outcome.reward >= env.evaluate((v100,) * 4).reward


@pytest.mark.slow
def test_train_runs_a_micro_batched_heterog_plan_on_local_cpu(tmp_path):
    """The plan heterog makes of a stage start under 2 microbatches (GPipe) on the measured
    local-cpu cluster: valid, and `train --steps 2` runs it on every rank."""
    from dl_nfv.planners.base import finish, started
    from tests.planners.test_tag_runtime import FILES, LOCAL_CPU, _validated_train
    from tests.runtime.helpers import graph_of

    graph, topo = graph_of("mlp-tiny", batch_size=8), load(LOCAL_CPU, expect="topology")
    env = problem_of(graph, topo, groups=4).env
    _, start = stage_starts(env)[0]
    made = BatchedEnv(env).plan_of(start, Batching(2, "gpipe"), planner="heterog")
    plan = finish(planner="heterog", graph=graph, topology=topo, groups=made.groups,
                  pipeline=made.pipeline, seed=0, options={}, started_at=started())
    assert plan.pipeline.microbatches == 2 and len({g.devices for g in plan.groups}) == 2
    report = _validated_train(tmp_path, graph, topo, replace(plan, **FILES))
    assert report.steps == 2 and set(report.ranks) == set(env.devices)
