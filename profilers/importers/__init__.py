"""Importers: op graphs from profiles made by other tools.

* ``pipedream``: PipeDream's profiler output ``graph.txt`` (``import_pipedream``).
* ``placement-json``: the JSON input of the NeurIPS 2020 device-placement
  algorithms (msr-fiddle/dnn-partitioning) (``import_placement_json``).

Both keep what the source measured (per-op forward/backward milliseconds under
the device type the user names, memory as the source states it, edges) and
leave ``flops``/``bytes_accessed`` at 0: those files do not say. A planner can
use the measured times on that device type; estimating other device types
needs FLOPs, which only ``profile model`` records. Each module's docstring
(and docs/profile.md) says how every field of its format maps; anything the
format does not define is an ``InvalidArtifact`` naming the node.
"""

from __future__ import annotations

import re

from dl_nfv.artifacts import OpKind

from .pipedream import import_pipedream
from .placement import import_placement_json

__all__ = ["IMPORTERS", "import_pipedream", "import_placement_json", "kind_of_description"]

IMPORTERS = {"pipedream": import_pipedream, "placement-json": import_placement_json}

_KIND_WORDS = (
    (("input",), OpKind.INPUT),
    (("conv",), OpKind.CONV),
    (("linear", "matmul", "gemm", "dense", "addmm", "bmm"), OpKind.MATMUL),
    (("attention", "attn", "softmaxattention"), OpKind.ATTENTION),
    (("batchnorm", "layernorm", "groupnorm", "norm"), OpKind.NORM),
    (("relu", "gelu", "tanh", "sigmoid", "softmax", "elu", "silu", "hardtanh"), OpKind.ACTIVATION),
    (("pool",), OpKind.POOL),
    (("embedding",), OpKind.EMBEDDING),
    (("lstm", "gru", "rnn"), OpKind.RNN),
    (("dropout", "add", "mul", "sub", "div", "threshold"), OpKind.ELEMENTWISE),
    (("view", "size", "flatten", "reshape", "cat", "concat", "transpose", "permute", "squeeze",
      "split", "stack", "narrow", "select", "contiguous"), OpKind.SHAPE),
    (("loss", "criterion"), OpKind.LOSS),
)


def kind_of_description(description: str) -> OpKind:
    """An op kind from a layer description such as ``Conv2d(3, 64, ...)`` or ``ReLU(inplace)``."""
    head = re.split(r"[(\s]", description.strip(), maxsplit=1)[0].lower()
    for words, kind in _KIND_WORDS:
        if any(w in head for w in words):
            return kind
    return OpKind.OTHER
