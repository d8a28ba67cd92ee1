"""Write a benchmark's results into its own section of docs/benchmarks.md.

Each benchmark owns the text between ``<!-- bench:NAME -->`` and
``<!-- /bench:NAME -->``; re-running it replaces only that section, so the
benchmarks can be run in any order and the rest of the page stays as written.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def machine() -> str:
    """One line naming this machine: CPU model, cores, memory, Python, torch, CUDA device."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(next(row for row in Path("/proc/meminfo").read_text().splitlines()
                       if row.startswith("MemTotal")).split()[1])
        mem = f", {kib / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    gpu = "no GPU"
    try:
        import torch

        torch_version = torch.__version__
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        torch_version = "absent"
    return (f"{cpu}, {os.cpu_count()} cores{mem}, Python {platform.python_version()}, "
            f"torch {torch_version}, {gpu}")


def git_revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=DOC.parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def record_section(name: str, title: str, body: str, command: str | None = None,
                   doc: Path = DOC, revision: str | None = None) -> None:
    """Replace (or append) section ``name`` of ``doc`` with ``title`` and ``body`` (markdown);
    ``revision``: the code the figures came from (default: the checkout's)."""
    command = command or " ".join(["python", *sys.argv])
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    section = (f"{start}\n## {title}\n\nMachine: {machine()}  \nCommand: `{command}`  \n"
               f"Revision: {revision or git_revision()}\n\n{body.strip()}\n{end}")
    if start in text and end in text:
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        text = before + section + after
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    doc.write_text(text)


def markdown_table(headers: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
