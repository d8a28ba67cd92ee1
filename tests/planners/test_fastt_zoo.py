"""Every placement planner on every zoo model passes the shared ``validate_plan``.

Models are the zoo's ``-tiny`` variants profiled for real (one repetition). Three
small ones run by default; the whole zoo with ``--runslow`` (profiling all of it
takes minutes on two cores).
"""

from __future__ import annotations

import pytest

from dl_nfv.artifacts import load
from dl_nfv.planners import PLANNERS, run
from dl_nfv.planners.validate import validate_plan
from tests.conftest import EXAMPLES

PLACEMENT = [name for name, info in PLANNERS.items() if info.family == "placement"]
FAST = ("mlp-tiny", "gpt2-small-tiny", "bert-base-tiny")


def _zoo_tiny() -> list[str]:
    from dl_nfv.profilers import zoo

    return sorted(n for n in zoo.ZOO if n.endswith("-tiny"))


_GRAPHS: dict[str, object] = {}


def _graph(name: str):
    if name not in _GRAPHS:
        from dl_nfv.profilers import profile_model, zoo

        _GRAPHS[name] = profile_model(zoo.model_ref(name), granularity="op", repeats=1, warmup=0,
                                       span_s=0.0)
    return _GRAPHS[name]


def _params():
    out = []
    for name in _zoo_tiny():
        marks = () if name in FAST else (pytest.mark.slow,)
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def test_the_registry_has_the_placement_planners():
    assert set(PLACEMENT) >= {"fastt", "m-topo", "m-etf", "m-sct"}


@pytest.mark.parametrize("model", _params())
@pytest.mark.parametrize("topology", ["heterog-testbed8", "ring8-mixed"])
def test_every_placement_planner_makes_a_valid_plan(model, topology):
    graph = _graph(model)
    topo = load(EXAMPLES / "topologies" / f"{topology}.yaml")
    times = {}
    for name in PLACEMENT:
        plan = run(name, graph, topo)
        validate_plan(plan, graph, topo, check_fingerprints=True)
        # each op placed once, in some device's order wherever it runs
        for group in plan.groups:
            for op in group.ops:
                assert all(op in plan.order[d] for d in group.devices), (name, op)
        times[name] = plan.prediction.iteration_ms
    assert times["fastt"] <= min(times.values()) * (1 + 1e-9), times
