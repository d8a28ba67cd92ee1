"""Shared click options and helpers used by every command.

Conventions (DESIGN.md §10): results go to a file (``-o``) or to stdout as
JSON (``--json``); human summaries and progress go to stderr, and only when
stderr is a terminal; errors are one line, exit 2 for bad input.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from dl_nfv.artifacts import dumps, load, save
from dl_nfv.artifacts.records import to_data


def output_option(help_text: str = "Write the result to this file (.json or .yaml).") -> Callable:
    return click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
                        default=None, help=help_text)


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print the result as JSON on stdout.")
seed_option = click.option("--seed", type=int, default=0, show_default=True,
                           help="Seed for every random choice; same inputs and seed give the same result.")


def artifact_argument(name: str, kind: str | None = None) -> Callable:
    """A positional artifact path, loaded (and kind-checked) before the command runs."""

    def convert(ctx, param, value):
        return None if value is None else load(value, expect=kind)

    return click.argument(name, type=click.Path(dir_okay=False), callback=convert)


def artifact_option(flag: str, kind: str, help_text: str, required: bool = False) -> Callable:
    def convert(ctx, param, value):
        return None if value is None else load(value, expect=kind)

    return click.option(flag, type=click.Path(dir_okay=False), callback=convert,
                        required=required, help=help_text)


def stderr_console():
    """A rich console on stderr, or None when stderr is not a terminal."""
    if not sys.stderr.isatty():
        return None
    from rich.console import Console

    return Console(stderr=True)


def emit(record: Any, output: Path | None, as_json: bool) -> None:
    """Write ``record`` to ``output`` and/or print it as JSON on stdout."""
    if output is not None:
        save(record, output)
    if as_json:
        click.echo(dumps(record), nl=False)


def emit_data(data: dict, output: Path | None, as_json: bool) -> None:
    """Like ``emit`` for plain data (tables, comparison results)."""
    from dl_nfv.artifacts.io import write_text_atomic

    text = json.dumps(data, indent=1) + "\n"
    if output is not None:
        write_text_atomic(output, text)
    if as_json:
        click.echo(text, nl=False)


def plain(record: Any) -> dict:
    return to_data(record)
