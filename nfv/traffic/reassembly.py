"""TCP reassembly of one direction of a connection into an in-order byte stream.

Handles retransmissions (whole segment already delivered), overlaps (the part
already delivered is trimmed; for bytes held out of order the first copy
received wins), out-of-order segments (held until the hole before them is
filled, up to ``window_bytes`` ahead), missing segments (reported as a gap when
the stream is flushed), sequence-number wrap-around, SYN (sets the initial
sequence number) and mid-stream pick-up (no SYN seen: the first data segment
starts the stream). For consistent data, the delivered stream does not depend
on the order the segments arrived in, within the window.
"""

from __future__ import annotations

from collections import Counter

SEQ_MOD = 1 << 32
HALF = 1 << 31


class Stream:
    """One direction's reassembly state.

    ``add`` returns the newly in-order chunks as ``(stream_offset, bytes)``;
    ``flush`` returns the bytes held beyond a hole (and the hole size) when the
    connection ends. Amortised O(segment length + log pending) per segment.
    """

    __slots__ = ("isn", "next_offset", "pending", "window_bytes", "stats", "fin_offset")

    def __init__(self, stats: Counter, window_bytes: int = 1 << 20):
        self.isn: int | None = None
        self.next_offset = 0
        self.pending: dict[int, bytes] = {}
        self.window_bytes = window_bytes
        self.stats = stats
        self.fin_offset: int | None = None

    def mark_fin(self, seq: int, data_len: int, syn: bool = False) -> None:
        """Remember where the stream ends (the FIN's sequence number)."""
        if self.isn is None:
            self.isn = (seq + (1 if syn else 0)) % SEQ_MOD
        offset = (seq + (1 if syn else 0) - self.isn) % SEQ_MOD
        if offset >= HALF:
            offset -= SEQ_MOD
        end = offset + data_len
        if self.fin_offset is None or end < self.fin_offset:
            self.fin_offset = end

    @property
    def complete(self) -> bool:
        """A FIN was seen and every byte before it has been delivered."""
        return self.fin_offset is not None and self.next_offset >= self.fin_offset

    def add(self, seq: int, data: bytes, syn: bool = False) -> list[tuple[int, bytes]]:
        if syn:
            if self.isn is None:
                self.isn = (seq + 1) % SEQ_MOD
            seq = (seq + 1) % SEQ_MOD
        if not data:
            return []
        if self.isn is None:
            self.isn = seq
        offset = (seq - self.isn) % SEQ_MOD
        if offset >= HALF:  # before the stream start: an old retransmission
            offset -= SEQ_MOD
        end = offset + len(data)
        if end <= self.next_offset:
            self.stats["tcp_retransmissions"] += 1
            return []
        if offset < self.next_offset:
            self.stats["tcp_overlaps"] += 1
            data = data[self.next_offset - offset:]
            offset = self.next_offset
        if offset > self.next_offset:
            if offset - self.next_offset > self.window_bytes:
                self.stats["tcp_out_of_window"] += 1
                return []
            held = self.pending.get(offset)
            if held is None or len(held) < len(data):
                if held is not None:
                    data = held + data[len(held):]
                self.pending[offset] = data
            else:
                self.stats["tcp_retransmissions"] += 1
            self.stats["tcp_out_of_order"] += 1
            return []
        out = [(offset, data)]
        self.next_offset = end
        if self.pending:
            out.extend(self._release())
        return out

    def _release(self) -> list[tuple[int, bytes]]:
        out = []
        for offset in sorted(self.pending):
            if offset > self.next_offset:
                break
            data = self.pending.pop(offset)
            end = offset + len(data)
            if end <= self.next_offset:
                continue
            if offset < self.next_offset:
                data = data[self.next_offset - offset:]
                offset = self.next_offset
            out.append((offset, data))
            self.next_offset = end
        return out

    def flush(self) -> tuple[int, list[tuple[int, bytes]]]:
        """At connection end: skip holes; return (missing bytes, chunks after the holes)."""
        missing = 0
        out = []
        while self.pending:
            first = min(self.pending)
            if first > self.next_offset:
                missing += first - self.next_offset
                self.next_offset = first
            out.extend(self._release())
        if missing:
            self.stats["tcp_missing_bytes"] += missing
            self.stats["tcp_gaps"] += 1
        return missing, out
