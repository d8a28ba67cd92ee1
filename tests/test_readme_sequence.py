"""The README's sequence on a small user model, as a new user types it: profile with the
defaults, plan, simulate, train on ``examples/topologies/local-cpu.yaml``, and compare the
run with the prediction. The error must be reported (present and finite); how small it is
on a quiet machine is the fidelity bench's to say."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.conftest import ROOT

MODEL = '''
import torch
from torch import nn


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(32, 64)
        self.gate = nn.Linear(32, 64)
        self.down = nn.Linear(64, 10)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)) * torch.sigmoid(self.gate(x)))


def build():
    return Gated()
'''


def _dl_nfv(*args) -> str:
    done = subprocess.run([sys.executable, "-m", "dl_nfv", *map(str, args)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, (args[:2], done.stderr)
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("planner", ["dp", "single"])
def test_the_readme_sequence_reports_the_error_of_its_prediction(tmp_path, planner):
    (tmp_path / "gated.py").write_text(MODEL)
    graph, plan = tmp_path / "g.json", tmp_path / "plan.json"
    _dl_nfv("profile", "model", f"{tmp_path / 'gated.py'}:build", "--input-shape", "16,32",
            "-o", graph)
    _dl_nfv("plan", planner, "--graph", graph, "--topology",
            ROOT / "examples" / "topologies" / "local-cpu.yaml", "-o", plan)
    _dl_nfv("simulate", plan, "-o", tmp_path / "sim.json")
    _dl_nfv("train", plan, "--steps", "4", "-o", tmp_path / "run.json")
    compared = json.loads(_dl_nfv("simulate", plan, "--compare", tmp_path / "run.json", "--json"))
    c = compared["comparison"]
    assert math.isfinite(c["error_fraction"]) and c["measured_iteration_ms"] > 0
    assert c["error_fraction"] == pytest.approx(
        c["predicted_iteration_ms"] / c["measured_iteration_ms"] - 1, abs=1e-4)
    # the profile timed the devices' one core whatever torch's threads: nothing extrapolated
    notes = json.loads((tmp_path / "sim.json").read_text()).get("notes", [])
    assert not [n for n in notes if "extrapolated" in n], notes
