"""The cluster file of NFVactor: where the flow switch and each runtime listen.

```yaml
kind: actors-cluster
schema_version: 1
switch: {name: switch, address: "127.0.0.1:5700"}
runtimes:
  - {name: rt1, address: "127.0.0.1:5701"}
  - {name: rt2, address: "127.0.0.1:5702"}
  - {name: rt3, address: "127.0.0.1:5703"}
heartbeat_ms: 20            # the switch pings every runtime this often
heartbeat_timeout_ms: 300   # a runtime silent this long is declared dead
replication: true           # replicate each flow's state before its packets leave
```

Every process reads the same file; a name is the identity of a process, an address
``HOST:PORT`` the TCP endpoint it binds. Names and addresses must be unique (a runtime
that shares another's address could never be reached), a host must resolve, and the
heartbeat timeout must cover at least three heartbeats. Errors name the file and field
(exit 2).
"""

from __future__ import annotations

import socket
from pathlib import Path

from dl_nfv.artifacts.errors import BadInput, InvalidArtifact
from dl_nfv.artifacts.io import read_document
from dl_nfv.artifacts.records import from_data, record

KIND = "actors-cluster"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


@record
class Member:
    """One process of the cluster: a name and the ``HOST:PORT`` it binds."""

    name: str
    address: str

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"name {self.name!r}: use letters, digits, '-' or '_'")
        host, sep, port = self.address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"address {self.address!r} of {self.name!r}: expected HOST:PORT "
                             f"with a port in 1..65535")

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0].strip("[]")

    @property
    def endpoint(self) -> str:
        """The ZeroMQ endpoint (``tcp://HOST:PORT``)."""
        return f"tcp://{self.address}"


@record
class ClusterSpec:
    """The switch, the runtimes (at least two when replicating) and the heartbeat."""

    kind: str = KIND
    schema_version: int = 1
    switch: Member
    runtimes: tuple[Member, ...]
    heartbeat_ms: float = 20.0
    heartbeat_timeout_ms: float = 300.0
    replication: bool = True

    def __post_init__(self) -> None:
        if self.kind != KIND:
            raise ValueError(f"kind must be {KIND!r}, got {self.kind!r}")
        if not self.runtimes:
            raise ValueError("runtimes: name at least one runtime")
        if self.replication and len(self.runtimes) < 2:
            raise ValueError(f"replication needs at least 2 runtimes, got {len(self.runtimes)}")
        seen_names: dict[str, str] = {}
        seen_addresses: dict[str, str] = {}
        for member in (self.switch, *self.runtimes):
            if member.name in seen_names:
                raise ValueError(f"runtime {member.name!r} is named twice")
            if member.address in seen_addresses:
                raise ValueError(f"runtime {member.name!r} has the address {member.address} of "
                                 f"{seen_addresses[member.address]!r}: it could never be reached")
            seen_names[member.name] = member.address
            seen_addresses[member.address] = member.name
        if not 0 < self.heartbeat_ms <= 10_000:
            raise ValueError(f"heartbeat_ms {self.heartbeat_ms} must be in (0, 10000]")
        if self.heartbeat_timeout_ms < 3 * self.heartbeat_ms:
            raise ValueError(f"heartbeat_timeout_ms {self.heartbeat_timeout_ms} must be at least "
                             f"3 heartbeats ({3 * self.heartbeat_ms:g} ms)")

    def member(self, name: str) -> Member:
        """The switch or runtime ``name``; ``BadInput`` listing the names if there is none."""
        for member in (self.switch, *self.runtimes):
            if member.name == name:
                return member
        raise BadInput(f"no runtime {name!r} in the cluster (runtimes: "
                       f"{', '.join(r.name for r in self.runtimes)})")

    @property
    def runtime_names(self) -> list[str]:
        return [r.name for r in self.runtimes]


def load_cluster(path: str | Path) -> ClusterSpec:
    """The cluster file at ``path``, validated; every host must resolve (``BadInput``)."""
    try:
        spec = from_data(ClusterSpec, read_document(path))
    except InvalidArtifact as exc:
        raise exc.at(file=str(path)) from None
    for index, member in enumerate((spec.switch, *spec.runtimes)):
        try:
            socket.getaddrinfo(member.host, None)
        except (socket.gaierror, UnicodeError):
            field = "switch" if index == 0 else f"runtimes[{index - 1}]"
            raise InvalidArtifact(f"runtime {member.name!r} is unreachable: host {member.host!r} "
                                  f"does not resolve", field=f"{field}.address",
                                  file=str(path)) from None
    return spec


def is_local(member: Member) -> bool:
    """Whether ``member`` listens on this machine (so ``up`` can start it and ``fail`` kill it)."""
    if member.host in LOCAL_HOSTS:
        return True
    try:
        mine = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
        theirs = {info[4][0] for info in socket.getaddrinfo(member.host, None)}
    except socket.gaierror:
        return False
    return bool(mine & theirs)
