"""Every pipeline planner on every zoo model passes the shared ``validate_plan``.

Models are the zoo's ``-tiny`` variants profiled for real (one repetition) at layer and
op granularity. Three small ones at layer granularity on one cluster, and one at op
granularity on the other, run by default; the whole zoo x both granularities x both
clusters with ``--runslow`` (profiling all of it takes minutes on two cores).
"""

from __future__ import annotations

import pytest

from dl_nfv.artifacts import load
from dl_nfv.planners import PLANNERS, run
from dl_nfv.planners.schedules import Schedule
from dl_nfv.planners.validate import validate_plan
from tests.conftest import EXAMPLES

# exact needs routes that cost the same between every pair of devices, which neither
# cluster here has: tests/planners/test_exact.py covers it
PIPELINE = [name for name, info in PLANNERS.items() if info.family == "pipeline" and name != "exact"]
FAST = ("mlp-tiny", "gpt2-small-tiny", "resnet50-tiny")
_GRAPHS: dict[tuple[str, str], object] = {}


def _zoo_tiny() -> list[str]:
    from dl_nfv.profilers import zoo

    return sorted(n for n in zoo.ZOO if n.endswith("-tiny"))


def _graph(name: str, granularity: str):
    key = (name, granularity)
    if key not in _GRAPHS:
        from dl_nfv.profilers import profile_model, zoo

        _GRAPHS[key] = profile_model(zoo.model_ref(name), granularity=granularity, repeats=1, span_s=0.0,
                                     warmup=0)
    return _GRAPHS[key]


DEFAULT = {(m, "layer", "heterog-testbed8") for m in FAST} | {("gpt2-small-tiny", "op", "ring8-mixed")}


def _params():
    return [pytest.param(topology, model, granularity,
                         marks=() if (model, granularity, topology) in DEFAULT else (pytest.mark.slow,),
                         id=f"{topology}-{model}-{granularity}")
            for model in _zoo_tiny() for granularity in ("layer", "op")
            for topology in ("heterog-testbed8", "ring8-mixed")]


def test_the_registry_has_the_pipeline_planners():
    assert set(PIPELINE) == {"pipeline", "gpipe", "1f1b", "pipedream"}


@pytest.mark.parametrize("topology,model,granularity", _params())
def test_every_pipeline_planner_makes_a_valid_plan(topology, model, granularity):
    graph = _graph(model, granularity)
    topo = load(EXAMPLES / "topologies" / f"{topology}.yaml")
    times = {}
    for name in [*PIPELINE, "dp"]:
        plan = run(name, graph, topo)
        validate_plan(plan, graph, topo, check_fingerprints=True)
        if plan.pipeline is not None:
            schedule = Schedule.from_pipeline(plan.pipeline, plan.groups)
            assert schedule.deadlock_free()
            assert schedule.microbatches == plan.pipeline.microbatches
        times[name] = plan.prediction.iteration_ms
        if name != "dp":
            assert plan.bound_ms <= plan.prediction.iteration_ms * (1 + 1e-9), name
    assert times["pipeline"] <= min(times.values()) * (1 + 1e-9), times
