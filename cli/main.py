"""The ``dl-nfv`` entry point: the root group, its subcommands, and error mapping.

Every ``DlNfvError`` becomes one line on stderr and its exit code (2 for bad
input, 1 for a failed job), and so does a usage error (an unknown option or
command, a value out of range: exit 2, naming the command whose ``--help``
tells more); any other exception is reported as an internal error (exit 1).
``--debug`` (or ``DL_NFV_DEBUG=1``) shows the traceback instead.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from dl_nfv import __version__
from dl_nfv.artifacts.errors import DlNfvError


class CliError(click.ClickException):
    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def _usage_line(exc: click.UsageError) -> click.UsageError:
    """Click's usage error (usage, hint and message on four lines) as one line; a group
    called without a command still shows its help."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # click >= 8.2
        return exc
    where = f"see '{exc.ctx.command_path} --help'" if exc.ctx is not None else "see --help"
    return CliError(f"{exc.format_message()} ({where})", exc.exit_code)


# command name -> the module of this package that defines it (as ``command``), imported when
# the command is looked up: ``dl-nfv nfv run`` does not pay for the planners' imports
COMMAND_MODULES = {"profile": "profile", "plan": "plan", "simulate": "simulate",
                   "train": "train", "nfv": "nfv", "show": "show"}


class LazyGroup(click.Group):
    """A group whose subcommands in ``lazy`` (name -> the module of this package that
    defines it, as ``command``) are imported when looked up, not with the group."""

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and name not in self.commands:
            module = importlib.import_module(f"{__package__}.{self.lazy[name]}")
            self.add_command(module.command, name)
        return super().get_command(ctx, name)


class RootGroup(LazyGroup):
    """Maps library and usage errors to one-line messages and exit codes; loads each
    subcommand's module on first use."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, lazy=COMMAND_MODULES, **kwargs)

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:  # an option of ``dl-nfv`` itself
            raise _usage_line(exc) from None

    def invoke(self, ctx: click.Context):
        debug = bool(ctx.params.get("debug")) or os.environ.get("DL_NFV_DEBUG") == "1"
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # a subcommand's
            raise _usage_line(exc) from None
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort, SystemExit):
            raise
        except DlNfvError as exc:
            if debug:
                raise
            raise CliError(str(exc), exc.exit_code) from None
        except KeyboardInterrupt:
            raise CliError("interrupted", 130) from None
        except Exception as exc:  # an internal error: say so in one line, traceback with --debug
            if debug:
                raise
            raise CliError(f"internal error: {type(exc).__name__}: {exc} "
                           f"(run with --debug for the traceback)", 1) from None


@click.group(cls=RootGroup, context_settings={"help_option_names": ["-h", "--help"],
                                              "max_content_width": 100})
@click.version_option(__version__, prog_name="dl-nfv")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
def cli(debug: bool) -> None:
    """Plan and run distributed DNN training on heterogeneous GPU clusters, and run
    network functions on CPUs and GPUs.

    \b
    Example:
      dl-nfv show examples/topologies/tag-hetero16.yaml
    """


_SKIP_TEARDOWN = [False]


def skip_teardown() -> None:
    """Say that this process holds nothing to clean up at exit: its output is written and
    closed and its child processes are joined. ``main`` then ends the process with
    ``os._exit`` once the command has returned (standard streams flushed), without the
    interpreter's teardown, which frees every module and object one by one (after the
    imports of ``nfv run``, numpy's among them, tens of milliseconds). Commands run in
    process (click's test runner) are unaffected: only ``main`` acts on it."""
    _SKIP_TEARDOWN[0] = True


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="dl-nfv")
    except SystemExit as exc:
        if not _SKIP_TEARDOWN[0]:
            raise
        code = exc.code
        if not isinstance(code, int):  # None: success; a message: printed, exit 1
            if code is not None:
                print(code, file=sys.stderr)
            code = 0 if code is None else 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can be written
                pass
        os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
