"""The error hierarchy every layer raises; the CLI maps it to exit codes.

``DlNfvError`` is the root. ``BadInput`` and its children mean the user gave
something wrong (exit 2); other ``DlNfvError`` subclasses mean the job itself
failed (exit 1).
"""

from __future__ import annotations


class DlNfvError(Exception):
    """Base class of every error dl-nfv raises on purpose."""

    exit_code = 1


class BadInput(DlNfvError):
    """The user's input is wrong: a file, an option, a name. Exit code 2."""

    exit_code = 2


class InvalidArtifact(BadInput):
    """An artifact document is malformed or breaks an invariant.

    ``field`` is a dotted path into the document (``hosts[0].devices[1].type``);
    ``file`` is filled in by the loader when the document came from a file.
    """

    def __init__(self, message: str, *, field: str = "", file: str | None = None):
        self.reason = message
        self.field = field
        self.file = file
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.file:
            where.append(str(self.file))
        if self.field:
            where.append(self.field)
        prefix = ": ".join(where)
        return f"{prefix}: {self.reason}" if prefix else self.reason

    def at(self, *, file: str | None = None, prefix: str = "") -> InvalidArtifact:
        """A copy located in ``file`` and/or under the field path ``prefix``."""
        field = self.field
        if prefix:
            field = f"{prefix}.{field}" if field and not field.startswith("[") else f"{prefix}{field}"
        return InvalidArtifact(self.reason, field=field, file=file or self.file)

    def __reduce__(self):  # keep pickling (multiprocessing) working with keyword-only args
        return (_rebuild_invalid, (self.reason, self.field, self.file))


def _rebuild_invalid(reason: str, field: str, file: str | None) -> InvalidArtifact:
    return InvalidArtifact(reason, field=field, file=file)


class UnknownName(BadInput):
    """A name (device type, model, planner, NF, engine) that is not known."""


class ArtifactMismatch(BadInput):
    """Two artifacts that do not belong together (fingerprints differ, ids absent)."""


class InfeasiblePlan(BadInput):
    """No plan can satisfy the request (memory, divisibility); the message names the shortfall."""


class SolverError(DlNfvError):
    """An optimisation solver failed or returned a status the caller cannot use."""


class UnwritableOutput(BadInput):
    """An output file or folder that cannot be written (permissions, missing folder, full disk)."""


class NonFiniteNumber(DlNfvError):
    """A result holds NaN or Infinity, which no artifact may: the job failed, nothing is written."""


class RuntimeFailure(DlNfvError):
    """A training worker or an NF engine failed while running."""
