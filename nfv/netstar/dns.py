"""DNS look-ups for NFs: dnspython's resolvers against one configured server.

``Dns`` (asynchronous, ``dns.asyncresolver``) and ``SyncDns`` (blocking,
``dns.resolver``) answer ``txt(name)`` and ``a(name)`` with the list of
record strings, empty when the name does not exist or has no record of that
type. Answers are kept for the whole run (one query per name; concurrent
look-ups of one name share the query), and at most ``MAX_IN_FLIGHT`` queries
are outstanding at once. A query that times out or is refused is retried with
the run's back-off (``services.RetryPolicy``) and then fails the run with
``ServiceUnavailable``: an NF never takes "no answer" for "no record".

Addresses: ``HOST`` or ``HOST:PORT`` (port 53 by default), HOST an IP literal.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time

from dl_nfv.artifacts.errors import BadInput

from .services import CURRENT_FLOW, DEFAULT_RETRY, RetryPolicy, ServiceStats, ServiceUnavailable

QUERY_TIMEOUT_S = 1.0
MAX_IN_FLIGHT = 256


def parse_dns(text: str) -> tuple[str, int]:
    """``(host, port)`` from ``HOST[:PORT]``; ``BadInput`` naming the value otherwise."""
    host, sep, port = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    if not sep:
        host, port = text.strip("[]"), "53"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise BadInput(f"--dns: {text!r} is not an IP address with an optional :PORT "
                       f"(e.g. 127.0.0.1:5353)") from None
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise BadInput(f"--dns: bad port in {text!r} (expected 1-65535)")
    return host, int(port)


def _records(answer, rdtype: str) -> list[str]:
    if answer.rrset is None:
        return []
    if rdtype == "TXT":
        return sorted(b"".join(r.strings).decode("utf-8", "replace") for r in answer.rrset)
    return sorted(r.to_text() for r in answer.rrset)


def _resolver(module, host: str, port: int):
    resolver = module.Resolver(configure=False)
    resolver.nameservers = [host]
    resolver.port = port
    resolver.timeout = resolver.lifetime = QUERY_TIMEOUT_S
    resolver.cache = None
    return resolver


class _Client:
    """What both clients share: the server, the counters, the probe, the retry decision."""

    def __init__(self, module, host: str, port: int, stats: ServiceStats, retry: RetryPolicy):
        self.host, self.port = host, port
        self.stats = stats
        self.retry = retry
        self.resolver = _resolver(module, host, port)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    def txt(self, name: str):
        return self.lookup(name, "TXT")

    def a(self, name: str):
        return self.lookup(name, "A")

    def check(self) -> None:
        """``BadInput`` naming the address when the server does not answer a probe query
        (a blocking call: made once, before the run)."""
        import dns.exception
        import dns.message
        import dns.query

        query = dns.message.make_query("netstar-probe.invalid.", "A")
        try:
            dns.query.udp(query, self.host, port=self.port, timeout=2 * QUERY_TIMEOUT_S)
        except (dns.exception.DNSException, OSError) as exc:
            raise BadInput(f"--dns: no answer from the DNS server at {self} "
                           f"({type(exc).__name__}: {exc or 'timed out'})") from None

    def _outcome(self, answer_or_exc, name: str, rdtype: str, waits, flow: int):
        """(records, None) for an answer or NXDOMAIN; (None, wait) to retry after a timeout or
        refusal; ``ServiceUnavailable`` when the back-off budget is spent."""
        import dns.resolver

        if isinstance(answer_or_exc, dns.resolver.NXDOMAIN):
            return [], None
        if isinstance(answer_or_exc, BaseException):
            wait = next(waits, None)
            if wait is None:
                raise ServiceUnavailable(
                    f"DNS server {self} did not answer {name} {rdtype} within "
                    f"{self.retry.budget_s:g} s of retries: {answer_or_exc}") from None
            self.stats.held([flow])
            return None, wait
        return _records(answer_or_exc, rdtype), None


def _failures():
    import dns.exception
    import dns.resolver

    return (dns.resolver.NXDOMAIN, dns.exception.Timeout, dns.resolver.NoNameservers, OSError)


class Dns(_Client):
    """Asynchronous look-ups; ``txt``/``a`` return futures of sorted record strings."""

    def __init__(self, host: str, port: int, stats: ServiceStats,
                 retry: RetryPolicy = DEFAULT_RETRY):
        import dns.asyncresolver

        super().__init__(dns.asyncresolver, host, port, stats, retry)
        self.loop = asyncio.get_running_loop()
        self.answers: dict[tuple[str, str], asyncio.Future] = {}
        self.slots = asyncio.Semaphore(MAX_IN_FLIGHT)

    def lookup(self, name: str, rdtype: str) -> asyncio.Future:
        key = (name.lower(), rdtype)
        fut = self.answers.get(key)
        if fut is not None:
            self.stats.cache_hits += 1
            return fut
        self.stats.begin()
        fut = self.answers[key] = self.loop.create_task(self._query(name, rdtype))
        return fut

    async def _query(self, name: str, rdtype: str) -> list[str]:
        waits, flow, failures = self.retry.waits(), CURRENT_FLOW.get(), _failures()
        try:
            while True:
                try:
                    async with self.slots:
                        result = await self.resolver.resolve(name, rdtype,
                                                             raise_on_no_answer=False)
                except failures as exc:
                    result = exc
                records, wait = self._outcome(result, name, rdtype, waits, flow)
                if records is not None:
                    return records
                await asyncio.sleep(wait)
        finally:
            self.stats.end()

    async def close(self) -> None:
        for fut in self.answers.values():
            fut.cancel()


class SyncDns(_Client):
    """Blocking look-ups with the same answers, cache and retries as ``Dns``."""

    def __init__(self, host: str, port: int, stats: ServiceStats,
                 retry: RetryPolicy = DEFAULT_RETRY):
        import dns.resolver

        super().__init__(dns.resolver, host, port, stats, retry)
        self.answers: dict[tuple[str, str], list[str]] = {}

    def lookup(self, name: str, rdtype: str) -> list[str]:
        key = (name.lower(), rdtype)
        if key in self.answers:
            self.stats.cache_hits += 1
            return self.answers[key]
        self.stats.requests += 1
        waits, failures = self.retry.waits(), _failures()
        while True:
            try:
                result = self.resolver.resolve(name, rdtype, raise_on_no_answer=False)
            except failures as exc:
                result = exc
            records, wait = self._outcome(result, name, rdtype, waits, CURRENT_FLOW.get())
            if records is not None:
                self.answers[key] = records
                return records
            time.sleep(wait)

    def close(self) -> None:
        return None
