"""``dl-nfv train`` on the command line: a real run, its report and trace, and bad input."""

from __future__ import annotations

import ctypes
import json
import statistics
from dataclasses import replace

import pytest
from click.testing import CliRunner

from dl_nfv.artifacts import ProfileInfo, load, save
from dl_nfv.cli.main import cli

from .helpers import devices, dl_nfv, dp_plan, graph_of, pipeline_plan, topology, write


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    graph, topo = graph_of("mlp-tiny", batch_size=8), topology(2)
    write(tmp, graph, topo, dp_plan(graph, topo, devices(2), buckets=2))
    return tmp


def test_train_writes_report_and_merged_trace(run_dir):
    result = dl_nfv("train", str(run_dir / "plan.json"), "--steps", "5", "-o",
                    str(run_dir / "run.json"), "--trace", str(run_dir / "trace.json"))
    assert result.returncode == 0, result.stderr
    report = load(run_dir / "run.json", expect="run-report")
    assert report.world_size == 2 and report.steps == 5 and report.warmup == 1
    assert report.ranks == {"local/cpu0": 0, "local/cpu1": 1}
    assert report.backend == "gloo" and report.threads == 1
    assert all(len(r.iteration_ms) == 5 and r.peak_memory_bytes > 0 for r in report.per_rank)
    assert report.iteration_ms == pytest.approx(statistics.median(report.step_ms), abs=1e-3)
    assert report.trace_path.endswith("trace.json")
    trace = json.loads((run_dir / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M"
             and e.get("name") == "process_name" and str(e.get("args", {}).get("name", "")).startswith("rank")}
    assert names == {"rank 0 (local/cpu0)", "rank 1 (local/cpu1)"}
    assert not list(run_dir.glob("trace.rank*.json"))
    shown = CliRunner().invoke(cli, ["show", str(run_dir / "run.json"), "--width", "120"])
    assert shown.exit_code == 0 and "local/cpu1" in shown.output


def test_trace_shows_the_plan_order_executed(tmp_path):
    """The trace names each unit action as the simulator names its tasks, and each rank
    ran its stage's microbatches in exactly the plan's (custom) order, every traced step."""
    graph, topo = graph_of("mlp-tiny", batch_size=8), topology(2)
    d = devices(2)
    order = {d[0]: "0F0 0F1 0F2 0B1 0F3 0B0 0B3 0B2", d[1]: "1F0 1F1 1B1 1B0 1F2 1F3 1B3 1B2"}
    plan = pipeline_plan(graph, topo, [[d[0]], [d[1]]], microbatches=4, kind="custom",
                         schedule=order)
    write(tmp_path, graph, topo, plan)
    result = dl_nfv("train", str(tmp_path / "plan.json"), "--steps", "4", "--warmup", "1",
                    "--trace", str(tmp_path / "trace.json"))
    assert result.returncode == 0, result.stderr
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    for rank, device in enumerate(d):
        spans = sorted((e for e in events if e.get("pid") == rank
                        and e.get("cat") == "user_annotation"
                        and e["name"].split(" ")[0] in ("forward", "backward", "update")),
                       key=lambda e: e["ts"])
        steps = " ".join(e["name"] for e in spans).split(" update")
        expected = " ".join(f"{'forward' if a[1] == 'F' else 'backward'} stage{a[0]} mb{a[2]}"
                            for a in order[device].split())
        assert [s.strip() for s in steps if s.strip()] == [expected] * 3  # 3 traced steps


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallopt"), reason="no glibc mallopt")
def test_report_notes_a_graph_profiled_under_another_heap_policy(tmp_path):
    graph, topo = graph_of("mlp-tiny", batch_size=8), topology(2)
    graph = replace(graph, profile=ProfileInfo(device_type="cpu", threads=1, allocator="system"))
    write(tmp_path, graph, topo, dp_plan(graph, topo, devices(2)))
    result = dl_nfv("train", str(tmp_path / "plan.json"), "--steps", "2", "--threads", "1",
                    "-o", str(tmp_path / "run.json"))
    assert result.returncode == 0, result.stderr
    notes = load(tmp_path / "run.json", expect="run-report").notes
    assert any("profiled with the 'system' heap policy, the workers ran with 'kept'" in n
               for n in notes), notes


def _invoke(*args):
    return CliRunner().invoke(cli, ["train", *map(str, args)])


def test_a_bad_heap_policy_is_exit_2_before_any_worker_starts(run_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("DL_NFV_ALLOCATOR", "mmap")
    result = _invoke(run_dir / "plan.json", "--steps", "2", "-o", tmp_path / "run.json")
    assert result.exit_code == 2
    assert "DL_NFV_ALLOCATOR='mmap': expected kept or system" in result.output
    assert "worker logs" not in result.output and not (tmp_path / "run.json").exists()


def test_missing_plan_is_exit_2():
    result = _invoke("no-such-plan.json", "--steps", "2")
    assert result.exit_code == 2
    assert "no-such-plan.json: no such file" in result.output


def test_missing_graph_names_the_recorded_path(run_dir, tmp_path):
    plan = load(run_dir / "plan.json", expect="plan")
    save(plan, tmp_path / "plan.json")  # its graph_path 'graph.json' is not beside it here
    result = _invoke(tmp_path / "plan.json", "--steps", "2")
    assert result.exit_code == 2
    assert "graph.json" in result.output and "pass --graph" in result.output


def test_wrong_graph_is_a_mismatch(run_dir, tmp_path):
    other = graph_of("mlp-tiny", batch_size=4)
    save(other, tmp_path / "g.json")
    result = _invoke(run_dir / "plan.json", "--graph", tmp_path / "g.json", "--steps", "2")
    assert result.exit_code == 2
    assert "sha256" in result.output and "re-plan" in result.output


@pytest.mark.parametrize("args, words", [
    (("--steps", "3", "--warmup", "3"), "--warmup must be in [0, 3), got 3"),
    (("--steps", "2", "--data", "nonexistent_module_xyz:make"), "cannot import module"),
    (("--steps", "2", "--data", "no-colon"), "expected 'module:factory'"),
    (("--steps", "0"), "0 is not in the range"),
])
def test_bad_options_are_exit_2(run_dir, args, words):
    result = _invoke(run_dir / "plan.json", *args)
    assert result.exit_code == 2, result.output
    assert words in result.output


def test_the_worker_runs_under_torchrun(run_dir):
    """The multi-host path: the worker under torchrun (torch's own launcher, always installed)."""
    import subprocess
    import sys

    out = run_dir / "run-torchrun.json"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "-m", "dl_nfv.runtime.worker",
                           str(run_dir / "plan.json"), "--steps", "3", "--threads", "1",
                           "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = load(out, expect="run-report")
    assert report.ranks == {"local/cpu0": 0, "local/cpu1": 1} and len(report.losses) == 3
