"""``dl-nfv nfv actors``: bad cluster files and a dead switch are exit 2 naming them;
``up`` ends every process it started, on Ctrl-C and when starting fails."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from dl_nfv.cli.main import cli
from dl_nfv.nfv.actors.client import status
from dl_nfv.nfv.actors.cluster import load_cluster
from tests.processes import live_children

from .conftest import cluster_text, free_ports


def _run(*args: str):
    return CliRunner().invoke(cli, ["nfv", "actors", *args], prog_name="dl-nfv")


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("name: rt2", "name: rt1"), "runtime 'rt1' is named twice"),
    (lambda t, p=None: t.replace(t.split("rt3, address: ")[1].split("}")[0],
                                 t.split("rt2, address: ")[1].split("}")[0]),
     "runtime 'rt3' has the address"),
    (lambda t: t.replace('rt2, address: "127.0.0.1', 'rt2, address: "no-such-host.invalid'),
     "runtime 'rt2' is unreachable: host 'no-such-host.invalid' does not resolve"),
    (lambda t: t.replace("heartbeat_timeout_ms: 150", "heartbeat_timeout_ms: 15"),
     "at least 3 heartbeats"),
    (lambda t: t.replace("replication: true", "replicas: 2"), "unknown key 'replicas'"),
])
def test_a_bad_cluster_file_is_exit_2_naming_it(tmp_path, edit, words):
    path = tmp_path / "cluster.yaml"
    path.write_text(edit(cluster_text(free_ports(4))))
    result = _run("status", "--cluster", str(path))
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {path}") and words in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_dead_switch_is_exit_2_naming_it(cluster_file):
    result = _run("status", "--cluster", str(cluster_file))
    assert result.exit_code == 2
    assert "the switch 'switch' at 127.0.0.1:" in result.output and "not answering" in \
        result.output


def _actors_processes(cluster_file: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(cluster_file).encode() in cmd and b"dl_nfv.nfv.actors" in b" ".join(cmd) \
                and state != "Z":
            pids.append(int(entry.name))
    return pids


def _up(cluster_file: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dl_nfv", "nfv", "actors", "up", "--cluster",
                             str(cluster_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_up_stops_every_process_on_ctrl_c(cluster_file):
    spec = load_cluster(cluster_file)
    up = _up(cluster_file)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if all(r["joined"] for r in status(spec)["runtimes"].values()):
                    break
            except Exception:
                assert up.poll() is None and time.monotonic() < deadline, up.stderr.read()
        children = live_children(up.pid)
        assert sorted(children) == sorted(_actors_processes(cluster_file))
        assert len(children) == 4, children
        up.send_signal(signal.SIGINT)
        code = up.wait(timeout=30)
        err = up.stderr.read()
        assert code == 130 and "interrupted" in err, (code, err)
        assert _actors_processes(cluster_file) == []
    finally:
        up.kill()
        up.wait()


def test_up_that_cannot_start_a_runtime_stops_the_rest(cluster_file):
    spec = load_cluster(cluster_file)
    busy = socket.socket()
    busy.bind(("127.0.0.1", int(spec.member("rt2").address.rsplit(":", 1)[1])))
    busy.listen()
    try:
        up = _up(cluster_file)
        _, err = up.communicate(timeout=60)
        assert up.returncode == 2, err
        assert err.startswith("error: rt2 exited while starting") and "rt2: cannot listen" in err
        assert _actors_processes(cluster_file) == []
    finally:
        busy.close()


def test_replay_folder_holds_only_what_the_chain_produced(tmp_path, cluster_file):
    """``replay -o`` writes report.json and outputs.jsonl only, byte-identical for a run with
    a runtime killed midway; how the run went goes to --stats."""
    from dl_nfv.nfv.actors.chain import chain_document
    from dl_nfv.nfv.actors.client import Action, replay
    from dl_nfv.nfv.actors.processes import ClusterProcesses
    from dl_nfv.nfv.actors.report import replay_report, write_replay
    from dl_nfv.nfv.actors.traffic import interleaved
    from tests.conftest import EXAMPLES

    chain = EXAMPLES / "nf" / "fw-nat-lb.yaml"
    spec = load_cluster(cluster_file)
    with ClusterProcesses(cluster_file, spec):
        result = _run("replay", "--cluster", str(cluster_file), "--flows", "60",
                      "--packets-per-flow", "12", "--chain", str(chain), "-o",
                      str(tmp_path / "ok"), "--stats", str(tmp_path / "stats.json"))
        assert result.exit_code == 0, result.output
        assert result.output == ""  # -o: stdout stays empty
        killed = replay(spec, interleaved(60, 12, 0), chain_document(chain), rate_pps=1500,
                        window=256, batch=8, actions=(Action(300, "kill", "rt2"),))
        assert killed["status"]["runtimes"]["rt2"]["live"] is False
        write_replay(killed, replay_report(killed, "generated: 60 flows, seed 0"),
                     tmp_path / "killed")
    files = sorted(p.name for p in (tmp_path / "ok").iterdir())
    assert files == ["outputs.jsonl", "report.json"]
    for name in files:
        assert (tmp_path / "ok" / name).read_bytes() == (tmp_path / "killed" / name).read_bytes()
    report = json.loads((tmp_path / "ok" / "report.json").read_text())
    assert (report["packets"], report["lost"], report["duplicates"]) == (720, 0, 0)
    assert len((tmp_path / "ok" / "outputs.jsonl").read_text().splitlines()) == 720
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["kind"] == "actors-run" and stats["packets_per_s"] > 0
    assert stats["latency_us"]["p50"] <= stats["latency_us"]["p99"]
    assert set(stats["status"]["runtimes"]) == {"rt1", "rt2", "rt3"}


def test_up_restarts_a_runtime_that_died_and_it_rejoins_at_the_next_replay(cluster_file):
    from dl_nfv.nfv.actors.chain import chain_document
    from dl_nfv.nfv.actors.client import fail, replay
    from dl_nfv.nfv.actors.traffic import interleaved
    from tests.conftest import EXAMPLES

    from .conftest import sequential

    spec = load_cluster(cluster_file)
    document = chain_document(EXAMPLES / "nf" / "fw-nat-lb.yaml")
    packets = interleaved(30, 6, seed=4)
    outputs, states = sequential(packets, document)
    up = _up(cluster_file)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if all(r["joined"] for r in status(spec)["runtimes"].values()):
                    break
            except Exception:
                assert up.poll() is None and time.monotonic() < deadline, up.stderr.read()
        replay(spec, packets, document)
        old = fail(spec, "rt2")["pid"]
        deadline = time.monotonic() + 30
        while not (view := status(spec)["runtimes"]["rt2"])["standby"]:
            assert time.monotonic() < deadline, view
            time.sleep(0.1)
        assert view["pid"] != old and not view["live"]
        result = replay(spec, packets, document)
        assert result["outputs"] == outputs and result["states"] == states
        runtimes = result["status"]["runtimes"]
        assert runtimes["rt2"]["live"] and runtimes["rt2"]["flows"] == 10
        assert sum(r["replicas"] for r in runtimes.values()) == 30
        assert len(_actors_processes(cluster_file)) == 4  # the killed one is gone
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=30) == 130
        assert "up: restarted rt2" in up.stderr.read()
        assert _actors_processes(cluster_file) == []
    finally:
        up.kill()
        up.wait()
