"""``dl-nfv nfv netstar``: a run end to end, and one-line exit-2 answers to bad input."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from dl_nfv.cli.main import cli
from dl_nfv.nfv.netstar.servers import free_port
from tests.nfv.helpers import EXAMPLES, REAL_TRACE


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_run_writes_a_report(tmp_path):
    out = tmp_path / "r.json"
    r = invoke("nfv", "netstar", "run", "--config", EXAMPLES / "netstar-ids.yaml", "--trace",
               REAL_TRACE, "--style", "callback", "-o", out)
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    assert report["kind"] == "netstar-report" and report["style"] == "callback"
    assert report["messages"] == 58 and report["alerts"]
    assert {a["nf"] for a in report["alerts"]} == {"ids"}


def test_show_renders_a_report_and_a_bench(tmp_path):
    """Both files NetStar writes are typed artifacts: they load as records and `show` renders
    their figures (each NF's alert count, each style's lines of code)."""
    from dl_nfv.artifacts import load

    report_path, bench_path = tmp_path / "r.json", tmp_path / "b.json"
    assert invoke("nfv", "netstar", "run", "--config", EXAMPLES / "netstar-ids.yaml", "--trace",
                  REAL_TRACE, "-o", report_path).exit_code == 0
    assert invoke("nfv", "netstar", "bench", "--config", EXAMPLES / "netstar-ids.yaml", "--trace",
                  REAL_TRACE, "--styles", "async,callback", "--store-latency-ms", "0",
                  "--repeats", "1", "-o", bench_path).exit_code == 0
    report, bench = load(report_path), load(bench_path)
    assert report.outputs["ids"].alerts == len(report.alerts) > 0
    assert bench.outputs_identical and [r.store_latency_ms for r in bench.throughput] == [0]
    shown = invoke("show", report_path, "--width", 200).stdout
    assert f"alerts ({len(report.alerts)})" in shown and report.alerts[0].msg in shown
    shown = invoke("show", bench_path, "--width", 200).stdout
    total = bench.lines["async"]["total"]
    assert re.search(rf"total\s*│\s*{total}\s*│", shown), shown


def _bad(tmp_path, *args, config="netstar-ids.yaml"):
    out = tmp_path / "r.json"
    out.write_text("before")
    r = invoke("nfv", "netstar", "run", "--config",
               config if not isinstance(config, str) else EXAMPLES / config,
               "--trace", REAL_TRACE, *args, "-o", out)
    assert r.exit_code == 2, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert out.read_text() == "before"
    return r.stderr


def test_unreachable_store_names_the_address(tmp_path):
    port = free_port()
    err = _bad(tmp_path, "--store", f"redis://127.0.0.1:{port}")
    assert f"127.0.0.1:{port}" in err


def test_unreachable_dns_names_the_address(tmp_path):
    port = free_port()
    err = _bad(tmp_path, "--dns", f"127.0.0.1:{port}", config="netstar-malware.yaml")
    assert f"127.0.0.1:{port}" in err


@pytest.mark.parametrize("store", ["redis://127.0.0.1:notaport", "redis://", "memcached://x:1",
                                   "redis://127.0.0.1:6379/zero"])
def test_malformed_store_url(tmp_path, store):
    assert "--store" in _bad(tmp_path, "--store", store)


def test_malformed_zone(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("kind: nf-config\nschema_version: 1\nname: bad\nchain:\n"
                      "  - nf: malware\n    zone: bad..zone\n")
    assert "zone" in _bad(tmp_path, "--dns", "127.0.0.1:53", config=config)


def test_missing_dns_and_non_netstar_nf(tmp_path):
    assert "--dns" in _bad(tmp_path, config="netstar-urlfilter.yaml")
    assert "monitor" in _bad(tmp_path, config="ids.yaml")


def test_bench_counts_lines_and_checks_outputs(tmp_path):
    out = tmp_path / "b.json"
    r = invoke("nfv", "netstar", "bench", "--config", EXAMPLES / "netstar-nat.yaml", "--flows", 20,
               "--styles", "async,callback,blocking", "--store-latency-ms", "0,0.5",
               "--repeats", 1, "-o", out)
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    assert result["kind"] == "netstar-bench" and result["outputs_identical"]
    assert [row["store_latency_ms"] for row in result["throughput"]] == [0.0, 0.5]
    for row in result["throughput"]:
        assert set(row["messages_per_s"]) == {"async", "callback", "blocking"}
    lines = result["lines"]
    assert lines["async"]["total"] == sum(v for k, v in lines["async"].items() if k != "total")
    assert lines["async"]["total"] < lines["callback"]["total"]
