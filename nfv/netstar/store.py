"""The key-value store NFs keep flow state in: an embedded one (default) and Redis.

One interface, two back-ends, in two forms. The asynchronous form (used by the
async and callback NF styles) returns an ``asyncio.Future`` from every
operation, so that async code awaits it and callback code chains
``add_done_callback`` on the same object:

    get(key) -> bytes | None     set(key, value)     claim(key, value) -> bool
    incr(key) -> int             delete(key)

``claim`` sets ``key`` to ``value`` unless it holds another value, and says
whether it holds ``value`` now (``SET NX GET``, Redis 7): unlike ``SETNX`` it
gives the same answer when a request is resent after a lost reply.

The synchronous form (``blocking`` NF style) has the same methods returning
the values directly.

``EmbeddedStore`` is a dict in the process; an optional latency (fixed, or a
function drawing one per request) completes each request that much later on
the event loop, which models a remote store without a server. ``RedisStore``
talks to ``redis-server`` through the ``redis`` package's asyncio client and
pipelines: the requests issued during one turn of the event loop (by however
many flows) go out as one pipeline, and several pipelines may be in flight on a
small pool of connections. A pipeline that fails on the connection (server
killed, restarting, silent) is resent whole after a back-off
(``services.RetryPolicy``); every command is idempotent except ``incr``,
which a resend after a lost reply may apply twice. Values are bytes; keys are
strings that every run prefixes with its own namespace, and the run deletes
its keys at the end.

Store addresses: ``embedded`` or ``redis://HOST:PORT[/DB]``.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from dl_nfv.artifacts.errors import BadInput

from .services import CURRENT_FLOW, DEFAULT_RETRY, RetryPolicy, ServiceStats, ServiceUnavailable

CONNECT_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class StoreAddress:
    """``embedded``, or a Redis server's host, port and database number."""

    backend: str
    host: str = ""
    port: int = 0
    db: int = 0

    def __str__(self) -> str:
        return "embedded" if self.backend == "embedded" else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return "embedded" if self.backend == "embedded" else \
            f"redis://{self.host}:{self.port}/{self.db}"


def parse_store(text: str) -> StoreAddress:
    """``embedded`` or ``redis://HOST:PORT[/DB]``; ``BadInput`` naming the value otherwise."""
    if text == "embedded":
        return StoreAddress("embedded")
    try:
        url = urllib.parse.urlsplit(text)
        port = url.port
    except ValueError as exc:
        raise BadInput(f"--store: malformed Redis URL {text!r}: {exc}") from None
    path = url.path.lstrip("/")
    if url.scheme != "redis" or not url.hostname or url.query or url.fragment \
            or (path and not path.isdigit()):
        raise BadInput(f"--store: malformed store address {text!r} "
                       f"(expected 'embedded' or redis://HOST:PORT[/DB])")
    return StoreAddress("redis", url.hostname, port or 6379, int(path or 0))


class _Requests:
    """Counting and completion shared by the asynchronous stores."""

    def __init__(self, stats: ServiceStats):
        self.stats = stats

    def _resolve(self, fut: asyncio.Future, value) -> None:
        self.stats.end()
        if not fut.done():
            fut.set_result(value)


class EmbeddedStore(_Requests):
    """A dict in this process. ``latency_s``: seconds each request takes (a number, or a
    function called once per request)."""

    def __init__(self, stats: ServiceStats, latency_s: float | Callable[[], float] = 0.0):
        super().__init__(stats)
        self.data: dict[str, bytes] = {}
        self.latency_s = latency_s
        self.loop = asyncio.get_running_loop()

    def _done(self, value) -> asyncio.Future:
        self.stats.begin()
        fut = self.loop.create_future()
        delay = self.latency_s() if callable(self.latency_s) else self.latency_s
        if delay > 0:
            self.loop.call_later(delay, self._resolve, fut, value)
        else:
            self._resolve(fut, value)
        return fut

    def get(self, key: str) -> asyncio.Future:
        return self._done(self.data.get(key))

    def set(self, key: str, value) -> asyncio.Future:
        self.data[key] = value if isinstance(value, bytes) else str(value).encode()
        return self._done(None)

    def claim(self, key: str, value) -> asyncio.Future:
        value = value if isinstance(value, bytes) else str(value).encode()
        return self._done(self.data.setdefault(key, value) == value)

    def incr(self, key: str) -> asyncio.Future:
        value = int(self.data.get(key, b"0")) + 1
        self.data[key] = str(value).encode()
        return self._done(value)

    def delete(self, key: str) -> asyncio.Future:
        self.data.pop(key, None)
        return self._done(None)

    async def check(self) -> None:
        return None

    async def drop_namespace(self, prefix: str) -> None:
        for key in [k for k in self.data if k.startswith(prefix)]:
            del self.data[key]

    async def close(self) -> None:
        return None


def _normalise(command: tuple, reply):
    if command[0] == "SET":
        if len(command) > 3:  # claim: SET key value NX GET -> the old value, None if set now
            value = command[2] if isinstance(command[2], bytes) else str(command[2]).encode()
            return reply is None or reply == value
        return None
    if command[0] == "DEL":
        return None
    return reply


class RedisStore(_Requests):
    """Redis through ``redis.asyncio``: requests of one loop turn go out as one pipeline."""

    def __init__(self, address: StoreAddress, stats: ServiceStats,
                 retry: RetryPolicy = DEFAULT_RETRY, connections: int = 8):
        import redis.asyncio as aredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        super().__init__(stats)
        self.address = address
        self.retry = retry
        self.loop = asyncio.get_running_loop()
        pool = aredis.BlockingConnectionPool(
            host=address.host, port=address.port, db=address.db, max_connections=connections,
            timeout=None, socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=REQUEST_TIMEOUT_S, retry=Retry(NoBackoff(), 0))
        self.client = aredis.Redis(connection_pool=pool)
        self.pending: list = []
        self.tasks: set = set()

    def _submit(self, *command) -> asyncio.Future:
        self.stats.begin()
        fut = self.loop.create_future()
        if not self.pending:
            self.loop.call_soon(self._flush)
        self.pending.append((command, fut, CURRENT_FLOW.get()))
        return fut

    def get(self, key: str) -> asyncio.Future:
        return self._submit("GET", key)

    def set(self, key: str, value) -> asyncio.Future:
        return self._submit("SET", key, value)

    def claim(self, key: str, value) -> asyncio.Future:
        return self._submit("SET", key, value, "NX", "GET")

    def incr(self, key: str) -> asyncio.Future:
        return self._submit("INCR", key)

    def delete(self, key: str) -> asyncio.Future:
        return self._submit("DEL", key)

    def _flush(self) -> None:
        batch, self.pending = self.pending, []
        task = self.loop.create_task(self._send(batch))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _send(self, batch: list) -> None:
        import redis.exceptions as rexc

        waits = self.retry.waits()
        while True:
            try:
                pipe = self.client.pipeline(transaction=False)
                for command, _, _ in batch:
                    pipe.execute_command(*command)
                replies = await pipe.execute(raise_on_error=False)
                break
            except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
                wait = next(waits, None)
                if wait is None:
                    error = ServiceUnavailable(
                        f"Redis at {self.address} did not answer within "
                        f"{self.retry.budget_s:g} s of retries: {exc}")
                    for _, fut, _ in batch:
                        self.stats.end()
                        if not fut.done():
                            fut.set_exception(error)
                    return
                self.stats.held(flow for _, _, flow in batch)
                await asyncio.sleep(wait)
        for (command, fut, _), reply in zip(batch, replies):
            if isinstance(reply, Exception):
                self.stats.end()
                if not fut.done():
                    fut.set_exception(ServiceUnavailable(
                        f"Redis at {self.address} refused {command[0]}: {reply}"))
            else:
                self._resolve(fut, _normalise(command, reply))

    async def check(self) -> None:
        """``BadInput`` naming the address when the server cannot be reached now."""
        import redis.exceptions as rexc

        try:
            await self.client.ping()
        except (rexc.RedisError, OSError) as exc:
            raise BadInput(f"--store: cannot reach Redis at {self.address}: {exc}") from None

    async def drop_namespace(self, prefix: str) -> None:
        keys = [k async for k in self.client.scan_iter(match=prefix + "*", count=1000)]
        for i in range(0, len(keys), 1000):
            await self.client.unlink(*keys[i:i + 1000])

    async def close(self) -> None:
        await self.client.aclose()
        await self.client.connection_pool.disconnect()


# the synchronous form, for the blocking style -------------------------------------------------

class EmbeddedSyncStore:
    """The embedded store for blocking code: each request sleeps ``latency_s``."""

    def __init__(self, stats: ServiceStats, latency_s: float | Callable[[], float] = 0.0):
        self.stats = stats
        self.data: dict[str, bytes] = {}
        self.latency_s = latency_s

    def _wait(self) -> None:
        self.stats.requests += 1
        delay = self.latency_s() if callable(self.latency_s) else self.latency_s
        if delay > 0:
            time.sleep(delay)

    def get(self, key: str):
        self._wait()
        return self.data.get(key)

    def set(self, key: str, value) -> None:
        self._wait()
        self.data[key] = value if isinstance(value, bytes) else str(value).encode()

    def claim(self, key: str, value) -> bool:
        self._wait()
        value = value if isinstance(value, bytes) else str(value).encode()
        return self.data.setdefault(key, value) == value

    def incr(self, key: str) -> int:
        self._wait()
        value = int(self.data.get(key, b"0")) + 1
        self.data[key] = str(value).encode()
        return value

    def delete(self, key: str) -> None:
        self._wait()
        self.data.pop(key, None)

    def check(self) -> None:
        return None

    def drop_namespace(self, prefix: str) -> None:
        for key in [k for k in self.data if k.startswith(prefix)]:
            del self.data[key]

    def close(self) -> None:
        return None


class RedisSyncStore:
    """Redis through the ``redis`` package's blocking client, one request at a time."""

    def __init__(self, address: StoreAddress, stats: ServiceStats,
                 retry: RetryPolicy = DEFAULT_RETRY):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.address = address
        self.stats = stats
        self.retry = retry
        self.client = redis.Redis(host=address.host, port=address.port, db=address.db,
                                  socket_connect_timeout=CONNECT_TIMEOUT_S,
                                  socket_timeout=REQUEST_TIMEOUT_S, retry=Retry(NoBackoff(), 0))

    def _call(self, *command):
        import redis.exceptions as rexc

        self.stats.requests += 1
        waits = self.retry.waits()
        while True:
            try:
                return self.client.execute_command(*command)
            except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
                wait = next(waits, None)
                if wait is None:
                    raise ServiceUnavailable(f"Redis at {self.address} did not answer within "
                                             f"{self.retry.budget_s:g} s of retries: {exc}") from None
                self.stats.held([CURRENT_FLOW.get()])
                time.sleep(wait)

    def get(self, key: str):
        return self._call("GET", key)

    def set(self, key: str, value) -> None:
        self._call("SET", key, value)

    def claim(self, key: str, value) -> bool:
        return _normalise(("SET", key, value, "NX", "GET"), self._call("SET", key, value, "NX",
                                                                      "GET"))

    def incr(self, key: str) -> int:
        return int(self._call("INCR", key))

    def delete(self, key: str) -> None:
        self._call("DEL", key)

    def check(self) -> None:
        import redis.exceptions as rexc

        try:
            self.client.ping()
        except (rexc.RedisError, OSError) as exc:
            raise BadInput(f"--store: cannot reach Redis at {self.address}: {exc}") from None

    def drop_namespace(self, prefix: str) -> None:
        keys = list(self.client.scan_iter(match=prefix + "*", count=1000))
        for i in range(0, len(keys), 1000):
            self.client.unlink(*keys[i:i + 1000])

    def close(self) -> None:
        self.client.close()
