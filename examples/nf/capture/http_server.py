"""A small real HTTP/1.1 server (Python's http.server) for capturing loopback traffic.

Keep-alive HTTP/1.1; GET serves generated pages (Content-Length), /chunked/*
answers with Transfer-Encoding: chunked, HEAD has no body, POST echoes a
summary of the body, unknown paths give 404. Run:
``python http_server.py PORT``; stop it with SIGTERM.
"""

from __future__ import annotations

import hashlib
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def page(path: str) -> bytes:
    seed = hashlib.sha256(path.encode()).hexdigest()
    words = [seed[i:i + 6] for i in range(0, 60, 6)]
    size = 200 + int(seed[:4], 16) % 6000
    text = " ".join(words * (size // 60 + 1))[:size]
    return f"<html><head><title>{path}</title></head><body><p>{text}</p></body></html>\n".encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "dl-nfv-capture/1.0"

    def log_message(self, *args) -> None:  # keep the capture script quiet
        pass

    def _send(self, status: int, body: bytes, chunked: bool = False, head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/html")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return
        if chunked:
            for i in range(0, len(body), 700):
                piece = body[i:i + 700]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.startswith("/missing"):
            self._send(404, b"not found\n")
        else:
            self._send(200, page(self.path), chunked=self.path.startswith("/chunked/"))

    def do_HEAD(self) -> None:
        self._send(200, page(self.path), head=True)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        digest = hashlib.sha256(body).hexdigest()
        self._send(200, f"received {len(body)} bytes, sha256 {digest}\n".encode())


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
