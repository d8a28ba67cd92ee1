"""The `dl-nfv nfv` commands end to end, and their answers to bad input."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dl_nfv.artifacts import dumps, load
from dl_nfv.cli.main import cli

from .helpers import EXAMPLES, REAL_TRACE, RULES


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_gen_inspect_run_show(tmp_path):
    pcap = tmp_path / "s.pcap"
    r = invoke("nfv", "gen-trace", "--flows", 40, "--size-dist", "zipf:1.2", "-o", pcap)
    assert r.exit_code == 0 and pcap.stat().st_size > 1000
    r = invoke("nfv", "inspect", pcap, "--json")
    summary = json.loads(r.output)
    assert summary["flows"] == 40 and summary["applications"] == {"http": 40}
    assert summary["message_kinds"]["http_request"] == summary["message_kinds"]["http_response"]
    reports = {}
    for engine in ("cpu", "flowshader"):
        out = tmp_path / f"r-{engine}.json"
        r = invoke("nfv", "run", "--config", EXAMPLES / "firewall.yaml", "--trace", pcap,
                   "--engine", engine, "--batch-size", 64, "-o", out)
        assert r.exit_code == 0, r.output
        reports[engine] = load(out, expect="nfv-report")
        assert load(out) == reports[engine]  # load -> save -> load is identity
        assert dumps(reports[engine]) == out.read_text()
    a, b = reports["cpu"], reports["flowshader"]
    assert a.alerts == b.alerts and a.outputs.http.digest == b.outputs.http.digest
    assert a.messages == summary["messages"] and a.flows == 40 and a.engine == "cpu"
    assert a.outputs.monitor.messages + a.outputs.firewall.dropped_messages == a.messages
    assert sum(s.messages for s in a.batches) == a.messages
    r = invoke("show", tmp_path / "r-flowshader.json", "--width", 120)
    assert r.exit_code == 0 and "nfv-report" in r.output and "GPU path took" in r.output


def test_run_on_real_trace_json_alert_fields():
    r = invoke("nfv", "run", "--config", EXAMPLES / "ids.yaml", "--trace", REAL_TRACE,
               "--engine", "gpu", "--json")
    report = json.loads(r.output)
    assert report["alerts"], report
    alert = report["alerts"][0]
    assert set(alert) == {"sid", "msg", "flow", "message_index"}
    assert set(alert["flow"]) == {"proto", "src", "sport", "dst", "dport"}
    assert {a["sid"] for a in report["alerts"]} == {1000001, 1000002, 1000003, 1000005, 1000008}


def test_bench_command(tmp_path):
    r = invoke("nfv", "bench", "--config", EXAMPLES / "http-lb.yaml", "--trace", REAL_TRACE,
               "--engines", "cpu,gpu,flowshader", "--json")
    assert r.exit_code == 0, r.output
    result = json.loads(r.output)
    assert [e["engine"] for e in result["engines"]] == ["cpu", "gpu", "flowshader"]
    assert result["outputs_identical"] is True


def _bad(tmp_path, *args):
    r = CliRunner().invoke(cli, [str(a) for a in args])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output
    return lines[0]


def test_bad_inputs_exit_2_with_one_line(tmp_path):
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(bytes(range(256)) * 4)
    ids = EXAMPLES / "ids.yaml"
    msg = _bad(tmp_path, "nfv", "run", "--config", ids, "--trace", junk, "--engine", "cpu")
    assert "junk.pcap: not a pcap or pcapng file" in msg
    assert "unknown engine 'warp'" in _bad(tmp_path, "nfv", "run", "--config", ids, "--trace",
                                           REAL_TRACE, "--engine", "warp")
    assert "fixed:X must be in [0, 1]" in _bad(tmp_path, "nfv", "run", "--config", ids,
                                               "--trace", REAL_TRACE, "--engine", "fixed:1.5")
    cfg = tmp_path / "bad-nf.yaml"
    cfg.write_text("kind: nf-config\nschema_version: 1\nname: x\nchain:\n  - nf: dpi\n")
    msg = _bad(tmp_path, "nfv", "run", "--config", cfg, "--trace", REAL_TRACE)
    assert "bad-nf.yaml" in msg and "chain[0].nf" in msg and "'dpi'" in msg
    rules = tmp_path / "bad.rules"
    rules.write_text(RULES.read_text() + 'alert tcp any any -> any 80 (content:"x"; pcre:"/x/"; '
                                         'sid:7;)\n')
    cfg = tmp_path / "bad-rules.yaml"
    cfg.write_text(f"kind: nf-config\nschema_version: 1\nname: x\nchain:\n  - nf: ids\n"
                   f"    rules: {rules}\n")
    msg = _bad(tmp_path, "nfv", "run", "--config", cfg, "--trace", REAL_TRACE)
    line = len(RULES.read_text().splitlines()) + 1  # the line appended above
    assert f"{rules}:{line}: unsupported option 'pcre'" in msg
    msg = _bad(tmp_path, "nfv", "gen-trace", "--flows", 10, "--size-dist", "lognormal", "-o",
               tmp_path / "x.pcap")
    assert "unknown distribution 'lognormal'" in msg
    cfg = tmp_path / "fw.yaml"
    cfg.write_text("kind: nf-config\nschema_version: 1\nname: x\nchain:\n  - nf: firewall\n"
                   "    acl: [{action: deny, src: 10.0.0.300/8}]\n")
    msg = _bad(tmp_path, "nfv", "run", "--config", cfg, "--trace", REAL_TRACE)
    assert "chain[0].acl[0]" in msg and "10.0.0.300/8" in msg


@pytest.mark.parametrize("command", ["gen-trace", "inspect", "run", "bench"])
def test_help_has_example(command):
    r = invoke("nfv", command, "--help")
    assert r.exit_code == 0 and "Example:" in r.output


def test_large_batches_through_the_worker_pipes_do_not_deadlock(tmp_path):
    """Blocks and result tables bigger than a pipe buffer, with batch k+1 queued before k
    is collected: the engine must finish (run in a subprocess with a time limit)."""
    import subprocess
    import sys

    pcap = tmp_path / "big.pcap"
    assert invoke("nfv", "gen-trace", "--flows", 300, "--size-dist", "uniform", "-o",
                  pcap).exit_code == 0
    cmd = [sys.executable, "-m", "dl_nfv", "nfv", "run", "--config",
           str(EXAMPLES / "http-lb.yaml"), "--trace", str(pcap), "--engine", "cpu",
           "--batch-size", "1024", "--workers", "1", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outputs"]["http"]["requests"] > 1024


def test_throughput_is_end_to_end_with_its_stages(tmp_path):
    """gbps and messages/s are over wall_s, which covers every stage, reading included."""
    out = tmp_path / "r.json"
    r = CliRunner().invoke(cli, ["nfv", "run", "--config", str(EXAMPLES / "ids.yaml"),
                                 "--trace", str(REAL_TRACE), "--engine", "cpu", "--workers", "1",
                                 "-o", str(out)])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    stages = report["stages_s"]
    assert set(stages) == {"read", "decode", "flows", "setup", "startup", "nfs", "report"}
    assert all(v >= 0 for v in stages.values())
    assert sum(stages.values()) == pytest.approx(report["wall_s"], abs=5e-3)
    assert report["parse_s"] == pytest.approx(stages["read"] + stages["decode"] + stages["flows"],
                                              abs=5e-3)
    assert report["gbps"] == pytest.approx(report["payload_bytes"] * 8 / report["wall_s"] / 1e9,
                                           rel=1e-3)
    assert report["messages_per_s"] == pytest.approx(report["messages"] / report["wall_s"],
                                                     rel=1e-3)


def test_run_as_a_process_ends_without_teardown_and_keeps_its_output(tmp_path):
    """`nfv run` ends its process with os._exit once the report is out: stdout flushed in
    full, exit code 0, the written report the one an in-process run writes; a failure still
    exits 2 with one line."""
    import subprocess
    import sys

    args = ["nfv", "run", "--config", str(EXAMPLES / "ids.yaml"), "--trace", str(REAL_TRACE),
            "--engine", "cpu", "--workers", "1"]
    out = subprocess.run([sys.executable, "-m", "dl_nfv", *args, "--json"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    report = tmp_path / "r.json"
    assert invoke(*args, "-o", report).exit_code == 0
    assert printed["outputs"] == json.loads(report.read_text())["outputs"]
    bad = subprocess.run([sys.executable, "-m", "dl_nfv", *args[:4], "--trace",
                          str(tmp_path / "none.pcap")], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "none.pcap" in bad.stderr


def test_run_config_collects_no_garbage_and_restores_the_collector(monkeypatch):
    """``run_config`` runs with the cyclic collector off and leaves it as it found it."""
    import gc

    from dl_nfv.nfv import run as nfv_run

    seen = []
    original = nfv_run._run
    monkeypatch.setattr(nfv_run, "_run", lambda *a: seen.append(gc.isenabled()) or original(*a))
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            report = nfv_run.run_config(EXAMPLES / "ids.yaml", REAL_TRACE, engine="cpu",
                                        workers=1)
            assert gc.isenabled() == enabled and report.packets > 0
        finally:
            gc.enable()
    assert seen == [False, False]
