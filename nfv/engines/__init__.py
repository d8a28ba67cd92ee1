"""Engines: how the messages of a trace reach the NFs.

* ``cpu``: a pool of worker processes; each flow is pinned to one worker
  (by flow id), so its messages are processed in order, by one process.
* ``gpu``: every flow of a batch on the batched tensor path (CUDA when
  present, else torch on the CPU), one row ("thread") per flow, padded to the
  longest flow in the batch.
* ``fixed:X``: per batch, the fraction X of flows with the most bytes on the
  CPU pool, the rest on the tensor path, concurrently.
* ``flowshader``: per batch, the smallest flows go to the tensor path and the
  largest to the CPU pool, the split chosen by a calibrated cost model
  (``costmodel.py``), with periodic re-profiling and adaptive batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

from dl_nfv.artifacts.errors import BadInput, UnknownName

ENGINES = ("cpu", "gpu", "fixed:X", "flowshader")


@dataclass(frozen=True, slots=True)
class EngineChoice:
    """A parsed engine name: ``kind`` is cpu, gpu, fixed or flowshader."""

    kind: str
    cpu_fraction: float = 0.0

    def __str__(self) -> str:
        return f"fixed:{self.cpu_fraction:g}" if self.kind == "fixed" else self.kind


def parse_engine(text: str) -> EngineChoice:
    """``EngineChoice`` of ``cpu``, ``gpu``, ``flowshader`` or ``fixed:X`` (0 <= X <= 1)."""
    name = str(text).strip()
    if name in ("cpu", "gpu", "flowshader"):
        return EngineChoice(name)
    if name.startswith("fixed:"):
        value = name.split(":", 1)[1]
        try:
            fraction = float(value)
        except ValueError:
            raise BadInput(f"engine {name!r}: X in fixed:X must be a number in [0, 1]") from None
        if not 0.0 <= fraction <= 1.0:
            raise BadInput(f"engine {name!r}: X in fixed:X must be in [0, 1], got {fraction:g}")
        return EngineChoice("fixed", fraction)
    raise UnknownName(f"unknown engine {name!r}; valid: {', '.join(ENGINES)}")
