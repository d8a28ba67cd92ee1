"""What an NF is handed: the messages of a flow, as events from the traffic layer.

The traffic layer (``nfv/traffic``: one pcap reader, one flow table, TCP
reassembly, HTTP/1.1 framing) turns a trace into flows and in-order messages.
An NF registers the events it wants; a message of no registered event passes
the NF untouched (forwarded in its place in the flow's order):

- ``REQUEST`` / ``RESPONSE``: a framed HTTP/1.1 message;
- ``DATA``: a turn of a non-HTTP TCP flow, or a UDP datagram;
- ``FILE``: an HTTP response with a body; ``Message.body`` is the file the
  body carries (chunked transfer coding removed).

A flow's *open* is the code an NF runs before its first message, its *close*
the code after the last (after the flow table saw it end: FIN from both
sides, RST, idle timeout or the end of the trace).
"""

from __future__ import annotations

from dataclasses import dataclass

REQUEST, RESPONSE, DATA, FILE = "request", "response", "data", "file"
EVENTS = (REQUEST, RESPONSE, DATA, FILE)
_KIND_EVENT = {0: DATA, 1: REQUEST, 2: RESPONSE}


@dataclass(slots=True, eq=False)
class Message:
    """One reassembled message: ``flow`` id, ``index`` within the flow (its order),
    ``direction`` (0 client to server), traffic-layer ``kind`` (0 data, 1 request,
    2 response), the bytes and the HTTP header length."""

    flow: int
    index: int
    direction: int
    kind: int
    payload: bytes
    header_len: int
    ts_us: int

    @property
    def is_file(self) -> bool:
        """A response that carries a body (a file extracted from it)."""
        return self.kind == 2 and len(self.payload) > self.header_len

    def matches(self, events: frozenset) -> bool:
        if _KIND_EVENT[self.kind] in events:
            return True
        return FILE in events and self.is_file

    def header(self, name: str) -> str | None:
        """The value of HTTP header ``name`` (case-insensitive), or None."""
        want = name.lower().encode() + b":"
        for line in self.payload[:self.header_len].split(b"\r\n")[1:]:
            if line[:len(want)].lower() == want:
                return line[len(want):].strip().decode("latin-1")
        return None

    @property
    def body(self) -> bytes:
        """The HTTP body with any chunked transfer coding removed."""
        raw = self.payload[self.header_len:]
        coding = self.header("transfer-encoding")
        if coding and coding.lower().split(",")[-1].strip() == "chunked":
            return dechunk(raw)
        return raw


def dechunk(raw: bytes) -> bytes:
    """The data of a chunked body (RFC 9112 section 7.1); stops at the last chunk or at
    the first malformed chunk size."""
    out, pos = [], 0
    while True:
        eol = raw.find(b"\r\n", pos)
        if eol < 0:
            break
        try:
            size = int(raw[pos:eol].split(b";", 1)[0].strip(), 16)
        except ValueError:
            break
        if size <= 0:
            break
        out.append(raw[eol + 2:eol + 2 + size])
        pos = eol + 4 + size
    return b"".join(out)
