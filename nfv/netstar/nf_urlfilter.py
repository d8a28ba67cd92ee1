"""URL filter: resolve the host each HTTP request names, block those in blocked networks.

For every HTTP request the NF takes the ``Host`` header (without a port),
resolves it to IPv4 addresses by DNS (an address literal stands for itself),
and blocks the request (drops it, with an alert naming the host) when any
address lies in one of the ``block`` prefixes, or when the name does not
resolve and ``default`` is ``deny``. Requests without a Host header pass.
Answers are cached for the run (``dns.Dns``).
"""

from __future__ import annotations

import ipaddress

from .events import REQUEST
from .runtime import BlockingNf, CallbackNf

NAME = "url-filter"
NEEDS_DNS = True


class Logic:
    def __init__(self, spec, trace) -> None:
        self.block = [ipaddress.ip_network(p, strict=False) for p in spec.block]
        self.deny_unresolved = str(spec.default) == "deny"

    @staticmethod
    def host(msg) -> str | None:
        value = msg.header("host")
        if not value:
            return None
        if value.startswith("["):  # [IPv6]:port
            value = value[1:].partition("]")[0]
        elif value.count(":") == 1:  # name:port
            value = value.partition(":")[0]
        return value.lower().rstrip(".")

    @staticmethod
    def literal(host: str) -> list[str] | None:
        """``[host]`` when ``host`` is an address literal, else None (it needs DNS)."""
        try:
            return [str(ipaddress.ip_address(host))]
        except ValueError:
            return None

    def blocked(self, addresses: list[str]) -> str | None:
        """Why a host with ``addresses`` is blocked, or None."""
        if not addresses:
            return "does not resolve" if self.deny_unresolved else None
        for text in addresses:
            address = ipaddress.ip_address(text)
            for net in self.block:
                if address.version == net.version and address in net:
                    return f"{text} in {net}"
        return None


async def run(flow, env):
    async for msg in flow.messages(REQUEST):
        host = env.logic.host(msg)
        if host is None:
            continue
        reason = env.logic.blocked(env.logic.literal(host) or await env.dns.a(host))
        if reason is not None:
            flow.alert("blocked-host", f"{host}: {reason}")
            flow.drop()


class Callback(CallbackNf):
    events = frozenset({REQUEST})

    def message(self, flow, msg, done):
        env = self.env
        host = env.logic.host(msg)

        def decide(addresses):
            reason = env.logic.blocked(addresses)
            if reason is not None:
                flow.alert("blocked-host", f"{host}: {reason}")
                flow.drop()
            done()

        def resolved(fut):
            if fut.exception() is not None:
                return done(fut.exception())
            decide(fut.result())

        if host is None:
            return done()
        if env.logic.literal(host):
            return decide(env.logic.literal(host))
        env.dns.a(host).add_done_callback(resolved)


class Blocking(BlockingNf):
    events = frozenset({REQUEST})

    def message(self, flow, msg):
        env = self.env
        host = env.logic.host(msg)
        if host is None:
            return
        reason = env.logic.blocked(env.logic.literal(host) or env.dns.a(host))
        if reason is not None:
            flow.alert("blocked-host", f"{host}: {reason}")
            flow.drop()
