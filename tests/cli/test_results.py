"""The result artifacts and trace summaries ``show`` renders, and the refusal to write NaN."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner
from rich.console import Console

from dl_nfv.artifacts import InvalidArtifact, dumps, from_data, load, save
from dl_nfv.artifacts.chrome_trace import summarise_trace
from dl_nfv.artifacts.errors import NonFiniteNumber, UnwritableOutput
from dl_nfv.artifacts.results import NfvBench, PlanComparison
from dl_nfv.cli.main import cli
from dl_nfv.cli.render_compare import render_bench

ROWS = [{"planner": "dp", "feasible": True, "iteration_ms": 2.0, "speedup_vs_dp": 1.0},
        {"planner": "pipeline", "feasible": True, "iteration_ms": 1.25, "stages": 2},
        {"planner": "single", "feasible": False, "error": "does not fit"}]


def _bench(device: str, share: float) -> NfvBench:
    return from_data(NfvBench, {
        "trace": "t.pcap", "messages": 10, "flows": 2, "payload_bytes": 100,
        "outputs_identical": True,
        "engines": [{"engine": "gpu", "gbps": 1.0, "messages_per_s": 5.0, "elapsed_s": 2.0,
                     "gpu_message_share": share, "batches": 1, "device": device, "workers": 0,
                     "alerts": 0}]})


def test_a_comparison_round_trips_in_json_and_yaml(tmp_path):
    result = from_data(PlanComparison, {"graph": "mlp", "topology": "t", "rows": ROWS})
    for name in ("cmp.json", "cmp.yaml"):
        save(result, tmp_path / name)
        assert load(tmp_path / name, expect="plan-comparison") == result
    shown = CliRunner().invoke(cli, ["show", str(tmp_path / "cmp.yaml")])
    assert shown.exit_code == 0
    assert "infeasible: does not fit" in shown.stdout and "1.25" in shown.stdout


def test_a_row_without_a_reason_or_twice_is_refused():
    with pytest.raises(InvalidArtifact, match="infeasible row must say why"):
        from_data(PlanComparison, {"graph": "g", "topology": "t",
                                   "rows": [{"planner": "dp", "feasible": False}]})
    with pytest.raises(InvalidArtifact, match="duplicate planner 'dp'"):
        from_data(PlanComparison, {"graph": "g", "topology": "t", "rows": ROWS[:1] * 2})


@pytest.mark.parametrize("device,share,says", [("cpu", 1.0, True), ("cpu", 0.0, False),
                                               ("cuda:0", 0.7, False)])
def test_a_bench_says_when_the_gpu_path_used_no_gpu(device, share, says):
    out = Console(width=300, record=True, file=None)
    out.print(render_bench(_bench(device, share)))
    assert ("no GPU used" in out.export_text()) is says


def test_a_trace_summary_counts_every_track():
    """Two devices' compute tracks, a link and a counter, by hand: counts, busy time, span."""
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "m/gpu0"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "compute"}},
            {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "m/gpu1"}},
            {"ph": "M", "name": "thread_name", "pid": 2, "tid": 1, "args": {"name": "compute"}}]
    events = [{"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
              {"ph": "X", "pid": 1, "tid": 1, "ts": 1500, "dur": 500},
              {"ph": "X", "pid": 2, "tid": 1, "ts": 1000, "dur": 2500},
              {"ph": "X", "pid": 10, "tid": 3, "ts": 200, "dur": 100},
              {"ph": "C", "pid": 1, "name": "memory", "ts": 4000, "args": {"bytes": 1}}]
    summary = summarise_trace({"traceEvents": meta + events})
    tracks = {(t.process, t.thread): t for t in summary.tracks}
    assert set(tracks) == {("m/gpu0", "compute"), ("m/gpu1", "compute"), ("10", "3"),
                           ("m/gpu0", "memory (counter)")}
    gpu0 = tracks[("m/gpu0", "compute")]
    assert (gpu0.events, gpu0.busy_ms, gpu0.first_ms, gpu0.last_ms) == (2, 1.5, 0.0, 2.0)
    assert tracks[("m/gpu1", "compute")].busy_ms == 2.5
    assert summary.events == 5 and (summary.start_ms, summary.end_ms) == (0.0, 4.0)
    assert [t.process for t in summary.tracks] == ["m/gpu0", "m/gpu0", "m/gpu1", "10"]


def test_no_file_is_written_with_nan_or_infinity(tmp_path):
    """Records refuse NaN when built; data that reaches ``save`` holding one is refused there."""
    data = {"kind": "nfv-bench", "engines": [{"engine": "gpu", "gbps": math.nan}]}
    for name in ("b.json", "b.yaml"):
        path = tmp_path / name
        path.write_text("before\n")
        with pytest.raises(NonFiniteNumber, match=r"engines\[0\]\.gbps"):
            save(data, path)
        assert path.read_text() == "before\n"
    with pytest.raises(NonFiniteNumber, match=r"x\[1\]"):
        dumps({"x": [1.0, -math.inf]})


def test_an_unwritable_output_names_the_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UnwritableOutput, match=r"file/x.json: cannot write: Not a directory"):
        save(_bench("cpu", 0.0), blocker / "x.json")
    with pytest.raises(UnwritableOutput, match=r"/proc/.*cannot write"):
        save(_bench("cpu", 0.0), "/proc/dl-nfv-test.json")
