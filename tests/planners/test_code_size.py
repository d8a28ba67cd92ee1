"""Sizes of the planners' code: no module of ``planners/`` over 600 lines, no function over 80.

A module or function past these sizes has stopped fitting in a reader's head
(STYLE.md, "Sizes"); the test walks every module with ``ast``, so nested
functions and methods count on their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PLANNERS = ROOT / "planners"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def oversized(root: Path) -> list[str]:
    """Every module over ``MAX_MODULE_LINES`` lines and every function (or method) over
    ``MAX_FUNCTION_LINES`` lines, from its ``def`` to its last line, under ``root``
    (paths relative to it)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        rel = path.relative_to(root)
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES:
            out.append(f"{rel}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    out.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    return out


def test_the_size_walk_finds_long_modules_and_functions(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def f():\n{body}\n\n\ndef g():\n    return 1\n")
    (tmp_path / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    found = oversized(tmp_path)
    assert len(found) == 2 and any(" f: 81 lines" in f for f in found)
    assert any(f"{MAX_MODULE_LINES + 1} lines" in f for f in found)


def test_no_planner_module_or_function_is_too_long():
    assert oversized(PLANNERS) == []
