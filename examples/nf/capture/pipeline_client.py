"""Send pipelined HTTP/1.1 requests on one connection and read every response.

``python pipeline_client.py PORT N``: writes N GET requests back to back
(the last with ``Connection: close``), then reads until the server closes.
"""

from __future__ import annotations

import socket
import sys

port, count = int(sys.argv[1]), int(sys.argv[2])
requests = b"".join(
    f"GET /pipelined/{i}.html HTTP/1.1\r\nHost: pipeline.test\r\nUser-Agent: dl-nfv-pipeline\r\n"
    f"{'Connection: close' + chr(13) + chr(10) if i == count - 1 else ''}\r\n".encode()
    for i in range(count))
with socket.create_connection(("127.0.0.1", port)) as sock:
    sock.sendall(requests)
    received = 0
    while chunk := sock.recv(65536):
        received += len(chunk)
print(f"pipelined {count} requests, received {received} bytes")
