"""Parsing of service addresses and the retry schedule."""

from __future__ import annotations

import pytest

from dl_nfv.artifacts.errors import BadInput
from dl_nfv.nfv.netstar.dns import parse_dns
from dl_nfv.nfv.netstar.services import RetryPolicy
from dl_nfv.nfv.netstar.store import parse_store


def test_store_addresses():
    assert parse_store("embedded").backend == "embedded"
    a = parse_store("redis://127.0.0.1:6391/2")
    assert (a.backend, a.host, a.port, a.db, str(a)) == ("redis", "127.0.0.1", 6391, 2,
                                                         "127.0.0.1:6391")
    assert parse_store("redis://localhost").port == 6379
    for bad in ("redis://:6379", "redis://h:70000", "redis://h:1?x=1", "http://h:1", "redis:"):
        with pytest.raises(BadInput):
            parse_store(bad)


def test_dns_addresses():
    assert parse_dns("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert parse_dns("127.0.0.1") == ("127.0.0.1", 53)
    assert parse_dns("::1") == ("::1", 53)
    for bad in ("localhost:53", "127.0.0.1:0", "127.0.0.1:x", "1.2.3:53"):
        with pytest.raises(BadInput):
            parse_dns(bad)


def test_retry_waits_double_up_to_the_cap_within_the_budget():
    waits = list(RetryPolicy(first_s=0.1, max_s=0.4, budget_s=2.0).waits())
    assert waits == [0.1, 0.2, 0.4, 0.4, 0.4, 0.4]  # 1.9 s; one more 0.4 would pass 2.0
    assert list(RetryPolicy(budget_s=0).waits()) == []
