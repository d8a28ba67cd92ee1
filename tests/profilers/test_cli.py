"""`dl-nfv profile ...` through click: files written, exit codes and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dl_nfv.artifacts import load
from dl_nfv.cli.main import cli
from dl_nfv.profilers.allocator import keep_freed_memory
from dl_nfv.profilers.rounds import MAX_ROUND_FACTOR
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data"

USER_MODEL = """
import torch, torch.nn as nn
class TwoBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
        self.b = nn.Linear(32, 16)
        self.out = nn.Linear(32, 4)
    def forward(self, x):
        return self.out(torch.cat([self.a(x), self.b(x)], dim=-1))
def build(): return TwoBranch()
def boom(): raise RuntimeError("boom")
class Loopy(nn.Module):
    def forward(self, x):
        for row in x:
            x = x + row
        return x
def loopy(): return Loopy()
"""


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def user_model(tmp_path):
    path = tmp_path / "user_model.py"
    path.write_text(USER_MODEL)
    return path


def test_models_lists_the_zoo_with_sizes():
    result = run("profile", "models", "--json")
    assert result.exit_code == 0
    rows = {r["name"]: r for r in json.loads(result.output)["models"]}
    assert rows["resnet50"]["parameters"] == 25_557_032
    assert rows["gpt2-xl"]["default_granularity"] == "layer"
    assert "mlp-tiny" not in rows
    table = run("profile", "models")
    for word in ("resnet50", "vgg19", "inception-v3", "bert-large", "gpt2-xl", "mobilenet-v2",
                 "transformer", "gnmt"):
        assert word in table.output


def test_profile_a_zoo_model_to_a_file(tmp_path):
    out = tmp_path / "g.json"
    result = run("profile", "model", "resnet50-tiny", "--batch-size", "2", "--repeats", "1", "--span", "0",
                 "--warmup", "0", "--threads", "1", "--granularity", "layer", "-o", str(out))
    assert result.exit_code == 0, result.output
    graph = load(out, expect="op-graph")
    assert graph.model.batch_size == 2 and graph.granularity.value == "layer"
    # --repeats is the least number of rounds; more while the medians are not yet stable
    assert graph.profile.threads == 1 and 1 <= graph.profile.repeats <= MAX_ROUND_FACTOR
    assert graph.profile.allocator == keep_freed_memory()  # the heap policy it timed under
    assert result.output == ""  # nothing on stdout when writing a file


def test_profile_a_user_model_by_path(user_model):
    result = run("profile", "model", f"{user_model}:build", "--input-shape", "8,32",
                 "--repeats", "1", "--span", "0", "--warmup", "0", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["kind"] == "op-graph" and len(doc["ops"]) >= 6 and len(doc["edges"]) >= 6


@pytest.mark.parametrize("args,message", [
    (["no-such-model-xyz"], "unknown model 'no-such-model-xyz'"),
    (["{m}:build", "--input-shape", "8,31"], "failed on inputs [8, 31] float32: RuntimeError: mat1 and mat2"),
    (["{m}:boom", "--input-shape", "1,3"], "calling it raised RuntimeError: boom"),
    (["{m}:loopy", "--input-shape", "2,3"], "cannot capture the model with torch.fx"),
    (["{m}:nope", "--input-shape", "2,3"], "has no attribute 'nope'"),
    (["{m}:build"], "give its input shape(s) with --input-shape"),
    (["{m}:build", "--input-shape", "8,a"], "expected comma-separated positive integers"),
    (["resnet50", "--seq-len", "4"], "takes images, not sequences"),
    (["mlp-tiny", "--repeats", "0"], "'--repeats': 0 is not in the range x>=1"),
    (["mlp-tiny", "--device-type", "Z80"], "not in the catalog"),
    (["mlp-tiny", "--leaf", "nothing"], "--leaf 'nothing'"),
    (["missing_file.py:build", "--input-shape", "1,2"], "no such file"),
])
def test_bad_input_exits_2_with_one_line(user_model, tmp_path, args, message):
    args = [a.replace("{m}", str(user_model)) for a in args]
    result = run("profile", "model", *args, "-o", str(tmp_path / "x.json"))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "x.json").exists()


def test_import_commands(tmp_path):
    out = tmp_path / "pd.json"
    result = run("profile", "import", "pipedream", str(DATA / "profile_pipedream_graph.txt"),
                 "--batch-size", "64", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert len(load(out).ops) == 9
    out = tmp_path / "pl.json"
    result = run("profile", "import", "placement-json", str(DATA / "profile_placement.json"),
                 "--device-type", "T4", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert load(out).profile.device_type == "T4"
    shown = run("show", str(out))
    assert shown.exit_code == 0 and "lstm1" in shown.output


def test_malformed_import_files_exit_2(tmp_path):
    bad = tmp_path / "graph.txt"
    bad.write_text("node1 -- Input -- forward_compute_time=x\n")
    result = run("profile", "import", "pipedream", str(bad), "-o", str(tmp_path / "o.json"))
    assert result.exit_code == 2 and f"{bad}: line 1:" in result.output
    bad = tmp_path / "w.json"
    bad.write_text("{not json")
    result = run("profile", "import", "placement-json", str(bad), "-o", str(tmp_path / "o.json"))
    assert result.exit_code == 2 and "invalid JSON at line 1" in result.output
    result = run("profile", "import", "pipedream", str(tmp_path / "none.txt"))
    assert result.exit_code == 2 and "no such file" in result.output


def test_network_probe_writes_a_topology_that_show_renders(tmp_path):
    out, report = tmp_path / "net.yaml", tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "dl_nfv", "profile", "network", "--nprocs", "2",
                           "--max-bytes", str(256 * 1024), "--repeats", "3", "--warmup", "1",
                           "-o", str(out), "--report", str(report)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    topo = load(out, expect="topology")
    assert len(topo.device_names) == 2
    ic = topo.hosts[0].interconnect
    assert ic.kind.value == "loopback" and ic.bandwidth_gbps > 0 and ic.latency_us >= 0
    data = json.loads(report.read_text())
    assert data["sizes_bytes"] == [1024, 4096, 16384, 65536, 262144]
    assert len(data["p2p_one_way_s"]["0-1"]) == 5 and len(data["allreduce_s"]) == 5
    # the CPU per message, per size (least over the messages), and its fit
    assert len(data["p2p_cpu_per_message_s"]["0-1"]) == 5
    assert min(data["p2p_cpu_per_message_s"]["0-1"]) > 0
    assert ic.message_cpu_us is not None and ic.message_cpu_us >= 0
    # every process measured its memory bandwidth; the devices carry the median
    assert len(data["memory_gb_per_s"]) == 2 and min(data["memory_gb_per_s"]) > 0
    assert topo.hosts[0].devices[0].memory_bandwidth_gb_per_s > 0
    shown = run("show", str(out))
    assert shown.exit_code == 0 and "loopback" in shown.output


def test_network_rejects_impossible_settings():
    result = run("profile", "network", "--nprocs", "1")
    assert result.exit_code == 2 and "--nprocs must be >= 2" in result.output
    result = run("profile", "network", "--min-bytes", "4096", "--max-bytes", "8192")
    assert result.exit_code == 2 and "at least two sizes" in result.output


def test_network_probe_under_torchrun(tmp_path):
    out = tmp_path / "net.yaml"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "-m", "dl_nfv", "profile", "network",
                           "--max-bytes", "16384", "--repeats", "2", "-o", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    topo = load(out, expect="topology")
    assert len(topo.device_names) == 2 and topo.hosts[0].interconnect.bandwidth_gbps > 0
