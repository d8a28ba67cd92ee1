"""``dl-nfv simulate``: files written, defaults from the plan, bad inputs exit 2 in one line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dl_nfv.artifacts import Group, Pipeline, fingerprint, load, save
from dl_nfv.artifacts.runreport import ExecutionMode, RankRun, RunReport
from dl_nfv.cli.main import cli
from dl_nfv.simulator import simulate
from tests.simulator.helpers import chain, mesh, one_group, plan


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_error(result, code=2):
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.fixture
def files(tmp_path):
    g = chain(3, param_bytes=4096, edge_bytes=1024)
    t = mesh(2)
    save(g, tmp_path / "g.json")
    save(t, tmp_path / "t.yaml")
    p = plan(g, t, [one_group(g, t.device_names)], graph_path="g.json", topology_path="t.yaml")
    save(p, tmp_path / "plan.json")
    return tmp_path, g, t, p


def test_report_and_trace_written_from_the_plans_recorded_paths(files, monkeypatch):
    folder, g, t, p = files
    monkeypatch.chdir("/")  # recorded paths are relative to the plan file, not the working folder
    result = run("simulate", folder / "plan.json", "-o", folder / "r.json", "--trace",
                 folder / "tr.json")
    assert result.exit_code == 0, result.output
    report = load(folder / "r.json", expect="sim-report")
    assert report.iteration_ms == pytest.approx(simulate(p, g, t).iteration_ms, abs=1e-6)
    assert report.plan_sha256 == fingerprint(p)
    trace = json.loads((folder / "tr.json").read_text())
    assert any(e["ph"] == "X" for e in trace["traceEvents"])


def test_json_on_stdout_and_explicit_artifacts(files):
    folder, g, t, p = files
    bare = plan(g, t, p.groups)  # records no paths
    save(bare, folder / "bare.json")
    result = run("simulate", folder / "bare.json", "--graph", folder / "g.json", "--topology",
                 folder / "t.yaml", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["kind"] == "sim-report" and data["iteration_ms"] > 0


def test_summary_when_no_output_is_asked_for(files):
    folder, *_ = files
    result = run("simulate", folder / "plan.json")
    assert result.exit_code == 0, result.output
    assert "iteration" in result.stdout and "devices" in result.stdout


def test_show_renders_a_sim_report(files):
    folder, *_ = files
    assert run("simulate", folder / "plan.json", "-o", folder / "r.json").exit_code == 0
    shown = run("show", folder / "r.json", "--width", "120")
    assert shown.exit_code == 0 and "critical path" in shown.stdout


def test_missing_recorded_path_exits_2(files):
    folder, g, t, p = files
    save(plan(g, t, p.groups), folder / "bare.json")
    line = one_line_error(run("simulate", folder / "bare.json"))
    assert "records no graph path" in line and "--graph" in line


def test_fingerprint_mismatch_exits_2_naming_the_file(files):
    folder, g, t, p = files
    save(chain(3, fwd_ms=9.0, param_bytes=4096, edge_bytes=1024), folder / "other.json")
    line = one_line_error(run("simulate", folder / "plan.json", "--graph", folder / "other.json"))
    assert "other.json" in line and "sha256" in line


def test_absent_op_and_device_exit_2(files):
    folder, g, t, p = files
    ghost = plan(g, t, [Group(id="a", ops=("op0", "op1", "op2", "ghost"), devices=t.device_names)],
                 graph_path="g.json", topology_path="t.yaml")
    save(ghost, folder / "ghost.json")
    assert "'ghost'" in one_line_error(run("simulate", folder / "ghost.json"))
    away = plan(g, t, [one_group(g, ["m/gpu9"])], graph_path="g.json", topology_path="t.yaml")
    save(away, folder / "away.json")
    assert "'m/gpu9'" in one_line_error(run("simulate", folder / "away.json"))


def test_cyclic_order_exits_2(files):
    folder, g, t, p = files
    d = t.device_names[0]
    cyclic = plan(g, t, [one_group(g, [d])], order={d: ("op1", "op0", "op2")},
                  graph_path="g.json", topology_path="t.yaml")
    save(cyclic, folder / "cyclic.json")
    assert "cyclic" in one_line_error(run("simulate", folder / "cyclic.json"))


def test_deadlocking_schedule_exits_2(files):
    folder, g, t, p = files
    d0, d1 = t.device_names
    groups = [Group(id="s0", ops=("op0",), devices=(d0,)),
              Group(id="s1", ops=("op1", "op2"), devices=(d1,))]
    pipe = Pipeline(microbatches=2, stages=("s0", "s1"),
                    schedule={d0: "0F0 0B0 0F1 0B1", d1: "1F0 1F1 1B0 1B1"})
    save(plan(g, t, groups, pipeline=pipe, graph_path="g.json", topology_path="t.yaml"),
         folder / "dead.json")
    assert "cyclic" in one_line_error(run("simulate", folder / "dead.json"))


def _run_report(p, iteration_ms=(5.0, 4.0, 4.2, 4.4), cpu_ms=None):
    devices = sorted({d for g in p.groups for d in g.devices})
    return RunReport(
        plan_sha256=fingerprint(p), planner=p.planner, mode=ExecutionMode.DATA_PARALLEL,
        batch_size=p.batch_size, world_size=len(devices), ranks={d: i for i, d in enumerate(devices)},
        backend="gloo", steps=len(iteration_ms), warmup=1, iteration_ms=4.2,
        per_rank=tuple(RankRun(rank=i, device=d, iteration_ms=iteration_ms, compute_ms=3.0 + i,
                               wait_ms=1.0, cpu_ms=cpu_ms if i == 0 else None)
                       for i, d in enumerate(devices)))


def test_compare_sets_the_measured_run_beside_the_prediction(files):
    folder, g, t, p = files
    save(_run_report(p), folder / "run.json")
    result = run("simulate", folder / "plan.json", "--compare", folder / "run.json", "--json")
    assert result.exit_code == 0, result.output
    c = json.loads(result.stdout)["comparison"]
    predicted = simulate(p, g, t).iteration_ms
    assert c["measured_iteration_ms"] == 4.2
    assert c["predicted_iteration_ms"] == pytest.approx(predicted, abs=1e-6)
    assert c["error_fraction"] == pytest.approx(predicted / 4.2 - 1, abs=1e-5)
    assert c["measured_ms_by_device"] == {d: 4.2 for d in t.device_names}
    first, second = sorted(t.device_names)
    assert c["measured_compute_ms_by_device"] == {first: 3.0, second: 4.0}
    assert c["measured_wait_ms_by_device"] == {first: 1.0, second: 1.0}
    assert c.get("measured_cpu_ms_by_device", {}) == {}  # the run recorded none


def test_compare_prints_each_device_predicted_beside_measured(files):
    folder, g, t, p = files
    save(_run_report(p, cpu_ms=2.5), folder / "run.json")
    result = CliRunner().invoke(cli, ["simulate", str(folder / "plan.json"), "--compare",
                                      str(folder / "run.json")], terminal_width=200)
    assert result.exit_code == 0, result.output
    report = simulate(p, g, t).to_report()
    it = report.iteration_ms
    table = result.output.split("per device: predicted / measured")[1].split("└")[0]
    lines = {ln.split("│")[1].strip(): [c.strip() for c in ln.split("│")[2:-1]]
             for ln in table.splitlines() if ln.startswith("│")}
    first, second = sorted(t.device_names)
    busy = {d.device: d.busy_ms for d in report.devices}
    step, compute, waiting, cpu = lines[first]
    assert step == f"{it:.1f} / 4.2 ({100 * (it / 4.2 - 1):+.0f}%)"
    assert compute == f"{busy[first]:.1f} / 3.0 ({100 * (busy[first] / 3.0 - 1):+.0f}%)"
    assert waiting.startswith(f"{it - busy[first]:.1f} / 1.0")
    assert cpu == "- / 2.5"  # a simulated GPU: its cores do not carry the communication
    assert lines[second][1].startswith(f"{busy[second]:.1f} / 4.0") and lines[second][3] == "-"


def test_compare_with_another_plans_run_exits_2(files):
    folder, g, t, p = files
    other = plan(g, t, p.groups)  # the same groups, but no recorded paths: another fingerprint
    save(_run_report(other), folder / "run.json")
    line = one_line_error(run("simulate", folder / "plan.json", "--compare", folder / "run.json"))
    assert "run.json" in line and "plan sha256" in line


def test_compare_on_cpus_charges_their_communication_to_their_cores(tmp_path):
    g = chain(3, param_bytes=1 << 20, edge_bytes=1024)
    t = mesh(2, device_type="cpu", bandwidth_gbps=1.0)
    save(g, tmp_path / "g.json")
    save(t, tmp_path / "t.yaml")
    p = plan(g, t, [one_group(g, t.device_names)], graph_path="g.json", topology_path="t.yaml")
    save(p, tmp_path / "plan.json")
    save(_run_report(p, cpu_ms=2.5), tmp_path / "run.json")
    report = simulate(p, g, t).to_report()
    first = min(t.device_names)
    (usage,) = [d for d in report.devices if d.device == first]
    assert usage.host_driven and usage.comm_ms > 0  # the AllReduce of 3 MiB, on the cores
    gpus = simulate(*_files_on_gpus(tmp_path)).to_report()
    assert not any(d.host_driven for d in gpus.devices)
    result = CliRunner().invoke(cli, ["simulate", str(tmp_path / "plan.json"), "--compare",
                                      str(tmp_path / "run.json")], terminal_width=200)
    assert result.exit_code == 0, result.output
    table = result.output.split("per device: predicted / measured")[1].split("└")[0]
    row = next(ln for ln in table.splitlines() if ln.startswith(f"│ {first} "))
    cpu = row.split("│")[-2].strip()
    assert cpu.startswith(f"{usage.busy_ms + usage.comm_ms:.1f} / 2.5")


def _files_on_gpus(tmp_path):
    g = chain(3, param_bytes=1 << 20, edge_bytes=1024)
    t = mesh(2, bandwidth_gbps=1.0)
    return plan(g, t, [one_group(g, t.device_names)]), g, t


def _profiled_with(threads: int, tmp_path, cores: int | None = None):
    """A chain profiled on a CPU with ``threads`` threads, planned on two CPU devices (of
    ``cores`` cores each: the topology's default, one, when None)."""
    from dataclasses import replace as with_

    from dl_nfv.artifacts import ProfileInfo, from_data, to_data
    from dl_nfv.artifacts.topology import Topology

    g = with_(chain(3), profile=ProfileInfo(device_type="cpu", threads=threads))
    t = mesh(2, device_type="cpu")
    if cores is not None:
        data = to_data(t)
        data["hosts"][0]["devices"][0]["cores"] = cores
        t = from_data(Topology, data)
    save(g, tmp_path / "g.json")
    save(t, tmp_path / "t.yaml")
    p = plan(g, t, [one_group(g, t.device_names)], graph_path="g.json", topology_path="t.yaml")
    save(p, tmp_path / "plan.json")
    return g, t, p


def test_a_profile_of_other_threads_than_the_devices_cores_is_said_extrapolated(tmp_path):
    g, t, p = _profiled_with(2, tmp_path)
    result = run("simulate", tmp_path / "plan.json", "-o", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    devices = ", ".join(sorted(t.device_names))
    expected = (f"{devices} have 1 core, but the graph was profiled with 2 threads: their op "
                f"times are extrapolated (scaling: none: the op times are used as measured)")
    assert load(tmp_path / "r.json", expect="sim-report").notes == (expected,)
    shown = CliRunner().invoke(cli, ["simulate", str(tmp_path / "plan.json")], terminal_width=400)
    assert expected in " ".join(shown.output.split())  # the table on stdout carries it too
    from dl_nfv.planners import get

    planned = get("dp")(g, t, seed=0)
    assert expected in planned.notes


@pytest.mark.parametrize("threads, cores", [(1, None), (4, 4)])
def test_a_profile_matching_the_devices_cores_is_not_noted(tmp_path, threads, cores):
    _profiled_with(threads, tmp_path, cores)
    result = run("simulate", tmp_path / "plan.json", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout).get("notes", []) == []


def test_compare_with_a_run_on_another_graph_or_topology_names_it(files):
    from dataclasses import replace as with_

    folder, g, t, p = files
    run_of = _run_report(p)
    other_graph = chain(4, param_bytes=4096, edge_bytes=1024)
    cases = {
        "graph": with_(run_of, graph_sha256=fingerprint(other_graph), plan_sha256="b" * 64),
        "topology": with_(run_of, graph_sha256=p.graph_sha256,
                          topology_sha256=fingerprint(mesh(3)), plan_sha256="b" * 64),
        "plan": with_(run_of, graph_sha256=p.graph_sha256, topology_sha256=p.topology_sha256,
                      plan_sha256="b" * 64, planner="dp"),
    }
    expected = {
        "graph": f"the run is of another graph: its plan was made for graph sha256 "
                 f"{fingerprint(other_graph)[:12]}..., this plan for sha256 {p.graph_sha256[:12]}",
        "topology": f"the run is on another topology: its plan was made for topology sha256 "
                    f"{fingerprint(mesh(3))[:12]}..., this plan for sha256 "
                    f"{p.topology_sha256[:12]}",
        "plan": f"the run is of another plan: it executed a dp plan sha256 bbbbbbbbbbbb... (same "
                f"graph and topology), this is a hand plan sha256 {fingerprint(p)[:12]}",
    }
    for what, run_report in cases.items():
        save(run_report, folder / f"run-{what}.json")
        line = one_line_error(run("simulate", folder / "plan.json", "--compare",
                                  folder / f"run-{what}.json", "-o", folder / "r.json"))
        assert expected[what] in line, line
        assert f"run-{what}.json" in line and not (folder / "r.json").exists()


def test_compare_shows_each_devices_time_by_category(files):
    from dataclasses import replace as with_

    folder, g, t, p = files
    base = _run_report(p)
    breakdown = {"compute": (9.0, 3.0, 3.2, 2.8), "communication": (0.5, 0.6, 0.4, 0.7),
                 "update": (0.3, 0.2, 0.2, 0.2), "idle": (0.1, 0.2, 0.4, 0.7)}
    per_rank = tuple(with_(r, breakdown_ms=breakdown) for r in base.per_rank)
    save(with_(base, per_rank=per_rank), folder / "run.json")
    result = CliRunner().invoke(cli, ["simulate", str(folder / "plan.json"), "--compare",
                                      str(folder / "run.json")], terminal_width=200)
    assert result.exit_code == 0, result.output
    table = result.output.split("where the time goes per device")[1].split("└")[0]
    rows = {ln.split("│")[1].strip(): [c.strip() for c in ln.split("│")[2:-1]]
            for ln in table.splitlines() if ln.startswith("│")}
    simulated = simulate(p, g, t).breakdown_ms()
    # medians over the 3 measured steps (the first is warm-up)
    medians = {"compute": 3.0, "communication": 0.6, "update": 0.2, "idle": 0.4}
    for device in t.device_names:
        assert rows[device] == [
            f"{simulated[device][c]:.1f} / {medians[c]:.1f} "
            f"({100 * (simulated[device][c] / medians[c] - 1):+.0f}%)"
            for c in ("compute", "communication", "update", "idle")]


def test_a_trace_beside_a_run_without_a_timeline_exits_2(files):
    folder, g, t, p = files
    save(_run_report(p), folder / "run.json")  # no timeline recorded
    line = one_line_error(run("simulate", folder / "plan.json", "--compare", folder / "run.json",
                              "--trace", folder / "tr.json", "-o", folder / "r.json"))
    assert "recorded no timeline" in line
    assert not (folder / "tr.json").exists() and not (folder / "r.json").exists()
