"""The column moves the tensor chain leans on, against plain indexing: a batch's columns as
one block (a view of packed packets and their slices, else a copy), and the gathers and
scatters of ``ops`` whose CPU form goes through numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dl_nfv.nfv.chains import ops
from dl_nfv.nfv.chains.ops import put_rows_t, take_columns, take_rows_t
from dl_nfv.nfv.chains.packets import ChainPackets
from dl_nfv.nfv.chains.synth import synthetic_packets


def _stacked(p: ChainPackets) -> np.ndarray:
    return np.stack(list(p.columns().values()))


def test_block_of_packed_packets_is_a_view():
    p = synthetic_packets(flows=50, packets=700, seed=3)
    for part in (p, p.slice(0, 700), p.slice(123, 456), p.slice(650, 700)):
        block = part.block()
        assert np.shares_memory(block, p.ts_us)
        assert np.array_equal(block, _stacked(part))


def test_block_of_unpacked_packets_is_a_copy():
    p = synthetic_packets(flows=20, packets=200, seed=4)
    loose = ChainPackets(*(c.copy() for c in p.columns().values()))
    interleaved = ChainPackets(*np.ascontiguousarray(_stacked(p).T).T)  # strided columns
    for part in (loose, loose.slice(10, 90), interleaved, interleaved.slice(5, 50)):
        block = part.block()
        assert not np.shares_memory(block, part.ts_us)
        assert np.array_equal(block, _stacked(part))


@pytest.mark.parametrize("numpy_from,host", [(0, True), (1 << 40, False)])  # numpy's, torch's
def test_gathers_and_scatters_equal_indexing(monkeypatch, numpy_from, host):
    monkeypatch.setattr(ops, "NUMPY_FROM", numpy_from)
    monkeypatch.setattr(ops, "HOST", host)
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-(1 << 40), 1 << 40, (7, 300), generator=g)
    idx = torch.randint(0, 300, (500,), generator=g)
    assert torch.equal(take_columns(x, idx), x[:, idx])
    assert torch.equal(take_columns(x[2:5], idx[::3]), x[2:5][:, idx[::3]])
    table = torch.randint(0, 1 << 50, (64, 9), generator=g)
    slots = torch.randperm(64, generator=g)[:20]
    rows = take_rows_t(table, slots)
    assert rows.is_contiguous() and torch.equal(rows, table[slots].t())
    new = torch.randint(0, 99, (9, 20), generator=g)
    want = table.clone()
    want[slots] = new.t()
    put_rows_t(table, slots, new)
    assert torch.equal(table, want)
