"""Every planner plans for the optimizer it is given (``--optimizer``): Adam's second state
tensor in every device's memory and its longer step, recorded in the plan, which the
simulator and the runtime follow."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dl_nfv.artifacts import BadInput, InfeasiblePlan, Optimizer, load, save
from dl_nfv.cli.main import cli
from dl_nfv.planners import PLANNERS, run
from dl_nfv.simulator import simulate
from dl_nfv.simulator.costs import CostModel
from tests.planners.test_pipeline import GIB, chain, nvlink

# four layers of 1.25 GiB: 15 GiB with gradients and momentum fits a 16 GiB V100, 20 GiB with
# Adam's two state tensors does not
BIG = 5 * GIB // 4


@pytest.mark.parametrize("name", sorted(PLANNERS))
def test_every_planner_records_and_plans_for_adam(name):
    graph, topo = chain(4, param_bytes=GIB // 8), nvlink(2)
    plan = run(name, graph, topo, optimizer="adam")
    assert plan.optimizer is Optimizer.ADAM and plan.options["optimizer"] == "adam"
    # the prediction is the shared simulator's for the plan as written, Adam's step included
    assert simulate(plan, graph, topo).iteration_ms == pytest.approx(plan.prediction.iteration_ms,
                                                                      abs=1e-6)
    assert run(name, graph, topo).optimizer is Optimizer.SGD
    with pytest.raises(BadInput, match=r"optimizer must be one of sgd, adam, got 'adagrad'"):
        run(name, graph, topo, optimizer="adagrad")


def test_data_parallel_with_adam_holds_one_more_state_tensor_and_steps_longer():
    """The same replicas and shares either way: every device's peak grows by the parameters
    (a second state tensor) and the iteration by the difference of the two updates."""
    graph, topo = chain(4, param_bytes=GIB // 8), nvlink(2)
    sgd, adam = (run("dp", graph, topo, optimizer=o) for o in ("sgd", "adam"))
    assert adam.groups == sgd.groups
    params = 4 * (GIB // 8)
    for d in sgd.devices:
        assert adam.prediction.peak_memory_bytes[d] - sgd.prediction.peak_memory_bytes[d] == params
    cm = CostModel(graph, topo)
    longer = cm.update_ms(params, "h/gpu0", Optimizer.ADAM) - cm.update_ms(params, "h/gpu0", Optimizer.SGD)
    assert longer > 0
    assert adam.prediction.iteration_ms - sgd.prediction.iteration_ms == pytest.approx(longer, abs=1e-5)


def test_a_model_that_fits_one_device_with_sgd_is_split_for_adam():
    graph, topo = chain(4, param_bytes=BIG), nvlink(2)
    assert run("single", graph, topo).devices == ("h/gpu0",)
    with pytest.raises(InfeasiblePlan, match=r"single: the model needs 20\.\d\d GiB"):
        run("single", graph, topo, optimizer="adam")
    plan = run("pipeline", graph, topo, optimizer="adam")
    assert plan.pipeline is not None and len(plan.pipeline.stages) == 2
    assert max(plan.prediction.peak_memory_bytes.values()) <= 16 * GIB


def test_the_cli_plans_and_compares_for_an_optimizer(tmp_path):
    graph, topo = chain(4, param_bytes=BIG), nvlink(2)
    g, t = save(graph, tmp_path / "g.json"), save(topo, tmp_path / "t.json")
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["plan", "pipeline", "--graph", str(g), "--topology", str(t),
                                      "--optimizer", "adam", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert load(out).optimizer is Optimizer.ADAM
    before = out.read_bytes()
    for args in (["plan", "single", "--optimizer", "adam"], ["plan", "dp", "--optimizer", "adagrad"]):
        result = CliRunner().invoke(cli, [*args, "--graph", str(g), "--topology", str(t), "-o", str(out)])
        assert result.exit_code == 2, result.output
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert out.read_bytes() == before
    result = CliRunner().invoke(cli, ["plan", "compare", "--graph", str(g), "--topology", str(t),
                                      "--planners", "single,pipeline", "--optimizer", "adam", "--json"])
    assert result.exit_code == 0, result.output
    assert '"feasible": false' in result.output and "20." in result.output
