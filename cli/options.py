"""Shared click options, value types, and the one place a command's output goes out.

Where output goes (DESIGN.md §10; docs/user-guide.md states it for users):

* stdout carries a command's result and nothing else. ``--json`` prints the
  result as JSON there. Asked for no file and no JSON, a command still puts its
  result on stdout rather than losing it: an artifact a later command reads
  (op graph, topology, plan) as its document, so ``> file`` works; a report,
  comparison or listing as tables for a person.
* ``-o FILE`` writes the result to FILE (its extension picks the format) and
  keeps stdout empty unless ``--json`` is given too. ``-o /dev/null`` (any
  existing device or pipe) takes the result as it is, JSON unless its name ends
  in a known extension, so a Makefile can discard it.
* stderr carries everything else — summaries, progress bars — and only when it
  is a terminal; errors are one line there.
* Tables are as wide as their content when the stream is not a terminal (a log,
  a pipe), so nothing is cut to 80 columns.

``deliver`` implements the rules for every command that makes a result;
``print_view`` and ``print_json`` are what it and the listing commands use.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

from dl_nfv.artifacts import dumps, load, save
from dl_nfv.artifacts.io import FORMATS, special_file
from dl_nfv.artifacts.records import to_data

# Width a table may take on a stream that is not a terminal: wide enough for any table
# dl-nfv renders, so logs get whole rows instead of rows cut to 80 columns.
UNBOUNDED_WIDTH = 1_000_000

ARTIFACT_SUFFIXES = tuple(FORMATS)  # .json, .yaml, .yml
JSON_SUFFIXES = (".json",)
TRACE_SUFFIXES = (".pcap", ".pcapng")


class Number(click.FloatRange):
    """A finite float (NaN and Infinity are refused), optionally within a range."""

    name = "number"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.strip().lower().lstrip("+-") in ("nan", "inf",
                                                                             "infinity"):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        result = super().convert(value, param, ctx)
        if not math.isfinite(result):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return result


def check_output_path(path: Path, suffixes: Iterable[str], *, special: bool = True) -> Path:
    """``path`` if a result can be written there; ``click.BadParameter`` naming it if not.

    The extension must be one of ``suffixes``; the folder must exist and be writable, and
    an existing file there must be a writable file. Checked before any work is done, so a
    bad ``-o`` costs nothing and leaves the file that is there as it was. An existing
    device or pipe (``/dev/null``: ``special_file``) is taken whatever its name, if
    writable, unless ``special`` is false (an output that writes files beside its own).
    """
    suffixes = tuple(suffixes)
    if special_file(path):
        if not special:
            raise click.BadParameter(f"{str(path)!r}: is a device or pipe; this output "
                                     f"needs a regular file, with the extension "
                                     f"{' or '.join(suffixes)}")
        if not os.access(path, os.W_OK):
            raise click.BadParameter(f"{str(path)!r}: is not writable")
        return path
    if path.suffix.lower() not in suffixes:
        raise click.BadParameter(f"{str(path)!r}: the extension must be "
                                 f"{', '.join(suffixes[:-1])}{' or ' if len(suffixes) > 1 else ''}"
                                 f"{suffixes[-1]} (it picks the format)")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise click.BadParameter(f"{str(path)!r}: folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{str(path)!r}: folder {str(folder)!r} is not writable")
    if path.exists() and (path.is_dir() or not os.access(path, os.W_OK)):
        raise click.BadParameter(f"{str(path)!r}: " + ("is a folder" if path.is_dir()
                                                      else "the file is not writable"))
    return path


def check_output_folder(path: Path | None) -> Path | None:
    """``path`` if an output folder can be made or written there; ``click.BadParameter`` if not."""
    if path is None:
        return None
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise click.BadParameter(f"{str(path)!r}: {str(existing)!r} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{str(path)!r}: folder {str(existing)!r} is not writable")
    return path


def output_option(help_text: str = "Write the result to this file (.json, .yaml or .yml).",
                  suffixes: Iterable[str] = ARTIFACT_SUFFIXES, flags: tuple[str, ...] = ("-o",
                                                                                         "--output"),
                  name: str = "output", required: bool = False,
                  special: bool = True) -> Callable:
    """``-o FILE``: a result file whose extension is one of ``suffixes``, checked up front
    (``check_output_path``; ``special=False`` refuses ``/dev/null`` and other devices)."""
    suffixes = tuple(suffixes)

    def convert(ctx, param, value):
        return None if value is None else check_output_path(value, suffixes, special=special)

    return click.option(*flags, name, type=click.Path(dir_okay=False, path_type=Path),
                        required=required, callback=convert, help=help_text)


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


def console(*, err: bool = False, width: int | None = None):
    """A rich console on stdout (or stderr): a terminal's width on a terminal, else unbounded."""
    from rich.console import Console

    stream = sys.stderr if err else sys.stdout
    if width is None and not stream.isatty():
        width = UNBOUNDED_WIDTH
    return Console(file=stream, width=width, soft_wrap=False)


def stderr_console():
    """A rich console on stderr for summaries and progress, or None when stderr is not a terminal."""
    if not sys.stderr.isatty():
        return None
    return console(err=True)


def print_view(renderable: Any, *, width: int | None = None) -> None:
    """Print a rendering (a table, a group of tables) on stdout: the listing commands' data."""
    console(width=width).print(renderable)


def print_json(result: Any) -> None:
    """A record or plain data as indented JSON; NaN and Infinity are refused (``NonFiniteNumber``)."""
    click.echo(dumps(result), nl=False)


def deliver(result: Any, output: Path | None, as_json: bool, *,
            render: Callable[[Any], Any] | None = None,
            summary: Callable[[Any], Any] | None = None, document: str | None = None) -> None:
    """Send a command's result where its options say (the rules in this module's docstring).

    ``render`` turns the result into tables for a person; ``summary`` into the short text
    shown on a terminal's stderr (default: ``render``). ``document`` ("json" or "yaml")
    marks an artifact a later command reads: asked nowhere, it is printed as that document.
    """
    if output is not None:
        save(result, output)
    if as_json:
        print_json(result)
    elif output is None:
        if document == "yaml":
            click.echo(dumps(result, fmt="yaml"), nl=False)
        elif document is not None or render is None:
            print_json(result)
        else:
            print_view(render(result))
            return
    show = summary or render
    if show is not None and (err := stderr_console()) is not None:
        err.print(show(result))


def plain(record: Any) -> dict:
    return to_data(record)
