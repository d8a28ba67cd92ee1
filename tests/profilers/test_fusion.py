"""`profile fusion`: sampled groups are valid, the measurements round-trip and validate, and a
bad file is refused naming the field."""

from __future__ import annotations

import json

import pytest
import torch

from dl_nfv.artifacts import InvalidArtifact, OpKind, load, save
from dl_nfv.artifacts.records import to_data
from dl_nfv.planners.disco.fusible import ANCHOR, FusionState, sample_groups
from dl_nfv.profilers import profile_model
from dl_nfv.profilers.fusion import load_fusion_times, profile_fusion
from dl_nfv.profilers.zoo import model_ref


@pytest.fixture(scope="module")
def mlp():
    return profile_model(model_ref("mlp-tiny", batch_size=4), granularity="op", repeats=1, span_s=0.0,
                         batch_scaling=False)


@pytest.fixture(scope="module")
def resnet():
    return profile_model(model_ref("resnet50-tiny", batch_size=2), granularity="op", repeats=1, span_s=0.0,
                         batch_scaling=False)


def test_sampled_groups_are_valid_distinct_and_seeded(resnet):
    groups = sample_groups(resnet, 40, seed=3, max_ops=4)
    assert len(groups) == 40 and len(set(groups)) == 40
    assert groups == sample_groups(resnet, 40, seed=3, max_ops=4)
    assert groups != sample_groups(resnet, 40, seed=4, max_ops=4)
    kind = {op.id: op.kind for op in resnet.ops}
    edges = {(e.src, e.dst) for e in resnet.edges}
    for g in groups:
        assert 2 <= len(g) <= 4
        assert sum(kind[op] in ANCHOR for op in g) <= 1
        # connected through the graph's edges, and valid as the only fused group
        seen, todo = {g[0]}, [g[0]]
        while todo:
            op = todo.pop()
            for other in g:
                if other not in seen and ((op, other) in edges or (other, op) in edges):
                    seen.add(other)
                    todo.append(other)
        assert seen == set(g)
        assert FusionState(resnet, [g]).groups() == (g,)


def test_eager_backend_measurements_validate_and_round_trip(mlp, tmp_path):
    # the "eager" backend runs dynamo without generating code: the structure, in seconds
    groups = sample_groups(mlp, 3, seed=0)
    times = profile_fusion(mlp, groups, repeats=2, backend="eager")
    assert len(times.groups) + len(times.skipped) == len(groups)
    assert times.groups and times.device_type == "cpu" and times.threads == 1
    by_id = mlp.index
    bytes_of = {(e.src, e.dst): e.bytes for e in mlp.edges}
    for g in times.groups:
        ids = [op.id for op in g.ops]
        assert tuple(ids) in groups
        assert [op.kind for op in g.ops] == [by_id[i].kind for i in ids]
        assert [op.flops for op in g.ops] == [by_id[i].flops for i in ids]
        assert {(ids[s], ids[d]): b for s, d, b in g.edges} == \
            {k: b for k, b in bytes_of.items() if k[0] in ids and k[1] in ids}
        assert min(g.eager_fwd_ms, g.fused_fwd_ms) > 0
    path = save(times, tmp_path / "t.json")
    assert load_fusion_times(path) == times


def test_a_bad_fusion_times_file_names_the_field(mlp, tmp_path):
    times = profile_fusion(mlp, sample_groups(mlp, 1, seed=0), repeats=1, backend="eager")
    data = to_data(times)
    data["groups"][0]["fused_fwd_ms"] = -1.0
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidArtifact, match=r"bad.json.*fused_fwd_ms must be >= 0"):
        load_fusion_times(path)
    path.write_text(json.dumps({**to_data(times), "kind": "plan"}))
    with pytest.raises(InvalidArtifact, match="expected kind 'fusion-times'"):
        load_fusion_times(path)


def test_on_one_thread_a_region_is_timed_by_cpu_time_not_by_waiting(one_thread):
    import time

    from dl_nfv.profilers.fusion import time_region

    x = torch.ones(64, requires_grad=True)

    def waits(a):  # 30 ms off the CPU (as behind other jobs on a busy machine), then work
        time.sleep(0.03)
        return a * 2.0

    fwd, _ = time_region(waits, (x,), repeats=2)
    assert fwd < 10.0  # the wall clock would read >= 30 ms


def test_the_artifact_loader_and_show_know_the_kind(mlp, tmp_path):
    from click.testing import CliRunner

    from dl_nfv.cli.main import cli

    times = profile_fusion(mlp, sample_groups(mlp, 1, seed=0), repeats=1, backend="eager")
    path = save(times, tmp_path / "t.json")
    assert load(path) == times and load(path, expect="fusion-times") == times
    shown = CliRunner().invoke(cli, ["show", str(path)])
    assert shown.exit_code == 0 and times.groups[0].ops[0].id in shown.output
    data = to_data(times)
    data["groups"][0]["edges"] = [[0, 9, 4]]
    path.write_text(json.dumps(data))
    shown = CliRunner().invoke(cli, ["show", str(path)])
    assert shown.exit_code == 2 and "edge (0, 9, 4) does not index" in shown.output


@pytest.mark.slow
def test_inductor_measures_a_fused_group_and_the_per_call_cost(mlp):
    # torch.compile with inductor builds C++: tens of seconds on a loaded 2-core machine
    times = profile_fusion(mlp, sample_groups(mlp, 1, seed=0), repeats=5)
    assert len(times.groups) == 1 and times.groups[0].compile_s > 0
    assert times.per_call_fwd_ms > 0 and times.per_call_bwd_ms >= 0
    assert {op.kind for op in times.groups[0].ops} <= {OpKind.MATMUL, OpKind.ACTIVATION}


@pytest.mark.slow
def test_a_compiled_cpu_region_saves_no_boolean_mask_and_computes_what_eager_does():
    # inductor's min-cut partition would save relu's mask as bool, which its C++ stores one
    # byte at a time; compile_region keeps the forward as written (saves relu's output)
    from dl_nfv.runtime.fusion import compile_region

    def region(x, y):
        return torch.relu(x + y)

    x = torch.randn(64, 32, requires_grad=True)
    y = torch.randn(64, 32, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t,
                                                  lambda t: t):
        out = compile_region(region)(x, y)
    out.backward(torch.ones_like(out))
    grad = x.grad.clone()
    x.grad = None
    ref = region(x, y)
    ref.backward(torch.ones_like(ref))
    assert saved and torch.bool not in saved, saved
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(grad, x.grad)


def test_a_graph_profiled_on_another_machine_is_refused_naming_the_field(mlp, tmp_path):
    """The profile records the machine it timed on (this one); ``profile fusion`` refuses a
    graph profiled elsewhere with exit 2, one line naming the file, the field and its value,
    and writes nothing."""
    from dataclasses import replace

    from click.testing import CliRunner

    from dl_nfv.cli.main import cli
    from dl_nfv.profilers.measure import machine_name

    assert mlp.profile.machine == machine_name(torch.device("cpu")) != ""
    other = replace(mlp, profile=replace(mlp.profile, machine="Some Other CPU @ 1.0GHz"))
    path, out = tmp_path / "other.json", tmp_path / "times.json"
    save(other, path)
    r = CliRunner().invoke(cli, ["profile", "fusion", "--graph", str(path), "--samples", "2",
                                 "-o", str(out)])
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert str(path) in line and "profile.machine" in line and "Some Other CPU" in line
    assert not out.exists()
