"""A capture's headers decoded by several forked processes, the columns exchanged through
one shared mapping.

``SharedColumns(records, parts)`` is allocated before the fork (or, with ``fd``,
in a file that processes forked earlier map with ``attach``): room for every
record's decoded columns (``columnar.PacketColumns``' per-frame fields), its
5-tuple key, its hash and orientation (``keys.key_table``) in one anonymous shared
mapping, so what one process writes every other reads. Process ``k`` decodes
part ``k`` of the records (``decode_part``: a contiguous ``1 / parts`` of
them, the frames where they lie in the mapped capture) and writes its rows;
after all have (a barrier the caller keeps), each reads the whole capture's
columns back (``columns``) without copying them. Rows are decoded exactly as
one ``decode_records`` over all records decodes them: the fast path works
frame by frame.

The exception is a frame the array decoder hands to the reference decoder
(dpkt): its skip reason may extend the list of reasons, and its fields may
need bytes appended to the buffer, neither of which another process would
see. A part with such frames says so (``fallback``), and then every process
decodes the whole capture itself (the same columns everywhere, the split
decoding lost). O(records) shared bytes: about 170 per record.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from .capture import release_pages
from .columnar import OK, REASONS, PacketColumns, decode_records, http_starts
from .keys import KEY_WIDTH, key_table, row_hash

_FIELDS = (("ts_us", np.int64), ("wire_bytes", np.int64), ("reason", np.int16),
           ("proto", np.uint8), ("addr_len", np.int64), ("src_off", np.int64),
           ("dst_off", np.int64), ("sport", np.int64), ("dport", np.int64),
           ("flags", np.uint8), ("seq", np.int64), ("payload_off", np.int64),
           ("payload_len", np.int64))
DECODE_STEP = 16384  # records decoded at once: their pages and temporaries, a few MB


class SharedColumns:
    """Decoded columns of ``records`` ([n, 4], ``capture.span_table``) in ``parts`` parts,
    in one shared mapping (see the module docstring)."""

    def __init__(self, records: np.ndarray, parts: int, fd: int | None = None):
        """Room for the columns of ``records``: an anonymous shared mapping, or the file
        ``fd`` (sized here and the records written to it, so that processes forked before
        it was sized can map it with ``attach``)."""
        self.parts = parts
        self.area, self.arrays = _mapped(len(records), parts, fd)
        self.records = records
        if fd is not None:
            self.arrays["records"][:] = records
            self.records = self.arrays["records"]

    @classmethod
    def attach(cls, fd: int, n: int, parts: int) -> SharedColumns:
        """The ``SharedColumns`` another process made in the file ``fd`` for ``n`` records."""
        shared = cls.__new__(cls)
        shared.parts = parts
        shared.area, shared.arrays = _mapped(n, parts, fd, size=False)
        shared.records = shared.arrays["records"]
        return shared

    def bounds(self, part: int) -> tuple[int, int]:
        n = len(self.records)
        return n * part // self.parts, n * (part + 1) // self.parts

    def decode_part(self, data, part: int) -> None:
        """Decode part ``part`` of the records of the mapped capture ``data`` into the
        shared rows (or mark the part as needing the whole capture decoded in each
        process)."""
        lo, hi = self.bounds(part)
        for start in range(lo, hi, DECODE_STEP):  # the pages of one step resident at a time
            stop = min(start + DECODE_STEP, hi)
            cols = decode_records(data, self.records[start:stop], copy=False)
            if cols.fallback or cols.blob is not data:
                self.arrays["fallback"][part] = max(1, cols.fallback)
                return
            for name, _ in _FIELDS:
                self.arrays[name][start:stop] = getattr(cols, name)
            ok = np.flatnonzero(cols.reason == OK)
            table, src_low = key_table(cols, ok)
            self.arrays["key"][start + ok] = table
            self.arrays["src_low"][start + ok] = src_low
            self.arrays["key_hash"][start + ok] = row_hash(table)
            self.arrays["http_start"][start + ok] = http_starts(cols, ok)
            del cols, table
            # flow building reads only payloads from here on, a page at a time
            release_pages(data)

    def columns(self, data) -> tuple[PacketColumns, np.ndarray,
                                     tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Once every part is decoded: the capture's columns, its decoded rows (reason OK)
        and their ``key_table`` with each key's ``row_hash``."""
        if self.arrays["fallback"].any():
            cols = decode_records(data, self.records, copy=False)
            rows = np.flatnonzero(cols.reason == OK)
            table, src_low = key_table(cols, rows)
            return cols, rows, (table, src_low, row_hash(table))
        a = self.arrays
        cols = PacketColumns(**{name: a[name] for name, _ in _FIELDS}, blob=data,
                             buf=np.frombuffer(data, dtype=np.uint8), reasons=list(REASONS),
                             fallback=0, http_start=a["http_start"])
        rows = np.flatnonzero(cols.reason == OK)
        return cols, rows, (a["key"][rows], a["src_low"][rows], a["key_hash"][rows])


    def close(self) -> None:
        """Unmap the columns in this process (once no array over them is left: the
        mapping otherwise stays until those go)."""
        self.arrays, self.records = {}, None
        try:
            self.area.close()
        except BufferError:  # a view of it is still alive somewhere
            pass


def _mapped(n: int, parts: int, fd: int | None, size: bool = True
            ) -> tuple[mmap.mmap, dict[str, np.ndarray]]:
    """The shared mapping for ``n`` records' columns and its arrays: anonymous, or the
    file ``fd`` (resized to fit when ``size``); with a file, the records themselves too."""
    shapes = [(name, dtype, (n,)) for name, dtype in _FIELDS]
    shapes += [("key", np.uint64, (n, KEY_WIDTH)), ("src_low", np.bool_, (n,)),
               ("key_hash", np.uint64, (n,)),
               ("http_start", np.bool_, (n,)), ("fallback", np.int64, (parts,))]
    if fd is not None:
        shapes.append(("records", np.int64, (n, 4)))
    sizes = [int(np.prod(shape)) * np.dtype(dtype).itemsize for _, dtype, shape in shapes]
    total = max(1, sum(-(-size // 8) * 8 for size in sizes))
    if fd is None:
        area = mmap.mmap(-1, total)
    else:
        if size:
            os.ftruncate(fd, total)
        area = mmap.mmap(fd, total)
    arrays: dict[str, np.ndarray] = {}
    at = 0
    for (name, dtype, shape), size_ in zip(shapes, sizes):
        arrays[name] = np.frombuffer(area, dtype=dtype, count=int(np.prod(shape)),
                                     offset=at).reshape(shape)
        at += -(-size_ // 8) * 8
    return area, arrays
