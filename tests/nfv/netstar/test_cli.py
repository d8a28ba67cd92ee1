"""``dl-nfv nfv netstar``: a run end to end, and one-line exit-2 answers to bad input."""

from __future__ import annotations

import json

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
