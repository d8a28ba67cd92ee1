"""What the store and DNS clients share: the retry policy, the counters, the failure error.

A request to an external service that fails for a reason that can pass (the
connection is refused or reset, no answer within the timeout) is retried with
exponential back-off (``RetryPolicy``: first wait ``first_s``, doubling up to
``max_s``, for at most ``budget_s`` in all). While it is retried the flow that
issued it waits: its messages are held, neither dropped nor overtaken by later
ones of the same flow. ``ServiceStats`` counts the retries and the flows held,
and the peak number of requests outstanding at once (how many flows were
waiting on a service at the same time). When the budget is spent the request
fails with ``ServiceUnavailable`` and the run stops (exit 1): nothing is
processed out of order or silently skipped.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

from dl_nfv.artifacts.errors import RuntimeFailure

# the flow whose NF code is running: requests record it, so the flows a failure held are known
CURRENT_FLOW: contextvars.ContextVar[int] = contextvars.ContextVar("netstar_flow", default=-1)


class ServiceUnavailable(RuntimeFailure):
    """A store or DNS server did not answer within the retry budget."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential back-off: waits ``first_s``, ``2*first_s``, ... capped at ``max_s``,
    until ``budget_s`` seconds of waiting have been spent."""

    first_s: float = 0.02
    max_s: float = 1.0
    budget_s: float = 30.0

    def waits(self):
        """The successive back-off waits, in seconds; ends when the budget is spent."""
        spent, wait = 0.0, self.first_s
        while spent + wait <= self.budget_s:
            yield wait
            spent += wait
            wait = min(wait * 2, self.max_s)


DEFAULT_RETRY = RetryPolicy()


@dataclass(slots=True)
class ServiceStats:
    """Counters of one service client."""

    requests: int = 0
    retries: int = 0
    cache_hits: int = 0
    outstanding: int = 0
    peak_outstanding: int = 0
    held_flows: set = field(default_factory=set)
    held_requests: int = 0

    def begin(self) -> None:
        self.requests += 1
        self.outstanding += 1
        if self.outstanding > self.peak_outstanding:
            self.peak_outstanding = self.outstanding

    def end(self) -> None:
        self.outstanding -= 1

    def held(self, flows) -> None:
        """A failed attempt: the requests of ``flows`` wait for the retry."""
        self.retries += 1
        for flow in flows:
            self.held_requests += 1
            if flow >= 0:
                self.held_flows.add(flow)

    def as_dict(self) -> dict:
        return {"requests": self.requests, "retries": self.retries,
                "cache_hits": self.cache_hits, "held_requests": self.held_requests,
                "held_flows": len(self.held_flows), "peak_outstanding": self.peak_outstanding}
