"""Real servers for the NetStar tests: redis-server and dnsmasq on free loopback ports.

Each fixture starts its server in the test's temporary folder and stops it
after; a test that needs a binary that is not installed is skipped, naming
the Debian package to install (``.ci/run`` installs both).
"""

from __future__ import annotations

import pytest

from dl_nfv.nfv.netstar import servers
from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace
from dl_nfv.nfv.traffic.trace import load_trace
from tests.nfv.helpers import RULES

ACL = """
    default: allow
    acl:
      - {action: deny, proto: tcp, src: 10.0.1.0/24}
      - {action: deny, proto: tcp, dst: 10.1.0.3/32}
"""


def write_config(folder, name: str, chain: str):
    path = folder / f"{name}.yaml"
    path.write_text(f"kind: nf-config\nschema_version: 1\nname: {name}\nchain:\n{chain}")
    return path


@pytest.fixture
def chain_config(tmp_path):
    """firewall -> nat -> ids, so that drops upstream hide messages downstream."""
    return write_config(tmp_path, "chain", f"  - nf: firewall{ACL}"
                        "  - nf: nat\n    pool: [198.51.100.1, 198.51.100.2]\n"
                        f"    ports: 2000-2199\n  - nf: ids\n    rules: {RULES}\n")


def need(binary: str, package: str) -> None:
    if servers.binary(binary) is None:
        pytest.skip(f"{binary} is not installed (apt-get install {package})")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    need("redis-server", "redis-server")
    server = servers.start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def durable_redis(tmp_path):
    """A redis-server whose acknowledged writes survive kill -9 (fsynced append-only file)."""
    need("redis-server", "redis-server")
    server = servers.start_redis(tmp_path / "redis", durable=True)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A generated HTTP trace (150 flows, attacks in 5% of messages) and its path."""
    path = tmp_path_factory.mktemp("trace") / "gen.pcap"
    generate_trace(TraceSpec(flows=150, attack_rate=0.05, seed=7), path)
    return path, load_trace(path)
