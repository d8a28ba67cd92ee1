"""The records of pcap and pcapng files: walk a capture file and yield its frames.

``records(path, malformed)`` yields ``(ts_us, frame, linktype)`` for every
packet record a capture file holds. It never trusts a length it has not
checked, and never loses a record silently:

* **pcap**: a record whose captured length exceeds 262,144 bytes (libpcap's
  ``MAXIMUM_SNAPLEN``, above which libpcap itself refuses the file for these
  link types) is counted as ``oversized_record``; one whose captured length
  exceeds its original length (no capture tool writes that) as
  ``bad_record_header``. Either way the reader *resynchronises*: it looks, in
  the 262,144 bytes after the bad header, for the first offset where a
  plausible record header starts (1 <= caplen <= 262,144, caplen <= original
  length, sub-second field below one second, timestamp within a day of the
  last good record) and the records it frames chain on, two deep, to further
  plausible headers or to the exact end of the file. Where none exists the
  reader stops, and the bytes it could not read are counted
  (``unreadable_bytes``).
  A record whose length runs past the end of the file is ``truncated_file``,
  unless records chain on after it (then its header was bad:
  ``bad_record_header``, and reading goes on there).
* **pcapng**: blocks are walked by their length, which must be at least 12,
  a multiple of 4, and equal to the copy at the block's end; a block whose
  length breaks that, or runs past the end of the file while valid blocks
  follow, is ``BadInput`` naming the file and the block's offset. A packet block whose captured length
  does not fit its block, or that names an interface not described before it,
  is ``bad_record_header``, and the walk goes on with the next block.
  Timestamps honour ``if_tsresol`` and ``if_tsoffset``.
* A record (pcap) or packet block (pcapng) cut by the end of the file is
  ``truncated_file``; any other block cut by it adds its bytes to
  ``unreadable_bytes``.

The keys above ending in ``_bytes`` count bytes; every other one counts packet
records, so that the records of a file are the frames yielded plus the counted
records (``RECORD_REASONS``). A file header that is cut short, has an unknown
version or an unsupported link type is ``BadInput``. O(file size); the file is
memory-mapped, each frame copied once.
"""

from __future__ import annotations

import mmap
import struct
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dl_nfv.artifacts.errors import BadInput

PCAP_MAGICS = {b"\xd4\xc3\xb2\xa1": ("<", 1_000), b"\xa1\xb2\xc3\xd4": (">", 1_000),
               b"\x4d\x3c\xb2\xa1": ("<", 1), b"\xa1\xb2\x3c\x4d": (">", 1)}
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"

DLT_NULL, DLT_EN10MB, DLT_RAW, DLT_LOOP = 0, 1, 101, 108
DLT_LINUX_SLL, DLT_IPV4, DLT_IPV6, DLT_LINUX_SLL2 = 113, 228, 229, 276
LINKTYPES = {DLT_NULL, DLT_EN10MB, DLT_RAW, DLT_LOOP, DLT_LINUX_SLL, DLT_IPV4, DLT_IPV6,
             DLT_LINUX_SLL2}

MAX_CAPLEN = 262_144  # libpcap's MAXIMUM_SNAPLEN for every supported link type
MAX_PACKET_BLOCK = 28 + MAX_CAPLEN + 65_536  # an EPB: header, the data, generous options
WALK_STEP = 8 << 20  # capture bytes walked between two releases of their pages
RECORD_REASONS = ("truncated_file", "oversized_record", "bad_record_header")
DAY_S = 86_400

_SHB, _IDB, _PB, _SPB, _EPB = 0x0A0D0D0A, 1, 2, 3, 6
_PACKET_BLOCKS = (_PB, _SPB, _EPB)


def sniff_format(path: str | Path) -> str:
    """``"pcap"`` or ``"pcapng"`` from the file's magic; ``BadInput`` for anything else."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, not a pcap file") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror}") from None
    if magic in PCAP_MAGICS:
        return "pcap"
    if magic == PCAPNG_MAGIC:
        return "pcapng"
    raise BadInput(f"{path}: not a pcap or pcapng file (magic {magic.hex() or 'empty'}; "
                   f"expected a1b2c3d4, a1b23c4d or 0a0d0d0a)")


def _check_linktype(path: Path, linktype: int) -> None:
    if linktype not in LINKTYPES:
        raise BadInput(f"{path}: unsupported link type {linktype} "
                       f"(supported: Ethernet, raw IP, Linux cooked, loopback)")


def records(path: str | Path, malformed: Counter) -> Iterator[tuple[int, bytes, int]]:
    """Yield ``(ts_us, frame, linktype)`` for every readable packet record of ``path``.

    Unreadable records and bytes are counted in ``malformed`` (see the module
    docstring); ``BadInput`` for a file that is not a capture, a bad file header
    or a bad pcapng block length.
    """
    with mapped(path) as data:
        for ts_us, start, length, linktype in spans(path, data, malformed):
            yield ts_us, data[start:start + length], linktype


@contextmanager
def mapped(path: str | Path) -> Iterator[mmap.mmap | bytes]:
    """The capture file's bytes, memory-mapped read-only (``BadInput`` as ``sniff_format``)."""
    path = Path(path)
    sniff_format(path)  # an empty file has no magic: BadInput before mapping it
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        yield data


def open_mapped(path: str | Path) -> mmap.mmap:
    """The capture file's bytes, memory-mapped read-only, for as long as anything uses them
    (numpy views keep the mapping alive; it is unmapped when the last one goes)."""
    path = Path(path)
    sniff_format(path)
    with path.open("rb") as fh:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def release_pages(data, end: int | None = None) -> None:
    """Drop the resident pages of the mapped capture ``data`` below ``end`` (all of them by
    default) from this process's memory: a read-only file mapping reads them back from the
    page cache when touched again, so nothing changes but the resident size. Not a
    mapping (a copy of the file in memory): nothing to drop."""
    if not isinstance(data, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return
    end = len(data) if end is None else end - end % mmap.PAGESIZE
    if end > 0:
        data.madvise(mmap.MADV_DONTNEED, 0, end)


def release_freed() -> None:
    """Hand the memory this process has freed back to the system (glibc's
    ``malloc_trim``): the allocator keeps freed blocks for reuse, and after the
    packet path's temporaries (per-packet arrays, sort orders, the framing's records)
    that is tens of megabytes resident that no later stage would reuse whole. Elsewhere
    than glibc nothing happens. Milliseconds: the later stages fault in again only the
    pages they use."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _malloc_trim():
    """glibc's ``malloc_trim`` (ctypes, which numpy has imported already), or None."""
    if not _TRIM:
        import ctypes

        try:
            _TRIM.append(ctypes.CDLL(None).malloc_trim)
        except (OSError, AttributeError):
            _TRIM.append(None)
    return _TRIM[0]


_TRIM: list = []


def span_table(path: str | Path, data, malformed: Counter) -> np.ndarray:
    """``spans`` as one [records, 4] int64 array (timestamp, offset, length, link type).
    The walk reads every page of the capture; the pages it has passed are released a
    ``WALK_STEP`` at a time (``release_pages``), so a mapped capture is never resident
    whole."""
    path = Path(path)
    if bytes(data[:4]) in PCAP_MAGICS:
        return _pcap_table(path, data, malformed)
    table = array("q")
    blocks = _pcapng(path, data, malformed)
    release = WALK_STEP
    for record in blocks:
        table.extend(record)
        if record[1] > release:
            release_pages(data, record[1])
            release = record[1] + WALK_STEP
    release_pages(data)
    return np.frombuffer(table, dtype=np.int64).reshape(-1, 4)


def spans(path: str | Path, data, malformed: Counter) -> Iterator[tuple[int, int, int, int]]:
    """Yield ``(ts_us, offset, length, linktype)`` of every readable packet record of the
    capture ``data`` (from ``mapped``): where each frame lies in the file, nothing copied.
    Counting and errors as ``records``."""
    path = Path(path)
    if bytes(data[:4]) in PCAP_MAGICS:
        yield from _pcap(path, data, malformed)
    else:
        yield from _pcapng(path, data, malformed)


# pcap -----------------------------------------------------------------------------
def _pcap(path: Path, data: mmap.mmap, malformed: Counter) -> Iterator[tuple[int, int, int, int]]:
    yield from map(tuple, _pcap_table(path, data, malformed).tolist())


def _pcap_table(path: Path, data, malformed: Counter) -> np.ndarray:
    """[records, 4] int64: timestamp (us), frame offset, frame length, link type of every
    readable record. The walk is one tight loop that keeps where each header starts; the
    headers' fields are then read as arrays."""
    layout = pcap_layout(path, data)
    tables = [np.zeros((0, 4), dtype=np.int64)]
    pos, last_sec = 24, None
    while pos is not None:  # a step at a time: its rows read while its pages are resident
        walk = walk_pcap(data, layout, pos, min(pos + WALK_STEP, len(data)), last_sec,
                         malformed)
        tables.append(pcap_rows(data, layout, walk.heads))
        pos, last_sec = walk.next_pos, walk.last_sec
        release_pages(data, pos)
    return np.concatenate(tables)


@dataclass(frozen=True, slots=True)
class PcapLayout:
    """What a pcap's file header says about its records."""

    header: struct.Struct  # a record header: seconds, sub-seconds, captured, original length
    units: int  # sub-second units per second
    ns_per_unit: int
    linktype: int


def pcap_layout(path: Path, data) -> PcapLayout:
    """The layout of the pcap ``data``; ``BadInput`` for a header cut short, another
    version than 2.x or an unsupported link type."""
    size = len(data)
    if size < 24:
        raise BadInput(f"{path}: pcap file header cut short ({size} of 24 bytes)")
    order, ns_per_unit = PCAP_MAGICS[bytes(data[:4])]
    major, minor, _, _, _, linktype = struct.unpack_from(order + "HHiIII", data, 4)
    if major != 2:
        raise BadInput(f"{path}: unsupported pcap version {major}.{minor} (expected 2.x)")
    linktype &= 0xFFFF  # the upper bits carry FCS information (LT_LINKTYPE)
    _check_linktype(path, linktype)
    return PcapLayout(struct.Struct(order + "IIII"), 1_000_000_000 // ns_per_unit, ns_per_unit,
                      linktype)


@dataclass(slots=True)
class PcapWalk:
    """The records a walk read: where each header starts, where the walk stopped (the first
    header at or past its ``stop``; None when it reached the end of the file or could not
    go on) and the last good record's seconds (the resynchronisation's reference)."""

    heads: np.ndarray
    next_pos: int | None
    last_sec: int | None
    rows: np.ndarray | None = None  # ``pcap_rows`` of the heads, where already read


def walk_rows(data, layout: PcapLayout, walks: list[PcapWalk]) -> np.ndarray:
    """``pcap_rows`` of the records of ``walks`` (those a walk holds already as they are)."""
    return np.concatenate([np.zeros((0, 4), dtype=np.int64)] + [
        w.rows if w.rows is not None else pcap_rows(data, layout, w.heads) for w in walks])


def walk_pcap(data, layout: PcapLayout, pos: int, stop: int, last_sec: int | None,
              malformed: Counter) -> PcapWalk:
    """Walk the records whose headers start in ``[pos, stop)`` (the last may end past
    ``stop``), resynchronising after bad headers; what it cannot read counted in
    ``malformed``. Walks that start where another stopped, with its ``last_sec``, read
    what one walk over both ranges reads. The loop per record reads only the two lengths
    and keeps where the header starts (the other fields are read as arrays afterwards,
    ``pcap_rows``); the last good record's seconds are read where needed."""
    size = len(data)
    header, units = layout.header, layout.units
    lengths = struct.Struct(header.format[0] + "II").unpack_from  # caplen, original length
    heads = array("q")  # where each readable record's header starts
    append = heads.append

    def last_good_sec() -> int | None:
        return header.unpack_from(data, heads[-1])[0] if heads else last_sec

    while pos < stop:
        if pos + 16 > size:
            malformed["truncated_file"] += 1
            pos = None
            break
        caplen, origlen = lengths(data, pos + 8)
        end = pos + 16 + caplen
        if caplen > MAX_CAPLEN or caplen > origlen or end > size:
            bad = ("oversized_record" if caplen > MAX_CAPLEN else
                   "bad_record_header" if caplen > origlen else None)
            nxt = _resync(data, pos + 16, header, units, last_good_sec())
            if bad is None:  # past the end: a cut file, unless records follow after all
                malformed["truncated_file" if nxt is None else "bad_record_header"] += 1
            else:
                malformed[bad] += 1
                if nxt is None:
                    malformed["unreadable_bytes"] += size - pos - 16
            pos = nxt
            if nxt is None:
                break
            continue
        append(pos)
        pos = end
    return PcapWalk(np.frombuffer(heads, dtype=np.int64), pos if pos is None or pos < size
                    else None, last_good_sec())


def walk_pcap_part(data, layout: PcapLayout, edges: list[int], k: int, malformed: Counter
                   ) -> tuple[int | None, PcapWalk]:
    """Walk ``k`` of a walk split at the byte offsets ``edges`` (``edges[0]`` 24, the file
    header's end; the last the file's size): the records whose headers start in
    ``[edges[k], edges[k + 1])``, the walk starting, after the first, at the first offset
    where plausible record headers chain on (the resynchronisation's test); where it
    started (None: nowhere) and the walk. ``join_walks`` joins such walks."""
    first = edges[0] if k == 0 else _resync(data, edges[k], layout.header, layout.units, None)
    if first is None:
        return None, PcapWalk(np.zeros(0, dtype=np.int64), None, None)
    return first, walk_pcap(data, layout, first, edges[k + 1], None, malformed)


def join_walks(data, layout: PcapLayout, walk: PcapWalk,
               later: Iterable[tuple[int | None, PcapWalk, Counter]], malformed: Counter
               ) -> list[PcapWalk]:
    """The walks whose records (in order) one walk of the whole file finds, from the first
    part's ``walk``
    and the later parts' (``walk_pcap_part``: start, walk, its counts, in order; every one
    is consumed). A part counts when the walk before it stopped exactly where it started
    (from there on both read the same records, a good one first); otherwise the walk goes
    on from where the last one stopped, to the end of the file, and the later parts are
    not used. Counts of the parts used are added to ``malformed``."""
    walks = [walk]
    for first, part, counts in later:
        if walk.next_pos is None:  # the walk ended before this part
            continue
        if first == walk.next_pos:
            malformed.update(counts)
            walk = part
        else:  # the walks did not meet
            walk = walk_pcap(data, layout, walk.next_pos, len(data), walk.last_sec, malformed)
        walks.append(walk)
    return walks


def pcap_rows(data, layout: PcapLayout, heads: np.ndarray) -> np.ndarray:
    """[records, 4] int64 (timestamp in us, frame offset, frame length, link type) of the
    records whose headers start at ``heads``: their fields read as arrays."""
    at = heads
    fields = np.frombuffer(data, dtype=np.uint8)[at[:, None] + np.arange(16)].view(
        np.dtype(layout.header.format[0] + "u4")).astype(np.int64)
    table = np.empty((len(at), 4), dtype=np.int64)
    table[:, 0] = fields[:, 0] * 1_000_000 + (fields[:, 1] * layout.ns_per_unit + 500) // 1000
    table[:, 1] = at + 16
    table[:, 2] = fields[:, 2]
    table[:, 3] = layout.linktype
    return table


def _plausible(header: struct.Struct, data, at: int, units: int, last_sec: int | None) -> int:
    """The end of the record whose header is at ``at`` if the header is plausible, else -1."""
    if at + 16 > len(data):
        return -1
    sec, frac, caplen, origlen = header.unpack_from(data, at)
    if not 1 <= caplen <= MAX_CAPLEN or caplen > origlen or frac >= units:
        return -1
    if last_sec is not None and abs(sec - last_sec) > DAY_S:
        return -1
    end = at + 16 + caplen
    return end if end <= len(data) else -1


def _chains(header: struct.Struct, data, at: int, units: int, last_sec: int | None,
            depth: int = 2) -> bool:
    end = _plausible(header, data, at, units, last_sec)
    if end < 0:
        return False
    return end == len(data) or depth == 0 or _chains(header, data, end, units, last_sec,
                                                      depth - 1)


def _resync(data, start: int, header: struct.Struct, units: int,
            last_sec: int | None) -> int | None:
    """The first offset in ``[start, start + MAX_CAPLEN]`` where records chain on safely.

    Candidates are screened with numpy (every byte offset's would-be caplen,
    original length and sub-second field at once); only those are chained.
    """
    stop = min(len(data), start + MAX_CAPLEN + 16)
    window = np.frombuffer(data[start:stop], dtype=np.uint8)
    n = len(window) - 15
    if n <= 0:
        return None
    words = np.zeros(len(window) - 3, dtype=np.uint64)
    dtype = np.dtype(header.format[0] + "u4")
    for k in range(4):
        lane = window[k:k + 4 * ((len(window) - k) // 4)].view(dtype)
        words[k::4] = lane[:len(words[k::4])]
    frac, caplen, origlen = words[4:n + 4], words[8:n + 8], words[12:n + 12]
    ok = (caplen >= 1) & (caplen <= MAX_CAPLEN) & (caplen <= origlen) & (frac < units)
    for offset in np.flatnonzero(ok).tolist():
        if _chains(header, data, start + offset, units, last_sec):
            return start + offset
    return None


# pcapng ---------------------------------------------------------------------------
class _Interface:
    __slots__ = ("linktype", "snaplen", "per_second", "offset_s")

    def __init__(self, linktype: int, snaplen: int):
        self.linktype = linktype
        self.snaplen = snaplen
        self.per_second = 1_000_000  # if_tsresol: timestamp units per second
        self.offset_s = 0  # if_tsoffset

    def ts_us(self, ts: int) -> int:
        return self.offset_s * 1_000_000 + (ts * 1_000_000 + self.per_second // 2) // self.per_second


def _options(data, start: int, end: int, order: str) -> Iterator[tuple[int, bytes]]:
    """(code, value) of the options in ``data[start:end]``; stops at opt_endofopt or a
    malformed option (options never decide where the next block starts)."""
    while start + 4 <= end:
        code, length = struct.unpack_from(order + "HH", data, start)
        if code == 0 or start + 4 + length > end:
            return
        yield code, bytes(data[start + 4:start + 4 + length])
        start += 4 + (length + 3) // 4 * 4


def _interface(data, pos: int, length: int, order: str) -> _Interface:
    linktype, _, snaplen = struct.unpack_from(order + "HHI", data, pos + 8)
    iface = _Interface(linktype, snaplen)
    for code, value in _options(data, pos + 16, pos + length - 4, order):
        if code == 9 and len(value) >= 1:  # if_tsresol
            exp = value[0] & 0x7F
            if exp <= 60:
                iface.per_second = 2 ** exp if value[0] & 0x80 else 10 ** min(exp, 18)
        elif code == 14 and len(value) >= 8:  # if_tsoffset, seconds
            iface.offset_s = struct.unpack(order + "q", value[:8])[0]
    return iface


def _pcapng(path: Path, data: mmap.mmap, malformed: Counter
            ) -> Iterator[tuple[int, int, int, int]]:
    size = len(data)
    if size < 28:
        raise BadInput(f"{path}: pcapng file header cut short ({size} of at least 28 bytes)")
    pos, order = 0, "<"
    interfaces: list[_Interface] = []
    while pos < size:
        if pos + 8 > size:
            _cut(data, pos, order, malformed)
            return
        if bytes(data[pos:pos + 4]) == PCAPNG_MAGIC:  # a section starts: byte order, interfaces
            if pos + 12 > size:
                _cut(data, pos, order, malformed)
                return
            bom = bytes(data[pos + 8:pos + 12])
            if bom not in (b"\x4d\x3c\x2b\x1a", b"\x1a\x2b\x3c\x4d"):
                raise BadInput(f"{path}: pcapng section header at offset {pos}: bad byte-order "
                               f"magic {bom.hex()} (expected 1a2b3c4d)")
            order = "<" if bom[0] == 0x4D else ">"
            interfaces = []
        kind, length = struct.unpack_from(order + "II", data, pos)
        if length < 12 or length % 4 or (length > size - pos and length > MAX_PACKET_BLOCK):
            raise BadInput(f"{path}: pcapng block at offset {pos}: bad block length {length} "
                           f"({size - pos} bytes left in the file)")
        if length > size - pos:
            if _next_block(data, pos + 4, order) is not None:  # blocks follow: not a cut
                raise BadInput(f"{path}: pcapng block at offset {pos}: bad block length "
                               f"{length} ({size - pos} bytes left in the file)")
            if pos == 0:
                raise BadInput(f"{path}: pcapng section header cut short ({size} of {length} "
                               f"bytes)")
            _cut(data, pos, order, malformed)
            return
        if struct.unpack_from(order + "I", data, pos + length - 4)[0] != length:
            raise BadInput(f"{path}: pcapng block at offset {pos}: block length {length} does "
                           f"not match the copy at the block's end")
        if kind == _SHB and length < 28:
            raise BadInput(f"{path}: pcapng section header at offset {pos}: block length "
                           f"{length} is shorter than a section header (28)")
        if kind == _IDB:
            if length < 20:
                raise BadInput(f"{path}: pcapng interface block at offset {pos}: block length "
                               f"{length} is shorter than an interface description (20)")
            iface = _interface(data, pos, length, order)
            _check_linktype(path, iface.linktype)
            interfaces.append(iface)
        elif kind in _PACKET_BLOCKS:
            record = _packet(data, pos, kind, length, order, interfaces)
            if record is None:
                malformed["bad_record_header"] += 1
            else:
                yield record
        pos += length


def _packet(data, pos: int, kind: int, length: int, order: str,
            interfaces: list[_Interface]) -> tuple[int, int, int, int] | None:
    """(ts_us, frame offset, frame length, linktype) of an EPB, SPB or PB, or None when its
    header is inconsistent."""
    if kind == _SPB:
        if length < 16 or not interfaces:
            return None
        iface = interfaces[0]
        (origlen,) = struct.unpack_from(order + "I", data, pos + 8)
        caplen = min(origlen, length - 16)
        if iface.snaplen:
            caplen = min(caplen, iface.snaplen)
        return 0, pos + 12, caplen, iface.linktype
    if length < 32:
        return None
    if kind == _EPB:
        number, hi, lo, caplen, origlen = struct.unpack_from(order + "IIIII", data, pos + 8)
    else:  # the obsolete Packet Block: a 16-bit interface id and a drops count
        number, _, hi, lo, caplen, origlen = struct.unpack_from(order + "HHIIII", data, pos + 8)
    if number >= len(interfaces) or caplen > MAX_CAPLEN or 28 + caplen > length - 4:
        return None
    iface = interfaces[number]
    return iface.ts_us((hi << 32) | lo), pos + 28, caplen, iface.linktype


_KNOWN_BLOCKS = np.array([_SHB, _IDB, _PB, _SPB, 4, 5, _EPB, 7, 9, 10, 0xBAD, 0x40000BAD],
                         dtype=np.uint32)


def _block_chains(data, at: int, order: str, depth: int = 2) -> bool:
    """A block of a known type starts at ``at``, its two length fields agree, and the
    blocks after it chain on the same way (``depth`` deep) or end the file exactly."""
    if at + 12 > len(data):
        return False
    kind, length = struct.unpack_from(order + "II", data, at)
    if length < 12 or length % 4 or at + length > len(data) or kind not in _KNOWN_BLOCKS:
        return False
    if struct.unpack_from(order + "I", data, at + length - 4)[0] != length:
        return False
    end = at + length
    return end == len(data) or depth == 0 or _block_chains(data, end, order, depth - 1)


def _next_block(data, start: int, order: str) -> int | None:
    """The first 4-aligned offset after ``start`` where pcapng blocks chain on safely."""
    first = (start + 3) // 4 * 4
    words = np.frombuffer(data[first:len(data) - (len(data) - first) % 4],
                          dtype=np.dtype(order + "u4"))
    if len(words) < 3:
        return None
    kinds, lengths = words[:-1], words[1:]
    ok = np.isin(kinds, _KNOWN_BLOCKS) & (lengths >= 12) & (lengths % 4 == 0)
    for i in np.flatnonzero(ok).tolist():
        if _block_chains(data, first + 4 * i, order):
            return first + 4 * i
    return None


def _cut(data, pos: int, order: str, malformed: Counter) -> None:
    """The file ends inside the block at ``pos``: a cut packet block is a truncated record,
    anything else unreadable bytes."""
    kind = struct.unpack_from(order + "I", data, pos)[0] if pos + 4 <= len(data) else None
    if kind in _PACKET_BLOCKS:
        malformed["truncated_file"] += 1
    else:
        malformed["unreadable_bytes"] += len(data) - pos
