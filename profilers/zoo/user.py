"""User models named by ``pkg.module:callable`` or ``path/to/file.py:callable``.

The callable is called with no arguments and must return an ``nn.Module``.
A file is loaded under a module name derived from its absolute path, so two
files with the same name do not collide and loading twice gives the same code.
Every failure (missing file or module, missing attribute, an exception raised
by the callable, a non-module result) is a ``BadInput`` naming the reference.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from torch import nn

from dl_nfv.artifacts import BadInput


def normalise_name(name: str) -> str:
    """``file.py:fn`` with the path made absolute; ``pkg.mod:fn`` unchanged."""
    target, _, attr = name.rpartition(":")
    if not target or not attr:
        raise BadInput(f"model {name!r}: expected module:callable or file.py:callable")
    if target.endswith(".py"):
        return f"{Path(target).expanduser().resolve()}:{attr}"
    return name


def _load_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise BadInput(f"model file {path}: no such file")
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    module_name = f"dl_nfv_user_{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise BadInput(f"model file {path}: cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise BadInput(f"model file {path}: importing it raised {type(exc).__name__}: {exc}") from None
    return module


def _load_module(dotted: str) -> ModuleType:
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        raise BadInput(f"model module {dotted!r} cannot be imported: {exc}") from None
    except Exception as exc:
        raise BadInput(f"model module {dotted!r}: importing it raised {type(exc).__name__}: {exc}") from None


def resolve_callable(name: str):
    """The callable a ``module:callable`` / ``file.py:callable`` reference names."""
    target, _, attr = normalise_name(name).rpartition(":")
    module = _load_file(Path(target)) if target.endswith(".py") else _load_module(target)
    fn = module
    for part in attr.split("."):
        try:
            fn = getattr(fn, part)
        except AttributeError:
            raise BadInput(f"model {name!r}: {target} has no attribute {attr!r}") from None
    if not callable(fn):
        raise BadInput(f"model {name!r}: {attr!r} is not callable")
    return fn


def build_user_module(name: str) -> nn.Module:
    """Call the referenced callable and check that it returns an ``nn.Module``."""
    fn = resolve_callable(name)
    try:
        module = fn()
    except BadInput:
        raise
    except Exception as exc:
        raise BadInput(f"model {name!r}: calling it raised {type(exc).__name__}: {exc}") from None
    if not isinstance(module, nn.Module):
        raise BadInput(f"model {name!r}: expected it to return a torch.nn.Module, "
                       f"got {type(module).__name__}")
    return module
