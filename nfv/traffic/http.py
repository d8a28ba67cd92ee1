"""HTTP/1.1 message framing over one direction of a reassembled TCP stream.

A framer is fed in-order bytes and returns complete messages (start offset in
the stream, bytes, header length, kind). Bodies are framed by ``Transfer-Encoding:
chunked``, ``Content-Length``, the request method (responses to HEAD have no
body), the status (1xx, 204, 304 have no body) or, for a response with neither
header, by the end of the connection. Pipelined requests are framed one after
the other; responses are paired with requests in order. A framing error
(bad start line, bad length, bad chunk size, header too long, a hole in the
stream) is counted by reason and stops framing of that direction, never
raised. Bytes framing cannot place are still delivered, as *raw* messages
(kind ``RAW``, no header) in stream order: the bytes held when framing stopped,
then every later chunk of that direction, and a partial message left at the
end of the stream; they are counted as ``http_unframed_bytes``. So every byte
of the stream reaches the NFs (the IDS matches raw messages like any other).
"""

from __future__ import annotations

import re
from collections import Counter, deque

METHODS = (b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH", b"CONNECT",
           b"TRACE")
MAX_HEADER_BYTES = 64 * 1024
_REQUEST_LINE = re.compile(rb"^([A-Z]{1,16}) (\S+) HTTP/1\.[01]$")
_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] ([0-9]{3})(?: .*)?$")

RAW, REQUEST, RESPONSE = 0, 1, 2  # message kinds (RAW: bytes HTTP framing could not place)


def looks_like_http_request(data: bytes) -> bool:
    """True when ``data`` starts with a known HTTP method and a space."""
    head = data[:8]
    return any(head.startswith(m + b" ") for m in METHODS)


class Framer:
    """Frame one direction. ``requests`` is the FIFO of request methods that pairs
    responses with requests; the request side pushes, the response side pops."""

    __slots__ = ("side", "requests", "buf", "base", "scan", "stats", "broken", "_header",
                 "_body", "_need", "_chunk_pos", "_raw", "longest_chunk_line")

    def __init__(self, side: int, requests: deque, stats: Counter):
        self.side = side
        self.requests = requests
        self.buf = bytearray()
        self.base = 0  # stream offset of buf[0]
        self.scan = 0
        self.stats = stats
        self.broken = False
        self._header = 0  # header length of the message being read (0: still in the header)
        self._body: str = ""
        self._need = 0
        self._chunk_pos = 0
        self._raw: list[tuple[int, bytes, int, int]] = []  # raw messages not yet returned
        self.longest_chunk_line = 0  # bytes before the CRLF of the longest chunk-size line

    def feed(self, data: bytes, offset: int | None = None) -> list[tuple[int, bytes, int, int]]:
        """Add in-order bytes (``offset``: their stream offset, when known); return the
        completed ``(offset, payload, header_len, kind)``, raw messages included."""
        if self.broken:
            return [self._raw_message(self.base if offset is None else offset, data)]
        self.buf += data
        out = []
        while True:
            msg = self._next()
            if msg is None:
                break
            out.append(msg)
        if self._raw:
            out.extend(self._raw)
            self._raw.clear()
        return out

    def _raw_message(self, offset: int, data: bytes) -> tuple[int, bytes, int, int]:
        self.stats["http_unframed_bytes"] += len(data)
        self.base = offset + len(data)
        return offset, bytes(data), 0, RAW

    def _fail(self, reason: str) -> None:
        self.stats[reason] += 1
        if self.buf:
            self._raw.append(self._raw_message(self.base, self.buf))
        self.buf.clear()
        self.broken = True

    def _complete(self, length: int) -> tuple[int, int, int, int]:
        msg = (self.base, bytes(self.buf[:length]), self._header, self.side)
        del self.buf[:length]
        self.base += length
        self.scan = 0
        self._header = 0
        self._body = ""
        return msg

    def _next(self):
        if self.broken:
            return None
        if not self._header:
            end = self.buf.find(b"\r\n\r\n", max(0, self.scan - 3))
            if end < 0:
                if len(self.buf) > MAX_HEADER_BYTES:
                    self._fail("http_header_too_long")
                self.scan = len(self.buf)
                return None
            if not self._parse_header(end + 4):
                return None
        if self._body == "none":
            return self._complete(self._header)
        if self._body == "length":
            if len(self.buf) >= self._header + self._need:
                return self._complete(self._header + self._need)
            return None
        if self._body == "chunked":
            return self._chunked()
        return None  # "close": completes at the end of the stream

    def _parse_header(self, header_len: int) -> bool:
        head = bytes(self.buf[:header_len - 4])
        lines = head.split(b"\r\n")
        start = lines[0]
        if self.side == REQUEST:
            m = _REQUEST_LINE.match(start)
            if not m:
                self._fail("http_bad_start_line")
                return False
            method = m.group(1)
            status = 0
        else:
            m = _STATUS_LINE.match(start)
            if not m:
                self._fail("http_bad_start_line")
                return False
            status = int(m.group(1))
            method = b""
        length = None
        chunked = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                self._fail("http_bad_header_line")
                return False
            name = name.strip().lower()
            if name == b"content-length":
                value = value.strip()
                if not value.isdigit() or len(value) > 15 or (length is not None
                                                              and int(value) != length):
                    self._fail("http_bad_content_length")
                    return False
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = value.strip().lower().split(b",")[-1].strip() == b"chunked"
        self._header = header_len
        if self.side == REQUEST:
            self.requests.append(method)
            self._body = "chunked" if chunked else ("length" if length else "none")
            self._need = length or 0
            return True
        if 100 <= status < 200:
            self._body = "none"
            return True
        request = self.requests.popleft() if self.requests else b""
        if request == b"HEAD" or status in (204, 304):
            self._body = "none"
        elif chunked:
            self._body = "chunked"
        elif length is not None:
            self._body = "length" if length else "none"
            self._need = length
        else:
            self._body = "close"
        self._chunk_pos = header_len
        return True

    def _chunked(self):
        if self._chunk_pos < self._header:
            self._chunk_pos = self._header
        pos = self._chunk_pos
        buf = self.buf
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if len(buf) - pos > 1024:
                    self._fail("http_bad_chunk")
                return None
            self.longest_chunk_line = max(self.longest_chunk_line, eol - pos)
            size_text = bytes(buf[pos:eol]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                self._fail("http_bad_chunk")
                return None
            if size < 0 or len(size_text) > 15:
                self._fail("http_bad_chunk")
                return None
            if size == 0:
                p = eol + 2
                if len(buf) < p + 2:
                    return None
                if buf[p:p + 2] == b"\r\n":
                    total = p + 2
                else:
                    end = buf.find(b"\r\n\r\n", p)
                    if end < 0:
                        return None
                    total = end + 4
                self._chunk_pos = 0
                return self._complete(total)
            if len(buf) < eol + 2 + size + 2:
                self._chunk_pos = pos
                return None
            if buf[eol + 2 + size:eol + 4 + size] != b"\r\n":
                self._fail("http_bad_chunk")
                return None
            pos = eol + 4 + size
            self._chunk_pos = pos

    def finish(self) -> list[tuple[int, bytes, int, int]]:
        """At the end of the stream: a close-delimited body completes; a partial
        message is counted as ``http_incomplete`` and returned as a raw message."""
        if self.broken or not self.buf:
            return []
        if self._header and self._body == "close":
            return [self._complete(len(self.buf))]
        self.stats["http_incomplete"] += 1
        raw = self._raw_message(self.base, self.buf)
        self.buf.clear()
        return [raw]

    def gap(self) -> list[tuple[int, bytes, int, int]]:
        """A hole in the stream: framing cannot continue in this direction. Returns the
        bytes held before the hole as a raw message (or a close-delimited body that the
        hole ends as an incomplete one)."""
        if self.broken:
            return []
        if self._header and self._body == "close":
            self.stats["http_incomplete"] += 1
        self._fail("http_stream_gap")
        out = list(self._raw)
        self._raw.clear()
        return out


# whole streams --------------------------------------------------------------------
def frame_whole(stream: bytes, side: int, methods: deque, begin: int = 0,
                stop: int | None = None) -> list[tuple[int, int, int, bool]] | None:
    """Frame one complete direction held in memory, ``stream[begin:stop]``: ``(start,
    length, header_len, close_delimited)`` per message (``start`` from ``begin``), or None where a ``Framer`` fed the same bytes would
    count anything (a framing error, an incomplete message) or where fed packet by packet
    it could frame differently (a header over ``MAX_HEADER_BYTES``, a chunk-size line over
    ``MAX_CHUNK_LINE`` bytes).

    The same rules as ``Framer`` (the tests compare the two), over offsets into ``stream``
    instead of a growing buffer: no message is copied. ``methods`` pairs responses with
    requests as in ``Framer``: the request side appends, the response side pops.
    O(stream bytes) in C, Python per message.
    """
    out = []
    pos, size = begin, len(stream) if stop is None else stop
    while pos < size:
        end = stream.find(b"\r\n\r\n", pos, size)
        if end < 0 or end + 4 - pos > MAX_HEADER_BYTES:
            return None
        header_len = end + 4 - pos
        body = _header_lines(stream[pos:end].split(b"\r\n"), side, methods)
        if body is None:
            return None
        kind, need = body
        if kind == "close":
            out.append((pos - begin, size - pos, header_len, True))
            return out
        if kind == "chunked":
            done = _whole_chunks(stream, pos + header_len, size)
            if done < 0:
                return None
        else:
            done = pos + header_len + need
            if done > size:
                return None
        out.append((pos - begin, done - pos, header_len, False))
        pos = done
    return out


MAX_CHUNK_LINE = 1023  # a longer chunk-size line can fail framing fed packet by packet


def _header_lines(lines: list[bytes], side: int, methods: deque) -> tuple[str, int] | None:
    """``Framer._parse_header`` over the header's lines: how the body is framed (kind,
    length), or None where the framer fails."""
    if side == REQUEST:
        m = _REQUEST_LINE.match(lines[0])
    else:
        m = _STATUS_LINE.match(lines[0])
    if not m:
        return None
    length = None
    chunked = False
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            return None
        if len(name) < 14:  # shorter than both names, blanks included: neither
            continue
        name = name.strip().lower()
        if name == b"content-length":
            value = value.strip()
            if not value.isdigit() or len(value) > 15 or (length is not None
                                                          and int(value) != length):
                return None
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value.strip().lower().split(b",")[-1].strip() == b"chunked"
    status = int(m.group(1)) if side == RESPONSE else 0
    if side == REQUEST:
        methods.append(m.group(1))
        return ("chunked", 0) if chunked else ("length", length or 0)
    if 100 <= status < 200:
        return "length", 0
    request = methods.popleft() if methods else b""
    if request == b"HEAD" or status in (204, 304):
        return "length", 0
    if chunked:
        return "chunked", 0
    if length is not None:
        return "length", length
    return "close", 0


def _whole_chunks(stream: bytes, pos: int, size: int) -> int:
    """``Framer._chunked`` from the first chunk at ``pos`` (the stream ends at ``size``):
    the end of the message, or -1."""
    while True:
        eol = stream.find(b"\r\n", pos, size)
        if eol < 0 or eol - pos > MAX_CHUNK_LINE:
            return -1
        size_text = stream[pos:eol].split(b";", 1)[0].strip()
        try:
            chunk = int(size_text, 16)
        except ValueError:
            return -1
        if chunk < 0 or len(size_text) > 15:
            return -1
        if chunk == 0:
            p = eol + 2
            if size < p + 2:
                return -1
            if stream[p:p + 2] == b"\r\n":
                return p + 2
            end = stream.find(b"\r\n\r\n", p, size)
            return -1 if end < 0 else end + 4
        if size < eol + 4 + chunk or stream[eol + 2 + chunk:eol + 4 + chunk] != b"\r\n":
            return -1
        pos = eol + 4 + chunk
