"""The few tensor operations the chain's kernels lean on, in their fastest torch form.

On a CPU, advanced indexing (``x[idx]``, ``x[idx] = v``) and ``torch.where`` take
several times as long as ``index_select``, ``scatter_`` and plain arithmetic over
the same elements (measured on one core, 64k int64 elements: ``x[perm]`` 0.5 ms,
``index_select`` 0.06 ms; ``where`` 0.27 ms, ``b + (a - b) * c`` 0.08 ms). The
results are the same; a kernel's meaning does not depend on which is used.
"""

from __future__ import annotations

import torch


def take(x, idx):
    """``x[idx]`` for a 1-D ``x`` and integer ``idx`` of any shape."""
    if idx.dim() == 1:
        return torch.index_select(x, 0, idx)
    return torch.index_select(x, 0, idx.reshape(-1)).view(idx.shape)


def put(x, idx, values) -> None:
    """``x[idx] = values`` for 1-D ``x``, ``idx`` and ``values`` (with repeated indices,
    one of their values is kept)."""
    x.scatter_(0, idx, values)


def pick(cond, a, b):
    """``torch.where(cond, a, b)`` for int64 ``a``/``b`` (tensors or ints, one a tensor)
    and a bool ``cond``: ``b + (a - b) * cond``, exact in two's complement."""
    return b + (a - b) * cond
