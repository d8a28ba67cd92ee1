"""Load and save artifacts (JSON or YAML), check ``kind``/``schema_version``, fingerprint them.

Every artifact document starts with ``kind:`` and ``schema_version:``. The
file extension picks the format on save (``.json`` or ``.yaml``/``.yml``);
loading accepts either. Writes to a file are atomic (a temporary file renamed
over the target), so a failed write never leaves a half-written or emptied file,
and a file that cannot be written is ``UnwritableOutput`` naming the path. An
existing path that is no regular file or folder (``/dev/null``, a pipe, a
socket: ``special_file``) cannot be renamed over; it is written straight
through, as JSON unless its name ends in a known extension. No
artifact holds NaN or Infinity: they are refused on load (``records``) and on
save (``NonFiniteNumber`` naming the field), in JSON and YAML alike.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml

from .errors import BadInput, InvalidArtifact, NonFiniteNumber, UnwritableOutput
from .records import from_data, to_data

# kind -> "module:Class" (relative to this package, or absolute); imported on first use.
KINDS: dict[str, str] = {
    "topology": "topology:Topology",
    "op-graph": "opgraph:OpGraph",
    "plan": "plan:Plan",
    "sim-report": "simreport:SimReport",
    "run-report": "runreport:RunReport",
    "nf-config": "nfconfig:NfConfig",
    "nfv-report": "nfvreport:NfvReport",
    "netstar-report": "netstar:NetstarReport",
    "netstar-bench": "netstar:NetstarBench",
    "plan-comparison": "results:PlanComparison",
    "nfv-bench": "results:NfvBench",
    "network-probe": "results:NetworkProbe",
    "policy": "policy:Policy",
    "chain-report": "chainreport:ChainReport",
    "chain-bench": "chainreport:ChainBench",
    "fusion-times": "dl_nfv.profilers.fusion:FusionTimes",  # an absolute module path
}


def record_class(kind: str) -> type:
    """The record class of artifact ``kind``; ``InvalidArtifact`` listing the kinds if unknown."""
    try:
        module_name, cls_name = KINDS[kind].split(":")
    except KeyError:
        raise InvalidArtifact(f"unknown kind {kind!r}; known kinds: {', '.join(sorted(KINDS))}",
                              field="kind") from None
    module = importlib.import_module(module_name if module_name.startswith("dl_nfv.")
                                     else f"{__package__}.{module_name}")
    return getattr(module, cls_name)


def read_document(path: str | os.PathLike) -> dict[str, Any]:
    """Parse ``path`` as JSON or YAML into a mapping; errors name the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, not an artifact file") from None
    except UnicodeDecodeError:
        raise InvalidArtifact("not a text file (JSON or YAML expected)", file=str(path)) from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror}") from None
    if path.suffix == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidArtifact(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                                  file=str(path)) from None
    else:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise InvalidArtifact(f"invalid YAML{where}: {problem}", file=str(path)) from None
    if not isinstance(doc, dict):
        raise InvalidArtifact("expected a mapping with 'kind' and 'schema_version' at the top",
                              file=str(path))
    return doc


def from_document(doc: dict[str, Any], *, expect: str | None = None, file: str | None = None):
    """Build the record of ``doc`` (its ``kind``), optionally requiring kind ``expect``."""
    try:
        kind = doc.get("kind")
        if kind is None:
            raise InvalidArtifact("missing required key 'kind'")
        if expect is not None and kind != expect:
            raise InvalidArtifact(f"expected kind {expect!r}, got {kind!r}", field="kind")
        cls = record_class(kind)
        supported = _supported_version(cls)
        version = doc.get("schema_version")
        if version is None:
            raise InvalidArtifact("missing required key 'schema_version'")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise InvalidArtifact(f"schema_version must be a positive integer, got {version!r}",
                                  field="schema_version")
        if version > supported:
            raise InvalidArtifact(f"schema_version {version} is newer than this dl-nfv reads "
                                  f"({supported}); upgrade dl-nfv", field="schema_version")
        return from_data(cls, doc)
    except InvalidArtifact as exc:
        raise exc.at(file=file) from None


def _supported_version(cls: type) -> int:
    import dataclasses

    return next(f.default for f in dataclasses.fields(cls) if f.name == "schema_version")


def load(path: str | os.PathLike, *, expect: str | None = None):
    """Load the artifact at ``path``; ``expect`` requires a kind ("plan", "topology", ...)."""
    return from_document(read_document(path), expect=expect, file=str(path))


def non_finite_field(data: Any, where: str = "") -> str | None:
    """The path of the first NaN or infinite float in plain ``data``, or None if there is none."""
    if isinstance(data, float):
        return None if math.isfinite(data) else (where or "(top level)")
    if isinstance(data, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in data.items())
    elif isinstance(data, (list, tuple)):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(data))
    else:
        return None
    return next((found for path, value in items
                 if (found := non_finite_field(value, path)) is not None), None)


def plain_data(record: Any) -> Any:
    """``to_data`` of a record (plain data passes through), refusing NaN and Infinity."""
    data = record if isinstance(record, (dict, list)) else to_data(record)
    where = non_finite_field(data)
    if where is not None:
        raise NonFiniteNumber(f"refusing to write a non-finite number (NaN or Infinity) at {where}")
    return data


def dumps(record: Any, *, fmt: str = "json") -> str:
    """Serialise a record (or plain data) as JSON (indented, key order as declared) or YAML.

    Raises ``NonFiniteNumber`` if it holds NaN or Infinity.
    """
    data = plain_data(record)
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
    return json.dumps(data, indent=1, allow_nan=False) + "\n"


FORMATS = {".json": "json", ".yaml": "yaml", ".yml": "yaml"}


def special_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` exists and is neither a regular file nor a folder: a device such
    as ``/dev/null``, a pipe (``>(cmd)``), a socket. Links are followed."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def format_of(path: str | os.PathLike) -> str:
    """``json`` or ``yaml`` by the file's extension; ``BadInput`` for any other extension.

    A special file (``special_file``) without a known extension is written as JSON.
    """
    suffix = Path(path).suffix.lower()
    try:
        return FORMATS[suffix]
    except KeyError:
        if special_file(path):
            return "json"
        raise BadInput(f"{path}: unknown extension {suffix or '(none)'!r}; an artifact file ends "
                       f"in .json, .yaml or .yml") from None


def save(record: Any, path: str | os.PathLike) -> Path:
    """Write ``record`` atomically to ``path``, as JSON or YAML by its extension."""
    path = Path(path)
    write_text_atomic(path, dumps(record, fmt=format_of(path)))
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, then rename.

    Raises ``UnwritableOutput`` naming ``path`` when it cannot be written; the file that
    was there before, if any, is left as it was. A special file (``special_file``:
    ``/dev/null``, a pipe) is written straight through, since renaming over it would
    replace the device with a file.
    """
    path = Path(path)
    if special_file(path):
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise UnwritableOutput(f"{path}: cannot write: {exc.strerror or exc}") from None
        return
    folder = path.parent
    if not folder.exists():
        raise UnwritableOutput(f"{path}: folder {folder} does not exist")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise UnwritableOutput(f"{path}: cannot write: {exc.strerror or exc}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def make_folder(path: str | os.PathLike) -> Path:
    """Create folder ``path`` (and its parents); ``UnwritableOutput`` naming it if that fails."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UnwritableOutput(f"{path}: cannot create the folder: {exc.strerror or exc}") from None
    return path


def canonical_json(record: Any) -> str:
    """The canonical form fingerprints are taken of: sorted keys, no whitespace."""
    return json.dumps(plain_data(record), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def fingerprint(record: Any) -> str:
    """sha256 (hex) of the record's canonical JSON; stable across load/save and formats."""
    import hashlib  # here: it maps OpenSSL's libcrypto (~3 MB resident), which most runs never need

    return hashlib.sha256(canonical_json(record).encode()).hexdigest()
