"""5-tuple keys of decoded packets, as rows of 64-bit words, and their hash.

``key_table(cols, rows)`` gives each packet's 5-tuple as one uint64 row, the same for
both directions (protocol, address length, the lower endpoint's two address words and
port, the higher one's), and whether the packet's source is the lower endpoint;
``row_hash`` a 64-bit hash of each row. Flow grouping (``assemble.py``) groups packets by
them, and the split of a run over processes (``shards.py``, ``shared_decode.py``,
``engines/sharded.py``) places packets by the hash. O(packets): one gather of the two
addresses per packet (random reads into the capture, a cache miss each), then column
arithmetic.
"""

from __future__ import annotations

import numpy as np

from .columnar import PacketColumns

KEY_WIDTH = 8  # key_table's columns: protocol, address length, two endpoints of 3 words
GATHER_ROWS = 1 << 15  # packets whose addresses are gathered at once (index: <= 8 MB)


def key_table(cols: PacketColumns, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each packet's 5-tuple as one uint64 row (proto, address length, the lower endpoint's
    two address words and port, the higher one's), the same for both directions; and
    whether the packet's source is the lower endpoint."""
    alen = cols.addr_len[rows]
    (src_hi, src_lo), (dst_hi, dst_lo) = _address_words(cols, rows, alen)
    src = np.column_stack([src_hi, src_lo, cols.sport[rows].astype(np.uint64)])
    dst = np.column_stack([dst_hi, dst_lo, cols.dport[rows].astype(np.uint64)])
    # the endpoint that sorts first, as 3 words, decides the key's orientation
    n = len(rows)
    first_diff = np.argmax(src != dst, axis=1)
    src_low = src[np.arange(n), first_diff] <= dst[np.arange(n), first_diff]
    low = np.where(src_low[:, None], src, dst)
    high = np.where(src_low[:, None], dst, src)
    proto = cols.proto[rows].astype(np.uint64)
    return np.column_stack([proto, alen.astype(np.uint64), low, high]), src_low


def _address_words(cols: PacketColumns, rows: np.ndarray, alen: np.ndarray):
    """The source and destination address of each of ``rows`` as two big-endian 64-bit
    words each (high, low), zero past the address's length (4 or 16 bytes).

    The reads are random accesses into the capture, a cache miss each, so a packet's
    addresses are read in one gather where they lie side by side (as the IP header has
    them: source, then destination): the ``2 * length`` bytes from the source's offset
    as one row of ``[packets, 2 * length]`` indices, ``GATHER_ROWS`` packets at a time.
    A packet whose addresses lie apart
    (one decoded by the reference decoder) has each read on its own."""
    buf = cols.buf
    src_off, dst_off = cols.src_off[rows], cols.dst_off[rows]
    n = len(rows)
    words = [np.zeros(n, dtype=np.uint64) for _ in range(4)]  # src hi, lo, dst hi, lo
    for size, dtype in ((4, ">u4"), (16, ">u8")):
        sized = alen == size
        side_by_side = dst_off == src_off + size
        paired = np.flatnonzero(sized & side_by_side)
        apart = np.flatnonzero(sized & ~side_by_side)
        for rows_of, spans in ((paired, ((src_off, 2 * size),)),
                               (apart, ((src_off, size), (dst_off, size)))):
            for at in range(0, len(rows_of), GATHER_ROWS):  # bounded index temporaries
                picked = rows_of[at:at + GATHER_ROWS]
                value = np.concatenate([_gather_rows(buf, off[picked], width).view(dtype)
                                        for off, width in spans], axis=1).astype(np.uint64)
                if size == 4:  # one word per address: the high one, its low 32 bits zero
                    words[0][picked] = value[:, 0] << np.uint64(32)
                    words[2][picked] = value[:, 1] << np.uint64(32)
                else:
                    for j in range(4):
                        words[j][picked] = value[:, j]
    return (words[0], words[1]), (words[2], words[3])


def _gather_rows(buf: np.ndarray, offs: np.ndarray, width: int) -> np.ndarray:
    """``[len(offs), width]`` uint8: ``buf[off:off + width]`` for each offset (clamped to
    the buffer: a row past its end reads its last byte)."""
    return buf[np.minimum(offs[:, None] + np.arange(width), len(buf) - 1)]


def row_hash(table: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of the uint64 ``table`` (multiply-xorshift per column)."""
    h = np.zeros(len(table), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for col in table.T:
            h = (h ^ col) * np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(29)
    return h
