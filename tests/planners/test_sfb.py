"""The SFB ILP (``planners/sfb.py``) against enumeration on the simulator, its memory
constraint, its bad inputs, and GPT-2 small across a slow link.

The three-layer case is checkable by hand: 16 rows per step, two replicas over 10 Gbps.
A layer's factors are ``16 x (in + out)`` floats against an ``in x out`` gradient:
fc0 (4096 x 4096) and fc1 (4096 x 1024) send a few hundred times fewer bytes by SFB,
fc2 (1024 x 8: 16 x 1032 > 8192) more, so the optimum switches fc0 and fc1 only. The
expected times come from simulating all 8 choices.
"""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from dl_nfv.artifacts import (
    Compression,
    Group,
    InfeasiblePlan,
    OpKind,
    Topology,
    fingerprint,
    from_data,
    load,
    save,
)
from dl_nfv.cli.main import cli
from dl_nfv.planners import get
from dl_nfv.planners.sfb import apply_sfb
from dl_nfv.simulator import CostModel, simulate
from dl_nfv.simulator.synthetic import gpt2
from tests.conftest import EXAMPLES
from tests.simulator.helpers import GPU, graph, op, plan

ROWS = 16
DIMS = ((4096, 4096), (4096, 1024), (1024, 8))


def three_layers():
    ops = [op("x", output_bytes=ROWS * DIMS[0][0] * 4)]
    edges, prev = [], "x"
    for i, (fin, fout) in enumerate(DIMS):
        ops.append(op(f"fc{i}", 1.0, 2.0, param_bytes=fin * fout * 4,
                      output_bytes=ROWS * fout * 4, kind=OpKind.MATMUL))
        edges.append((prev, f"fc{i}", ROWS * fin * 4))
        prev = f"fc{i}"
    return graph(ops, edges, batch_size=ROWS)


def two_hosts(memory_gib: float | None = None) -> Topology:
    device = {"type": GPU, "count": 1, **({"memory_gib": memory_gib} if memory_gib else {})}
    return from_data(Topology, {
        "name": "two-hosts",
        "hosts": [{"name": f"h{i}", "devices": [device],
                   "nics": [{"switch": "sw", "bandwidth_gbps": 10.0, "latency_us": 5.0}]}
                  for i in range(2)],
        "switches": [{"name": "sw"}]})


def layer_plan(g, t):
    devices = tuple(t.device_names)
    groups = [Group(id="input", ops=("x",), devices=devices)]
    groups += [Group(id=f"g{i}", ops=(f"fc{i}",), devices=devices) for i in range(len(DIMS))]
    return plan(g, t, groups)


def with_sfb(p, chosen):
    return dataclasses.replace(p, groups=tuple(
        dataclasses.replace(g, compression=Compression.SFB if g.id in chosen else Compression.NONE)
        for g in p.groups))


def enumerate_choices(p, g, t):
    """Simulated iteration time and peak memory of every subset of the three layers."""
    out = {}
    for bits in itertools.product((0, 1), repeat=len(DIMS)):
        chosen = frozenset(f"g{i}" for i, b in enumerate(bits) if b)
        out[chosen] = simulate(with_sfb(p, chosen), g, t).iteration_ms
    return out


def held_bytes(i: int) -> float:
    """Factors of the other replica held on a device (closed form): half the rows, in + out."""
    fin, fout = DIMS[i]
    return 0.5 * ROWS * (fin + fout) * 4


def test_the_ilp_finds_the_enumerated_optimum_of_three_layers():
    g, t = three_layers(), two_hosts()
    p = layer_plan(g, t)
    times = enumerate_choices(p, g, t)
    best = min(times.values())
    out, report = apply_sfb(p, g, t)
    assert report["candidates"] == ["g0", "g1"]  # fc2's factors outweigh its gradient
    assert report["groups"] == ["g0", "g1"]
    assert sorted(report["layers"]) == ["fc0", "fc1"]
    assert out.prediction.iteration_ms == pytest.approx(best, abs=1e-6)
    assert times[frozenset({"g0", "g1"})] == pytest.approx(best, rel=1e-12)
    assert report["iteration_ms"]["before"] == pytest.approx(times[frozenset()])
    assert [g.id for g in out.groups if g.compression is Compression.SFB] == ["g0", "g1"]
    # the cross-host links carry the factors instead of the gradients
    nic = report["bytes_by_link_class"]["10 Gbps"]
    assert nic["after"] < nic["before"] / 50


def test_memory_left_for_one_layer_s_factors_takes_the_better_one():
    g = three_layers()
    base = simulate(layer_plan(g, two_hosts()), g, two_hosts())
    peak = max(base.peak_memory_bytes.values())
    room = (held_bytes(0) + held_bytes(1)) * 0.9  # either layer's factors fit, not both
    t = two_hosts(memory_gib=(peak + room) / 2**30)
    p = layer_plan(g, t)
    cm = CostModel(g, t)
    room = min(cm.memory_bytes(d) for d in t.device_names) - peak
    assert held_bytes(0) <= room and held_bytes(1) <= room < held_bytes(0) + held_bytes(1)
    times = enumerate_choices(p, g, t)
    fits = {c: ms for c, ms in times.items()
            if sum(held_bytes(int(x[1])) for x in c if x != "g2") <= room}
    best = min(fits, key=lambda c: (fits[c], len(c)))
    out, report = apply_sfb(p, g, t)
    assert frozenset(report["groups"]) == best == frozenset({"g0"})
    assert out.prediction.iteration_ms == pytest.approx(fits[best], abs=1e-6)


def test_a_plan_that_does_not_fit_makes_the_ilp_infeasible_naming_the_device():
    g = three_layers()
    peak = max(simulate(layer_plan(g, two_hosts()), g, two_hosts()).peak_memory_bytes.values())
    t = two_hosts(memory_gib=(peak - 2**20) / 2**30)
    with pytest.raises(InfeasiblePlan, match=r"device 'h\d/gpu0' needs .* bytes\) but has"):
        apply_sfb(layer_plan(g, t), g, t)


def _cli(args):
    from click.testing import CliRunner

    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="dl-nfv")


def test_plan_sfb_command_writes_the_plan_and_refuses_an_infeasible_one(tmp_path):
    g, t = three_layers(), two_hosts()
    save(g, tmp_path / "g.json")
    save(t, tmp_path / "t.yaml")
    p = dataclasses.replace(layer_plan(g, t), graph_path="g.json", topology_path="t.yaml")
    save(p, tmp_path / "plan.json")
    result = _cli(["plan", "sfb", tmp_path / "plan.json", "-o", tmp_path / "out" / "sfb.json"])
    assert result.exit_code == 2 and "out" in result.stderr  # no such output folder
    result = _cli(["plan", "sfb", tmp_path / "plan.json", "-o", tmp_path / "sfb.json"])
    assert result.exit_code == 0, result.output
    out = load(tmp_path / "sfb.json", expect="plan")
    assert [x.id for x in out.groups if x.compression is Compression.SFB] == ["g0", "g1"]
    assert out.prediction.iteration_ms == pytest.approx(
        simulate(out, g, t).iteration_ms, rel=1e-6)
    assert out.graph_path == "g.json" and out.topology_path == "t.yaml"
    # applied to its own output, the command chooses the same groups
    result = _cli(["plan", "sfb", tmp_path / "sfb.json", "-o", tmp_path / "again.json"])
    assert result.exit_code == 0, result.output
    assert load(tmp_path / "again.json", expect="plan").groups == out.groups
    # a plan made for a topology whose devices cannot hold it
    peak = max(simulate(p, g, t).peak_memory_bytes.values())
    small = two_hosts(memory_gib=(peak - 2**20) / 2**30)
    save(small, tmp_path / "small.yaml")
    tight = dataclasses.replace(p, topology_sha256=fingerprint(small), topology_path="small.yaml")
    save(tight, tmp_path / "tight.json")
    result = _cli(["plan", "sfb", tmp_path / "tight.json", "--json"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: plan sfb: infeasible: device 'h")
    assert len(result.stderr.splitlines()) == 1 and result.stdout == ""


def _gpt2_small(batch_size: int, seq_len: int):
    g = gpt2(layers=12, d_model=768, heads=12, seq_len=seq_len, batch_size=batch_size,
             name="gpt2")
    t = load(EXAMPLES / "topologies" / "a100-2x4-25g.yaml", expect="topology")
    return g, t, get("dp")(g, t, seed=0)


def test_gpt2_small_across_a_slow_link_switches_its_large_linear_layers():
    # GPT-2 small (12 blocks, d 768), data parallel over 2 hosts x 4 A100s joined by 25 Gbps,
    # 8 sequences of 64 tokens: 64 rows per replica, so a block's qkv (768 x 2304), fc
    # (768 x 3072) and mlp (3072 x 768) gradients dwarf their factors
    g, t, dp = _gpt2_small(8, 64)
    out, report = apply_sfb(dp, g, t)
    big = {f"h{i}_{name}" for i in range(12) for name in ("qkv", "fc", "mlp")}
    assert big <= set(report["layers"])
    assert all(g.index[layer].kind is OpKind.MATMUL for layer in report["layers"])
    assert report["iteration_ms"]["after"] < 0.9 * report["iteration_ms"]["before"]
    slow = report["bytes_by_link_class"]["25 Gbps"]
    assert slow["after"] < slow["before"]
    json.dumps(report)  # a plain document


def test_gpt2_small_at_a_large_batch_keeps_allreduce():
    # 32 x 1024 tokens: 4096 rows per replica x (768 + 3072) outweighs 768 x 3072
    g, t, dp = _gpt2_small(32, 1024)
    out, report = apply_sfb(dp, g, t)
    assert report["candidates"] == [] and report["layers"] == []
    assert out.prediction.iteration_ms == pytest.approx(dp.prediction.iteration_ms, abs=1e-6)
    assert all(x.compression is Compression.NONE for x in out.groups)


def per_block_plan(g, t):
    """GPT-2 data parallel with each block a group of its own (every group on every device)."""
    devices = tuple(t.device_names)
    blocks: dict[str, list[str]] = {}
    for o in g.ops:
        blocks.setdefault(o.id.split("_")[0] if o.id.startswith("h") else "rest", []).append(o.id)
    return plan(g, t, [Group(id=k, ops=tuple(v), devices=devices) for k, v in blocks.items()])


@pytest.mark.parametrize("planner", ["dp", "dp-even", "dp-ps", "m-etf", "single", "per-block"])
def test_sfb_never_raises_the_simulated_time_of_a_plan(planner):
    # whatever made the plan, the output simulates to its prediction, which is at most the
    # input's (SFB marks cleared), and only AllReduce groups of 2+ devices are marked
    g, t, _ = _gpt2_small(8, 64)
    p = per_block_plan(g, t) if planner == "per-block" else get(planner)(g, t, seed=0)
    out, report = apply_sfb(p, g, t)
    before = simulate(with_sfb(p, ()), g, t).iteration_ms
    after = simulate(out, g, t).iteration_ms
    assert report["iteration_ms"]["before"] == pytest.approx(before, abs=1e-6)
    assert out.prediction.iteration_ms == pytest.approx(after, abs=1e-6)
    assert after <= before + 1e-9
    assert set(report["groups"]) <= set(report["ilp_groups"]) <= set(report["candidates"])
    for x in out.groups:
        if x.compression is Compression.SFB:
            assert x.sync.value == "allreduce" and len(x.devices) > 1
    if planner == "per-block":  # twelve binaries; the blocks' exchanges pay across 25 Gbps
        assert len(report["candidates"]) == 12 and report["ilp"]["status"] == "optimal"
        assert after < 0.9 * before
