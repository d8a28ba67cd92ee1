"""A folder of small, valid inputs for command-line tests: the op graph of the real
mlp-tiny, the measured two-process topology, a data-parallel plan of them (so `train`
runs it), a real HTTP pcap and the IDS chain."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from dl_nfv.cli.main import cli
from tests.conftest import EXAMPLES, ROOT

TOPOLOGY = EXAMPLES / "topologies" / "local-cpu.yaml"
NF_CONFIG = EXAMPLES / "nf" / "ids.yaml"
PCAP = ROOT / "tests" / "data" / "loopback-http.pcap"


def invoke(args: list[str]):
    """Run ``dl-nfv ARGS`` in-process; stdout and stderr apart, never on a terminal."""
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="dl-nfv")


def make_workspace(folder: Path) -> dict[str, Path]:
    """Write the valid inputs into ``folder``; return them by name."""
    files = {"graph": folder / "g.json", "topology": folder / "t.yaml", "plan": folder / "plan.json",
             "pcap": folder / "http.pcap", "config": NF_CONFIG}
    result = invoke(["profile", "model", "mlp-tiny", "--repeats", "1", "--span", "0", "--no-batch-scaling",
                     "--threads", "1", "-o", files["graph"]])
    assert result.exit_code == 0, result.output
    shutil.copy(TOPOLOGY, files["topology"])
    shutil.copy(PCAP, files["pcap"])
    result = invoke(["plan", "dp", "--graph", files["graph"], "--topology", files["topology"],
                     "-o", files["plan"]])
    assert result.exit_code == 0, result.output
    return files
