"""Packaging: every package folder is installed, and a non-editable install works."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

from tests.conftest import ROOT

FOLDERS = {"artifacts", "cli", "planners", "profilers", "runtime", "nfv", "simulator"}


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed():
    tool = _pyproject()["tool"]["setuptools"]
    listed = set(tool["packages"])
    mapping = tool["package-dir"]
    for top in FOLDERS:
        assert mapping[f"dl_nfv.{top}"] == top
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            name = "dl_nfv." + ".".join(rel.parts)
            assert name in listed, f"{rel}/ is a package but {name} is not in pyproject packages"


def test_layout_folders_exist():
    for folder in [*FOLDERS, "tests", "docs", "examples", "bench"]:
        assert (ROOT / folder).is_dir(), folder


def test_non_editable_install(tmp_path):
    """`pip install .` (not -e) into a target folder gives a working dl_nfv."""
    target = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps",
                            "--no-build-isolation", "--target", str(target), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = subprocess.run([sys.executable, "-c",
                            "import dl_nfv, dl_nfv.cli.main, dl_nfv.planners.dp, dl_nfv.simulator.costs;"
                            "print(dl_nfv.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip().startswith(str(target))
