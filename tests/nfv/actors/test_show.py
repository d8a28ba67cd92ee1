"""``dl-nfv show`` renders the actors documents: the cluster file, a replay's report and
measurements, and the bench's; a document missing what it renders is exit 2 naming it."""

from __future__ import annotations

import json

from click.testing import CliRunner

from dl_nfv.cli.main import cli
from tests.conftest import EXAMPLES

STATUS = {"switch": "switch", "flows": 60, "replication": True, "lost_flows": 0, "events": [
    {"runtime": "rt2", "detection_ms": 151.0, "takeover_ms": 7.25, "promoted": 20,
     "rereplicated": 20},
    {"migration": {"mode": "actor", "source": "rt1", "destination": "rt3", "flows": 5,
                   "completion_ms": 1.5, "failed": "runtime 'rt3' died"}}],
    "runtimes": {name: {"live": name != "rt2", "joined": True, "pid": pid, "flows": flows,
                        "replicas": flows, "unacked_packets": 0, "processed": 10 * flows}
                 for name, pid, flows in (("rt1", 101, 30), ("rt2", 102, 0), ("rt3", 103, 30))}}


def _show(path) -> str:
    result = CliRunner().invoke(cli, ["show", str(path), "--width", "240"])
    assert result.exit_code == 0, result.output
    return result.output


def test_show_the_cluster_file():
    out = _show(EXAMPLES / "nf" / "actors-local.yaml")
    assert "3 runtimes, replication on, heartbeat 20 ms, declared dead after 300 ms" in out
    assert "rt2" in out and "127.0.0.1:5702" in out and "127.0.0.1:5700" in out


def test_show_a_replay_report_and_its_run(tmp_path):
    report = {"kind": "actors-replay", "source": "t.pcap", "packets": 720, "passed": 600,
              "dropped": {"firewall:acl": 84, "firewall:no_conn": 36}, "flows": 60, "lost": 0,
              "duplicates": 0, "reordered": 0, "digest": "ab12"}
    (tmp_path / "report.json").write_text(json.dumps(report))
    out = _show(tmp_path / "report.json")
    assert "actors-replay of t.pcap" in out
    assert "720" in out and "600" in out and "120" in out  # 84 + 36 dropped
    assert "firewall:acl 84, firewall:no_conn 36" in out and "ab12" in out
    run = {"kind": "actors-run", "wall_s": 0.5, "packets_per_s": 1440.0,
           "latency_us": {"p50": 210.0, "p90": 400.0, "p99": 950.0, "max": 2000.0},
           "migrations": [], "status": STATUS}
    (tmp_path / "run.json").write_text(json.dumps(run))
    out = _show(tmp_path / "run.json")
    assert "0.50 s, 1440 packets/s" in out and "p50 210, p90 400, p99 950, max 2000" in out
    assert "rt2 declared dead after 151 ms; takeover 7.2 ms" in out
    assert "migrated 5 flows rt1 -> rt3 (actor) in 1.5 ms: failed, runtime 'rt3' died" in out


def test_show_a_bench_report(tmp_path):
    bench = {"kind": "actors-bench", "speedup": 12.5, "speedup_flows": 500, "packets": 2000,
             "runtimes": 2, "live": ["rt2", "rt3"],
             "throughput": {"no_replication": {"packets_per_s": 40000.0, "per_runtime": 20000.0},
                            "replication": {"packets_per_s": 30000.0, "per_runtime": 15000.0}},
             "latency_us": {"no_replication": {"p50": 300.0, "p99": 800.0, "runs": []},
                            "replication": {"p50": 420.0, "p99": 1100.0,
                                            "runs": [{}, {}, {}]},
                            "added": {"p50": {"median": 120.0, "min": 80.0, "max": 150.0},
                                      "p99": {"median": 300.0, "min": -50.0, "max": 700.0}}},
             "latency_rate_pps": 1000, "migration": [
                 {"flows": 500, "mode": "actor", "completion_ms": 2.0},
                 {"flows": 500, "mode": "central", "completion_ms": 25.0}],
             "recovery_skipped": "recovery needs a third live runtime"}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    out = _show(tmp_path / "bench.json")
    assert "2000 packets, 2 runtimes" in out and "40000" in out and "15000" in out
    assert "replication adds 300 us at p99 (median of 3 pairs, -50 to 700)" in out
    assert "12.5x" in out and "25.0" in out
    assert "actor migration 12.5x faster than central at 500 flows" in out
    assert "recovery not measured: recovery needs a third live runtime" in out


def test_show_an_actors_document_missing_a_field(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"kind": "actors-replay", "source": "t.pcap", "packets": 1}))
    result = CliRunner().invoke(cli, ["show", str(path)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {path}: passed: missing"
    path.write_text(json.dumps({"kind": "actors-other"}))
    result = CliRunner().invoke(cli, ["show", str(path), "--json"])
    assert result.exit_code == 2 and "unknown kind 'actors-other'" in result.output
