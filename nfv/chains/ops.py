"""The few tensor operations the chain's kernels lean on, in their fastest torch form.

On a CPU, advanced indexing (``x[idx]``, ``x[idx] = v``) takes several times as long
as ``index_select`` and ``scatter_`` over the same elements (measured on one core, 64k
int64 elements: ``x[perm]`` 0.5 ms, ``index_select`` 0.06 ms). ``torch.where`` is one
call where the arithmetic select ``b + (a - b) * c`` is three (and a promotion of the
mask), so it is the faster below some 32k elements (8k: 5 us against 13 us), but
measured several times slower on 64k (0.27 ms against 0.08 ms); ``pick`` uses each
where it is the faster. The results are the same; a kernel's meaning does not depend
on which is used.
"""

from __future__ import annotations

import numpy as np
import torch


def take(x, idx):
    """``x[idx]`` for a 1-D ``x`` and integer ``idx`` of any shape (tensors, or numpy arrays)."""
    if isinstance(x, np.ndarray):
        return x.take(idx)
    if idx.dim() == 1:
        return torch.index_select(x, 0, idx)
    return torch.index_select(x, 0, idx.reshape(-1)).view(idx.shape)


NUMPY_FROM = 1 << 17  # elements moved from which numpy's take and fancy stores beat torch's
# on a CPU, the chain's steps over short vectors (a batch's flows, keys, a scan's rounds) run
# by numpy over the tensors' memory, where a call costs a fraction of torch's (measured on one
# core: ~0.5-1 us against ~1.5-2 us); off, the torch forms run there too (as on CUDA)
HOST = True


def on_host(x) -> bool:
    """Whether the steps over tensor ``x`` run by numpy (``HOST``, on a CPU)."""
    return HOST and x.device.type == "cpu"


def arrays(host: bool, *xs):
    """``xs`` (tensors, numpy arrays or None) as numpy arrays (a tensor's over its memory)
    where ``host``, else as they are: a step written once with this module's helpers and
    operators runs either. A tensor keeps its numpy view (``HOST_VIEW``), so the tensors
    a batch's steps read again and again (its segments, times, masks, the NFs' tables)
    are each seen once: ``numpy()`` costs several times an attribute's read."""
    if not host:
        return list(xs)
    return [_host_view(x) if isinstance(x, torch.Tensor) else x for x in xs]


HOST_VIEW = "_host_view"  # the attribute of a tensor that holds its numpy view


def _host_view(x):
    got = getattr(x, HOST_VIEW, None)
    if got is None:
        got = x.numpy()
        setattr(x, HOST_VIEW, got)
    return got


def tensor(x):
    """``x`` as a tensor (a numpy array's over its memory, which it keeps as its view)."""
    if isinstance(x, np.ndarray):
        got = torch.from_numpy(x)
        setattr(got, HOST_VIEW, x)
        return got
    return x


def nonzero(mask):
    """The positions of a 1-D mask's set entries."""
    if isinstance(mask, np.ndarray):
        return mask.nonzero()[0]  # 1-D: no ``flatnonzero`` wrapper (ravel, dispatch)
    return torch.nonzero(mask).squeeze(1)


def stack(xs, out=None):
    """``xs`` (1-D, one length) as the rows of one 2-D array (into ``out``, if given). Numpy
    arrays row by row: ``np.stack``'s checks and views cost several row copies of a batch's
    flows."""
    if not isinstance(xs[0], np.ndarray):
        return torch.stack(xs, out=out)
    if out is None:
        out = np.empty((len(xs), xs[0].shape[0]), dtype=np.result_type(*xs))
    for row, x in zip(out, xs):
        row[...] = x
    return out


def at_least(x, low: int):
    """``x`` clamped below at ``low``."""
    return np.maximum(x, low) if isinstance(x, np.ndarray) else torch.clamp(x, min=low)


def take_columns(x, idx):
    """``x[:, idx]`` for a 2-D ``x``: ``gather`` along dimension 1 (measured on one core,
    [9, 8k] int64: 50 us, against 180 us for ``index_select`` along it), on a CPU from
    ``NUMPY_FROM`` elements numpy's ``take`` along axis 1 over the tensors' memory
    ([8, 64k]: 0.5 ms against 0.9 ms); numpy's ``take`` over numpy arrays."""
    if isinstance(x, np.ndarray):
        return np.take(x, idx, axis=1)
    if x.device.type == "cpu" and x.shape[0] * idx.numel() >= NUMPY_FROM:
        return torch.from_numpy(np.take(x.numpy(), idx.numpy(), axis=1))
    return torch.gather(x, 1, idx.expand(x.shape[0], -1))


def take_rows_t(x, idx):
    """``x[idx].t().contiguous()`` for a 2-D ``x``: the rows at ``idx`` as columns (on a CPU
    by numpy (``HOST``), measured about twice as fast as torch's ``index_select`` then
    transposed copy, from a batch's few hundred flows on)."""
    if on_host(x):
        return torch.from_numpy(np.ascontiguousarray(np.take(x.numpy(), idx.numpy(), axis=0).T))
    return torch.index_select(x, 0, idx).t().contiguous()


def put_rows_t(x, idx, values) -> None:
    """``x[idx] = values.t()`` for 2-D ``x`` and ``values`` ([columns, len(idx)]) and distinct
    ``idx`` (on a CPU by numpy (``HOST``), faster than torch's ``index_copy_`` from a batch's
    few hundred flows on)."""
    if on_host(x):
        # rows made contiguous first: a store from the transposed view reads it by columns
        x.numpy()[idx.numpy()] = np.ascontiguousarray(values.numpy().T)
    else:
        x.index_copy_(0, idx, values.t())


def put_columns(x, idx, values) -> None:
    """``x[:, idx] = values`` for 2-D ``x`` and ``values`` and distinct ``idx``."""
    if isinstance(x, np.ndarray):
        x[:, idx] = values
    else:
        x.scatter_(1, idx.expand(x.shape[0], -1), values)


def put(x, idx, values) -> None:
    """``x[idx] = values`` for 1-D ``x``, ``idx`` and ``values`` (with repeated indices,
    one of their values is kept)."""
    if isinstance(x, np.ndarray):
        x[idx] = values
    else:
        x.scatter_(0, idx, values)


WHERE_BELOW = 1 << 15  # elements under which torch.where is the faster select


def pick(cond, a, b):
    """``torch.where(cond, a, b)`` for int64 ``a``/``b`` (tensors or ints, one a tensor)
    and a bool ``cond``: ``torch.where`` on fewer than ``WHERE_BELOW`` elements, else
    ``b + (a - b) * cond``, exact in two's complement; ``np.where`` over numpy arrays."""
    if isinstance(cond, np.ndarray):
        return np.where(cond, a, b)
    if cond.numel() < WHERE_BELOW:
        return torch.where(cond, a, b)
    return b + (a - b) * cond


def sort_values(x):
    """``x`` (1-D int64) sorted ascending: on a CPU by numpy, which sorts values alone
    (measured on one core, 8k int64: 25 us, against 400 us for torch's sort with indices)."""
    if x.device.type == "cpu":
        return torch.from_numpy(np.sort(x.numpy()))
    return torch.sort(x).values


def spread(values, rows, like):
    """``values`` at positions ``rows`` of an array shaped like ``like``, -1 elsewhere."""
    out = np.full_like(like, -1) if isinstance(like, np.ndarray) else torch.full_like(like, -1)
    out[rows] = values
    return out


def key_order(k1, k2):
    """The stable order of keys (``k1``, then ``k2``): two stable sorts."""
    order = torch.sort(k2, stable=True).indices
    return order[torch.sort(k1[order], stable=True).indices]


def stable_order(values, bound: int):
    """The stable argsort of 1-D int64 ``values`` in 0..bound-1: one sort of the values and
    positions packed in an int64 (``sort_values``), the positions taken back from the low
    bits. ``bound`` times the positions' range must stay below 2^63."""
    n = int(values.shape[0])
    shift = max(n - 1, 1).bit_length()
    if bound.bit_length() + shift > 63:
        raise ValueError(f"values below {bound} cannot be packed with {n} positions")
    if isinstance(values, np.ndarray):
        return np.sort((values << shift) | np.arange(n)) & ((1 << shift) - 1)
    packed = sort_values((values << shift) | torch.arange(n, device=values.device))
    return packed & ((1 << shift) - 1)
