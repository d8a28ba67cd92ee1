"""A plan `plan tag` makes on the measured local-cpu topology trains for real (2 steps),
with SFB applied and without."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dl_nfv.artifacts import load
from dl_nfv.planners import run
from dl_nfv.planners.validate import validate_plan
from tests.runtime.helpers import dl_nfv, graph_of, write

LOCAL_CPU = Path(__file__).resolve().parents[2] / "examples" / "topologies" / "local-cpu.yaml"
FILES = {"graph_path": "graph.json", "topology_path": "topology.json"}  # as helpers.write puts them


def _validated_train(tmp_path, graph, topo, plan):
    """Validate ``plan``, write the three artifacts, ``train --steps 2`` it; the run report."""
    validate_plan(plan, graph, topo, check_fingerprints=True)
    write(tmp_path, graph, topo, plan)
    result = dl_nfv("train", str(tmp_path / "plan.json"), "--steps", "2", "-o",
                    str(tmp_path / "run.json"), timeout=300)
    assert result.returncode == 0, result.stderr
    return load(tmp_path / "run.json", expect="run-report")


@pytest.mark.slow
@pytest.mark.parametrize("sfb", [True, False])
def test_train_runs_a_tag_plan_on_local_cpu(tmp_path, sfb):
    graph, topo = graph_of("mlp-tiny", batch_size=8), load(LOCAL_CPU, expect="topology")
    plan = replace(run("tag", graph, topo, playouts=24, max_evaluations=30, sfb=sfb), **FILES)
    report = _validated_train(tmp_path, graph, topo, plan)
    assert report.steps == 2 and len(report.step_ms) == 2
    used = {d for g in plan.groups for d in g.devices}
    assert set(report.ranks) == used


@pytest.mark.slow
def test_train_runs_a_micro_batched_tag_plan_on_local_cpu(tmp_path):
    """A TAG strategy with the groups alternating between the two ranks and 2 microbatches
    (1F1B): each rank runs two stages from the projected schedule, for real."""
    from dl_nfv.planners.base import finish, started
    from dl_nfv.planners.heterog import problem_of
    from dl_nfv.planners.learned.env import GroupStrategy
    from dl_nfv.planners.tag.batching import BatchedEnv, Batching

    graph, topo = graph_of("mlp-tiny", batch_size=8), load(LOCAL_CPU, expect="topology")
    env = problem_of(graph, topo, groups=4).env
    devices = env.devices
    strategies = [GroupStrategy(devices=(devices[i % 2],)) for i in range(len(env.coarsening.groups))]
    made = BatchedEnv(env).plan_of(strategies, Batching(2, "1f1b"), planner="tag")
    plan = finish(planner="tag", graph=graph, topology=topo, groups=made.groups,
                  pipeline=made.pipeline, seed=0, options={}, started_at=started())
    assert len(plan.groups) >= 3 and plan.pipeline.microbatches == 2
    plan = replace(plan, **FILES)
    report = _validated_train(tmp_path, graph, topo, plan)
    assert report.steps == 2 and set(report.ranks) == set(devices)
