"""HeteroG's plans run for real and match a single-process run.

A HeteroG plan has one group per op group, each on one device or replicated with its own
batch shares and its own synchronisation (AllReduce or a parameter server): a mixed plan
the runtime executes as op placement. Both a plan that `plan heterog` makes on the
measured local-cpu topology and one that mixes every kind of group are trained and
compared with ``reference_run`` (the tolerances of ``test_numerics``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dl_nfv.artifacts import SyncMethod, load
from dl_nfv.planners import run
from dl_nfv.planners.heterog import problem_of
from dl_nfv.planners.learned.env import GroupStrategy
from dl_nfv.planners.validate import validate_plan

from .helpers import devices, graph_of
from .test_numerics import _check

FILES = {"graph_path": "graph.json", "topology_path": "topology.json"}  # as helpers.write puts them
LOCAL_CPU = Path(__file__).resolve().parents[2] / "examples" / "topologies" / "local-cpu.yaml"


def test_a_plan_heterog_makes_on_local_cpu_trains_to_the_reference(tmp_path):
    graph, topo = graph_of("mlp-tiny", batch_size=8), load(LOCAL_CPU, expect="topology")
    plan = replace(run("heterog", graph, topo, max_evaluations=40), **FILES)
    validate_plan(plan, graph, topo, check_fingerprints=True)
    _check(tmp_path, graph, topo, plan)


def test_a_mixed_plan_of_allreduce_ps_and_single_device_groups_trains_to_the_reference(tmp_path):
    graph, topo = graph_of("mlp-tiny", batch_size=8), load(LOCAL_CPU, expect="topology")
    problem = problem_of(graph, topo, groups=3)
    env = problem.env
    d = devices(2)
    assert len(env.coarsening.groups) == 3
    strategies = [GroupStrategy(devices=d),  # AllReduce, even shares
                  GroupStrategy(devices=d, sync=SyncMethod.PS, ps_server=d[1]),
                  GroupStrategy(devices=(d[0],))]
    draft = env.plan_of(strategies, planner="heterog")
    assert [g.sync for g in draft.groups] == [SyncMethod.ALLREDUCE, SyncMethod.PS, SyncMethod.NONE]
    plan = replace(draft, **FILES)
    validate_plan(plan, graph, topo, check_fingerprints=True)
    report = _check(tmp_path, graph, topo, plan)
    assert report.mode.value == "placement"
