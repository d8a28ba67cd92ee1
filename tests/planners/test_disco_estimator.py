"""DisCo's fused-kernel estimator: it learns a synthetic rule it was not told, the cost model
asks it for fused groups (with the per-call cost on the measured device type only), its
policy file round-trips, and disco does not fuse where a compiled region's call costs more
than fusing saves."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch

from dl_nfv.artifacts import ModelRef, OpKind, save
from dl_nfv.artifacts.policy import TrainedOn
from dl_nfv.planners.disco import plan as disco_plan
from dl_nfv.planners.disco.estimator import (
    ARCHITECTURE,
    FusedEstimator,
    GroupOps,
    group_data,
    learn,
    load_estimator,
    measured_groups,
    predict_ms,
    train,
)
from dl_nfv.planners.learned.policy import policy_of
from dl_nfv.profilers.fusion import FusionTimes, GroupOp, GroupTime
from dl_nfv.simulator.costs import CostModel
from tests.simulator.helpers import GPU

from .test_disco import MB, _small

KINDS = (OpKind.ELEMENTWISE, OpKind.ACTIVATION, OpKind.NORM, OpKind.REDUCTION)
PER_CALL = (0.05, 0.08)


def synthetic_ratio(kinds, sizes_mib) -> float:
    """The rule to learn: each op beyond the first saves a fixed share, more for
    elementwise ops, and large tensors save less (bandwidth-bound either way)."""
    saved = sum(0.25 if k == OpKind.ELEMENTWISE else 0.1 for k in kinds[1:])
    return (1.0 - saved) * (1.0 + 0.05 * math.log1p(sum(sizes_mib)))


def synthetic_times(seed: int, count: int, model: str) -> FusionTimes:
    rng = random.Random(seed)
    groups = []
    for _ in range(count):
        n = rng.randint(2, 4)
        kinds = [rng.choice(KINDS) for _ in range(n)]
        mib = [rng.uniform(0.1, 8.0) for _ in range(n)]
        ops = tuple(GroupOp(id=f"op{i}", kind=k, flops=m * 2**18, bwd_flops=m * 2**19,
                            bytes_accessed=m * 2**21, output_bytes=int(m * 2**20),
                            fwd_ms=m * 0.1, bwd_ms=m * 0.2) for i, (k, m) in enumerate(zip(kinds, mib)))
        eager_f, eager_b = sum(mib) * 0.1, sum(mib) * 0.2
        r = synthetic_ratio(kinds, mib)
        groups.append(GroupTime(ops=ops, edges=tuple((i, i + 1, int(mib[i] * 2**20)) for i in range(n - 1)),
                                eager_fwd_ms=eager_f, eager_bwd_ms=eager_b,
                                fused_fwd_ms=PER_CALL[0] + r * eager_f,
                                fused_bwd_ms=PER_CALL[1] + r * eager_b))
    return FusionTimes(model=ModelRef(name=model, batch_size=1), graph_sha256="0" * 64,
                       device_type="cpu", threads=1, repeats=1, per_call_fwd_ms=PER_CALL[0],
                       per_call_bwd_ms=PER_CALL[1], groups=tuple(groups))


pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_estimator_learns_a_synthetic_rule_on_held_out_groups():
    net = train([synthetic_times(0, 100, "a"), synthetic_times(1, 100, "b")], seed=0, epochs=200)
    held = synthetic_times(2, 60, "c")
    rows = measured_groups(held)
    pred = predict_ms(net, [ops for ops, _, _ in rows]).sum(axis=1)
    measured = np.array([f[1] + b[1] for _, f, b in rows])
    eager = np.array([f[0] + b[0] for _, f, b in rows])
    err = np.median(np.abs(pred - measured) / measured)
    assert err < 0.10
    assert err < 0.5 * np.median(np.abs(eager - measured) / measured)
    assert net.per_call_ms.tolist() == pytest.approx(list(PER_CALL))


def _spoiled(times: FusionTimes, seed: int) -> FusionTimes:
    """``times`` with one group in five so small that the per-call cost is nearly all of
    its fused time: its ratio is lost in rounding (clipped at 1% of eager)."""
    from dataclasses import replace

    rng = random.Random(seed)
    groups = []
    for g in times.groups:
        u = rng.random()
        if u < 0.2:
            g = replace(g, eager_fwd_ms=1e-3, eager_bwd_ms=2e-3,
                        fused_fwd_ms=PER_CALL[0] * rng.uniform(0.5, 1.0),
                        fused_bwd_ms=PER_CALL[1] * rng.uniform(0.5, 1.0))
        groups.append(g)
    return replace(times, groups=tuple(groups))


def test_per_call_dominated_groups_do_not_throw_the_estimator_off():
    # an unweighted squared error of the log ratio chases the tiny groups' clipped ratios:
    # weighted by the eager share they count little, and the clamp to the middle 90% of the
    # training ratios keeps them out of reach
    train_on = [_spoiled(synthetic_times(0, 100, "a"), 0), _spoiled(synthetic_times(1, 100, "b"), 1)]
    net = train(train_on, seed=0, epochs=200)
    rows = measured_groups(synthetic_times(2, 60, "c"))
    pred = predict_ms(net, [ops for ops, _, _ in rows]).sum(axis=1)
    measured = np.array([f[1] + b[1] for _, f, b in rows])
    assert np.median(np.abs(pred - measured) / measured) < 0.10
    # the tiny groups' clipped ratios are out of reach
    assert math.exp(net.log_ratio_low.min().item()) > 0.2


def _net(device_type: str = GPU, epochs: int = 20):
    net = train([synthetic_times(0, 40, "a")], seed=0, epochs=epochs)
    net.device_type = device_type  # as if measured on the test cluster's device type
    return net


def test_the_cost_model_prices_fused_groups_by_the_estimator():
    g, topo = _small()
    group = ("c1", "n1", "a1")
    net = _net()
    plain, cm = CostModel(g, topo), CostModel(g, topo)
    cm.fused_estimator = FusedEstimator(net)
    device = cm.cluster.devices[0].name
    index = g.index
    sums = [sum(cm.op_ms(o, device, phase, 0.5) for o in group) for phase in ("fwd", "bwd")]
    # the group as the estimator should read it, built here from the graph by hand
    by_hand = GroupOps(kinds=tuple(index[o].kind for o in group),
                       figures=tuple((0.0, 0.0, 0.0, index[o].output_bytes * 0.5, index[o].param_bytes,
                                      index[o].fwd_ms[GPU], index[o].bwd_ms[GPU]) for o in group),
                       edges=((0, 1, 8 * MB * 0.5), (1, 2, 8 * MB * 0.5)),
                       sum_fwd_ms=sums[0], sum_bwd_ms=sums[1])
    with torch.no_grad():
        ratio = torch.exp(net(Batch.from_data_list([group_data(by_hand)])))[0].tolist()
    for k, phase in enumerate(("fwd", "bwd")):
        expected = net.per_call_ms[k].item() + ratio[k] * sums[k]
        assert cm.fused_ms(group, device, phase, 0.5) == pytest.approx(expected, rel=1e-5)
        assert expected != pytest.approx(plain.fused_ms(group, device, phase, 0.5))
    # one op is never a fused kernel: its own time, estimator or not
    assert cm.fused_ms(group[:1], device) == plain.fused_ms(group[:1], device)


def test_the_per_call_cost_is_charged_once_per_group_on_the_measured_device_type():
    g, topo = _small()
    group = ("c1", "n1", "a1")
    net = _net()
    cm = CostModel(g, topo)
    device = cm.cluster.devices[0].name
    cm.fused_estimator = FusedEstimator(net)
    before = cm.fused_ms(group, device, "fwd")
    net.per_call_ms.add_(torch.tensor([1.5, 0.0]))
    cm.fused_estimator = FusedEstimator(net)  # a fresh memo
    assert cm.fused_ms(group, device, "fwd") == pytest.approx(before + 1.5)
    # on a device type the measurements were not taken on, no per-call cost
    net.device_type = "cpu"
    cm.fused_estimator = FusedEstimator(net)
    assert cm.fused_ms(group, device, "fwd") == pytest.approx(before - PER_CALL[0], rel=1e-5)


def test_the_estimator_policy_round_trips(tmp_path):
    policy = learn([synthetic_times(0, 40, "a")], ["a"], held_out=[synthetic_times(1, 20, "b")],
                   held_out_names=["b"], seed=0, epochs=30, command="test")
    assert policy.planner == "disco" and policy.architecture["device_type"] == "cpu"
    assert any("held-out groups (b)" in n for n in policy.notes)
    path = save(policy, tmp_path / "disco.estimator.json")
    loaded = load_estimator(path)
    groups = [ops for ops, _, _ in measured_groups(synthetic_times(3, 10, "c"))]
    net = train([synthetic_times(0, 40, "a")], seed=0, epochs=30)
    assert np.allclose(predict_ms(loaded.net, groups), predict_ms(net, groups), rtol=1e-6)
    assert group_data(groups[0]).x.shape[0] == len(groups[0].kinds)


def test_disco_does_not_fuse_where_the_per_call_cost_outweighs_the_saving(tmp_path):
    g, topo = _small()
    for per_call, fuses in ((1e3, False), (0.0, True)):
        net = _net()
        net.per_call_ms.fill_(per_call)
        path = save(policy_of(net, planner="disco", architecture={**ARCHITECTURE, "device_type": GPU},
                              trained_on=TrainedOn(), seed=0, command=""), tmp_path / "e.json")
        chosen = disco_plan(g, topo, estimator=str(path), max_evaluations=60)
        assert bool(chosen.fusion.op_groups) == fuses, per_call


def test_with_a_per_group_price_disco_fuses_only_what_pays_and_reaches_the_enumerated_optimum():
    from dl_nfv.planners.disco.baselines import setting
    from dl_nfv.planners.disco.planner import profitable_groups, seed_candidates
    from dl_nfv.planners.disco.search import backtrack, simulated_score

    from .test_disco import _all_candidates

    g, topo = _small()
    s = setting(g, topo)
    assert profitable_groups(s) == s.maximal  # the sum-of-ops rule: every group pays

    def price(cm, op_ids, device, phase, fraction):
        # the conv's group runs at half its ops' time; any group with m2 costs 5 ms more
        parts = sum(cm.op_ms(o, device, phase, fraction) for o in op_ids)
        return parts + 5.0 if "m2" in op_ids else 0.5 * parts

    s.cm.fused_estimator = price
    assert profitable_groups(s) == (("c1", "n1", "a1"),)
    score = simulated_score(lambda fusion: s.simulate(fusion).iteration_ms)
    optimum = min(score(c) for c in _all_candidates(g))
    result = backtrack(list(seed_candidates(s).values()), score, g, bound_ms=0.0, seed=0,
                       time_limit_s=60.0, max_evaluations=200)
    assert result.best_ms == pytest.approx(optimum, rel=1e-9)
    assert all("m2" not in group for group in result.best.op_groups)


def test_simulate_with_the_estimator_predicts_what_plan_disco_recorded(tmp_path):
    from click.testing import CliRunner

    from dl_nfv.artifacts import load
    from dl_nfv.cli.main import cli

    g, topo = _small()
    graph_path, topo_path = save(g, tmp_path / "g.json"), save(topo, tmp_path / "t.yaml")
    net = _net()
    net.per_call_ms.fill_(0.0)
    estimator = save(policy_of(net, planner="disco", architecture={**ARCHITECTURE, "device_type": GPU},
                               trained_on=TrainedOn(), seed=0, command=""), tmp_path / "e.json")
    plan = disco_plan(g, topo, estimator=str(estimator), max_evaluations=60)
    assert plan.fusion.op_groups
    plan_path = save(plan, tmp_path / "p.json")
    common = ["simulate", str(plan_path), "--graph", str(graph_path), "--topology", str(topo_path)]
    runner = CliRunner()
    with_it = runner.invoke(cli, [*common, "--estimator", str(estimator), "-o", str(tmp_path / "a.json")])
    without = runner.invoke(cli, [*common, "-o", str(tmp_path / "b.json")])
    assert with_it.exit_code == 0 and without.exit_code == 0, with_it.output + without.output
    predicted = load(tmp_path / "a.json").iteration_ms
    assert predicted == pytest.approx(plan.prediction.iteration_ms, rel=1e-6)
    assert load(tmp_path / "b.json").iteration_ms != pytest.approx(predicted, rel=1e-6)
    bad = runner.invoke(cli, [*common, "--estimator", str(graph_path)])
    assert bad.exit_code == 2 and "g.json" in bad.output


def test_leave_one_model_out_scores_each_model_by_an_estimator_trained_without_it():
    from dl_nfv.planners.disco.estimator import leave_one_model_out, rule_ms

    by_model = {name: [synthetic_times(seed, 60, name)] for seed, name in enumerate("abc")}
    result = leave_one_model_out(by_model, epochs=200)
    assert set(result) == {"a", "b", "c"}
    for name, e in result.items():
        rows = measured_groups(by_model[name][0])
        measured = np.array([f[1] + b[1] for _, f, b in rows])
        eager = np.array([f[0] + b[0] for _, f, b in rows])
        assert e["groups"] == 60
        assert e["sum of ops"] == pytest.approx(np.median(np.abs(eager - measured) / measured))
        rule = np.array([rule_ms(ops, t, 0.005, 25.6e6) for (ops, _, _), t in zip(rows, eager)])
        assert np.all(rule <= eager) and np.all(rule > 0)
        assert e["estimator"] < 0.10 and e["estimator"] <= e["estimator p90"]
