"""The ``policy`` artifact: a learned planner's trained weights and what they came from.

A JSON (or YAML) document: a header a person reads (which planner it serves, the
feature schema its inputs follow, the network's architecture, the graphs and
topologies it was trained on, the seed and the exact command that trained it) and
the weights, each tensor as its name, shape and little-endian float32 values in
base64. A planner loading a policy refuses one whose ``feature_schema_version``
differs from the features it computes (``planners/learned/policy.py``).
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import field
from typing import Any

from .records import check, record, unique

SCHEMA_VERSION = 1
FLOAT32_BYTES = 4


@record
class Weight:
    """One tensor of a policy: ``data`` is base64 of its float32 values, little-endian,
    row-major."""

    name: str
    shape: tuple[int, ...] = ()
    data: str

    def __post_init__(self) -> None:
        check(bool(self.name), "a weight needs a name")
        check(all(n >= 0 for n in self.shape), f"weight {self.name!r}: shape {list(self.shape)} "
                                               f"has a negative size")
        try:
            nbytes = len(base64.b64decode(self.data, validate=True))
        except (binascii.Error, ValueError):
            raise ValueError(f"weight {self.name!r}: data is not base64") from None
        expected = math.prod(self.shape) * FLOAT32_BYTES
        check(nbytes == expected, f"weight {self.name!r}: shape {list(self.shape)} needs "
                                  f"{expected} bytes, data holds {nbytes}")

    @property
    def count(self) -> int:
        return math.prod(self.shape)


@record
class TrainedOn:
    """What a policy was trained on: graph and topology names, episodes run, and the most
    devices of any cluster trained on (0: not recorded)."""

    graphs: tuple[str, ...] = ()
    topologies: tuple[str, ...] = ()
    episodes: int = 0
    max_devices: int = 0

    def __post_init__(self) -> None:
        check(self.episodes >= 0, f"episodes must be >= 0, got {self.episodes}")
        check(self.max_devices >= 0, f"max_devices must be >= 0, got {self.max_devices}")


@record
class Policy:
    kind: str = "policy"
    schema_version: int = SCHEMA_VERSION
    planner: str
    feature_schema_version: int
    architecture: dict[str, Any] = field(default_factory=dict)
    trained_on: TrainedOn = field(default_factory=TrainedOn)
    seed: int = 0
    command: str = ""
    weights: tuple[Weight, ...] = ()
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check(bool(self.planner), "planner must not be empty")
        check(self.feature_schema_version >= 1,
              f"feature_schema_version must be >= 1, got {self.feature_schema_version}")
        unique((w.name for w in self.weights), "weight")

    @property
    def parameter_count(self) -> int:
        return sum(w.count for w in self.weights)
