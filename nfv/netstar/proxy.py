"""A loopback TCP proxy that delays everything the client sends by a fixed time.

``python -m dl_nfv.nfv.netstar.proxy LISTEN_PORT TARGET_PORT DELAY_MS``: each
chunk read from a client is written to the server ``DELAY_MS`` later (in
order, without holding back the chunks behind it), replies go back at once; so
every request/response round trip through it takes ``DELAY_MS`` more, however
many are in flight. Both ends are 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import sys

HOST = "127.0.0.1"


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float):
    loop = asyncio.get_running_loop()
    try:
        while data := await reader.read(1 << 16):
            if delay_s > 0:
                loop.call_later(delay_s, writer.write, data)
            else:
                writer.write(data)
                await writer.drain()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve(listen: int, target: int, delay_s: float) -> None:
    async def handle(client_r, client_w):
        try:
            server_r, server_w = await asyncio.open_connection(HOST, target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pump(client_r, server_w, delay_s), _pump(server_r, client_w, 0.0))

    server = await asyncio.start_server(handle, HOST, listen)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    listen, target, delay_ms = int(argv[0]), int(argv[1]), float(argv[2])
    asyncio.run(_serve(listen, target, delay_ms / 1000))


if __name__ == "__main__":
    main(sys.argv[1:])
