"""``nf-config``: an NF chain, each NF's parameters, and the engine that runs it (YAML).

Example (``examples/nf/ids.yaml``)::

    kind: nf-config
    schema_version: 1
    name: ids
    chain:
      - nf: monitor
      - nf: ids
        rules: ids.rules          # relative to this file
    engine:
      name: flowshader
      batch_size: 2048

Rules files and other paths are resolved relative to the config file.
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum

from .records import check, record


class NfKind(StrEnum):
    MONITOR = "monitor"
    HTTP_LB = "http-lb"
    IDS = "ids"
    FIREWALL = "firewall"
    NAT = "nat"  # NetStar NFs (dl-nfv nfv netstar)
    MALWARE = "malware"
    URL_FILTER = "url-filter"


class LbPolicy(StrEnum):
    HOST = "host"
    URL = "url"


class AclAction(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class AclProto(StrEnum):
    ANY = "any"
    TCP = "tcp"
    UDP = "udp"


def _prefix_ok(text: str) -> bool:
    if text == "any":
        return True
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


_DNS_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def _zone_ok(text: str) -> bool:
    """A DNS name that still fits after a 64-character hash label and ``.hash.``."""
    labels = text.rstrip(".").split(".")
    return len(text) <= 183 and all(_DNS_LABEL.match(label) for label in labels)


def _ports_ok(text: str) -> bool:
    if text == "any":
        return True
    lo, dash, hi = text.partition("-")
    if not lo.isdigit() or (dash and not hi.isdigit()):
        return False
    return 0 <= int(lo) <= int(hi or lo) <= 65535


def port_range(text: str) -> tuple[int, int]:
    """``(lo, hi)`` of a checked port field: ``"80"``, ``"1024-2047"`` or ``"any"`` (0-65535)."""
    lo, _, hi = ("0-65535" if text == "any" else text).partition("-")
    return int(lo), int(hi or lo)


@record
class AclRule:
    """One firewall rule; matched against the flow's client -> server direction."""

    action: AclAction
    proto: AclProto = AclProto.ANY
    src: str = "any"
    dst: str = "any"
    src_port: str = "any"
    dst_port: str = "any"

    def __post_init__(self) -> None:
        for name in ("src", "dst"):
            value = getattr(self, name)
            check(_prefix_ok(value), f"{name}: {value!r} is not 'any' or an address prefix "
                                     f"such as 10.0.0.0/8")
        for name in ("src_port", "dst_port"):
            value = getattr(self, name)
            check(_ports_ok(value), f"{name}: {value!r} is not 'any', a port or a range lo-hi "
                                    f"within 0-65535")


@record
class NfSpec:
    """One NF of the chain. ``rules`` (ids), ``backends``/``policy`` (http-lb),
    ``acl``/``default`` (firewall) apply to their NF only."""

    nf: NfKind
    rules: str | None = None
    backends: tuple[str, ...] = ()
    policy: LbPolicy = LbPolicy.HOST
    acl: tuple[AclRule, ...] = ()
    default: AclAction = AclAction.ALLOW
    pool: tuple[str, ...] = ()
    ports: str = "1024-65535"
    zone: str | None = None
    block: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self._check_netstar()
        if self.nf == NfKind.IDS:
            check(bool(self.rules), "nf 'ids' needs 'rules' (a Snort rules file)")
        else:
            check(self.rules is None, f"'rules' applies to nf 'ids', not {self.nf.value!r}")
        if self.nf == NfKind.HTTP_LB:
            check(len(self.backends) > 0, "nf 'http-lb' needs a non-empty 'backends' list")
        else:
            check(not self.backends, f"'backends' applies to nf 'http-lb', not {self.nf.value!r}")
        if self.nf != NfKind.FIREWALL:
            check(not self.acl, f"'acl' applies to nf 'firewall', not {self.nf.value!r}")

    def _check_netstar(self) -> None:
        for name, kind in (("pool", NfKind.NAT), ("zone", NfKind.MALWARE),
                           ("block", NfKind.URL_FILTER)):
            if self.nf != kind:
                check(not getattr(self, name), f"{name!r} applies to nf {kind.value!r}, "
                                               f"not {self.nf.value!r}")
        if self.nf == NfKind.NAT:
            check(len(self.pool) > 0, "nf 'nat' needs a non-empty 'pool' of IPv4 addresses")
            for address in self.pool:
                check(_prefix_ok(address) and "/" not in address and "." in address,
                      f"pool: {address!r} is not an IPv4 address")
            check(_ports_ok(self.ports) and self.ports != "any",
                  f"ports: {self.ports!r} is not a port range lo-hi within 0-65535")
        if self.nf == NfKind.MALWARE:
            check(bool(self.zone), "nf 'malware' needs 'zone' (the hash registry's DNS zone)")
            check(_zone_ok(self.zone), f"zone: {self.zone!r} is not a DNS name "
                                       f"(labels of letters, digits and '-', at most 183 chars)")
        for prefix in self.block:
            check(_prefix_ok(prefix) and prefix != "any",
                  f"block: {prefix!r} is not an address prefix such as 10.0.0.0/8")


@record
class EngineSpec:
    """How to run the chain; ``name`` is cpu, gpu, flowshader or fixed:X."""

    name: str = "flowshader"
    batch_size: int = 2048
    workers: int = 0
    device: str = "auto"
    adaptive_batch: bool = True
    batch_step: int = 256
    calibration_batches: int = 3
    reprofile_every: int = 32
    torch_threads: int = 1

    def __post_init__(self) -> None:
        from dl_nfv.nfv.engines import parse_engine

        try:
            parse_engine(self.name)
        except Exception as exc:
            raise ValueError(f"name: {exc}") from None
        check(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        check(self.workers >= 0, f"workers must be >= 0 (0: automatic), got {self.workers}")
        check(self.device in ("auto", "cpu") or self.device.startswith("cuda"),
              f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        check(self.batch_step >= 1, f"batch_step must be >= 1, got {self.batch_step}")
        check(self.calibration_batches >= 1,
              f"calibration_batches must be >= 1, got {self.calibration_batches}")
        check(self.reprofile_every >= 0, f"reprofile_every must be >= 0, got {self.reprofile_every}")
        check(self.torch_threads >= 1, f"torch_threads must be >= 1, got {self.torch_threads}")

class L4NfKind(StrEnum):
    """The packet NFs of an ``l4_chain`` (``dl-nfv nfv chain``)."""

    FIREWALL = "firewall"
    NAT = "nat"
    LB = "lb"
    MONITOR = "monitor"
    RATE_LIMIT = "rate-limit"


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    k = 2
    while k * k <= n:
        if n % k == 0:
            return False
        k += 1
    return True


def _endpoint_ok(text: str) -> bool:
    """``a.b.c.d`` or ``a.b.c.d:port``."""
    address, _, port = text.partition(":")
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return not port or (port.isdigit() and 0 < int(port) <= 65535)


@record
class L4Timeouts:
    """Idle time-outs of per-flow state, by connection state (seconds)."""

    syn_s: float = 30.0
    established_s: float = 300.0
    fin_s: float = 60.0
    closing_s: float = 10.0
    udp_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("syn_s", "established_s", "fin_s", "closing_s", "udp_s"):
            value = getattr(self, name)
            check(0 < value <= 86_400, f"{name} must be in (0, 86400] s, got {value}")


MAX_NAT_PORTS = 1 << 22


@record
class L4NfSpec:
    """One NF of ``l4_chain``. ``acl``/``default`` (firewall), ``pool``/``ports`` (nat),
    ``vip``/``backends``/``table_size`` (lb), ``rate_bytes_per_s``/``burst_bytes``
    (rate-limit) apply to their NF only; ``timeouts`` to every stateful NF."""

    nf: L4NfKind
    acl: tuple[AclRule, ...] = ()
    default: AclAction = AclAction.ALLOW
    pool: tuple[str, ...] = ()
    ports: str = "1024-65535"
    vip: str = "any"
    backends: tuple[str, ...] = ()
    table_size: int = 65537
    rate_bytes_per_s: int = 0
    burst_bytes: int = 0
    timeouts: L4Timeouts = L4Timeouts()

    def __post_init__(self) -> None:
        own = {"acl": L4NfKind.FIREWALL, "pool": L4NfKind.NAT, "backends": L4NfKind.LB,
               "rate_bytes_per_s": L4NfKind.RATE_LIMIT, "burst_bytes": L4NfKind.RATE_LIMIT}
        for name, kind in own.items():
            check(self.nf == kind or not getattr(self, name),
                  f"{name!r} applies to nf {kind.value!r}, not {self.nf.value!r}")
        if self.nf == L4NfKind.NAT:
            self._check_nat()
        if self.nf == L4NfKind.LB:
            check(len(self.backends) > 0, "nf 'lb' needs a non-empty 'backends' list")
            for k, backend in enumerate(self.backends):
                check(_endpoint_ok(backend), f"backends[{k}]: {backend!r} is not an IPv4 "
                                             f"address or address:port")
            check(self.vip == "any" or _endpoint_ok(self.vip),
                  f"vip: {self.vip!r} is not 'any', an IPv4 address or address:port")
            check(_is_prime(self.table_size), f"table_size: {self.table_size} is not prime "
                  f"(Maglev needs a prime table size, e.g. 65537)")
            check(self.table_size >= len(self.backends),
                  f"table_size: {self.table_size} is smaller than {len(self.backends)} backends")
        if self.nf == L4NfKind.RATE_LIMIT:
            check(self.rate_bytes_per_s > 0,
                  f"rate_bytes_per_s must be > 0, got {self.rate_bytes_per_s}")
            check(0 < self.burst_bytes <= 1 << 40,
                  f"burst_bytes must be in (0, 2^40], got {self.burst_bytes}")

    def _check_nat(self) -> None:
        check(len(self.pool) > 0, "pool: nf 'nat' needs a non-empty list of IPv4 addresses")
        for k, address in enumerate(self.pool):
            try:
                ipaddress.IPv4Address(address)
            except ValueError:
                raise ValueError(f"pool[{k}]: {address!r} is not an IPv4 address") from None
        check(_ports_ok(self.ports) and self.ports != "any",
              f"ports: {self.ports!r} is not a port range lo-hi within 0-65535")
        lo, hi = port_range(self.ports)
        size = len(self.pool) * (hi - lo + 1)
        check(size <= MAX_NAT_PORTS, f"pool: {len(self.pool)} addresses x ports {self.ports} "
                                     f"is {size} bindings, over the {MAX_NAT_PORTS} allowed")


@record
class L4EngineSpec:
    """How ``dl-nfv nfv chain`` runs the l4_chain."""

    name: str = "tensor"
    batch_size: int = 8192
    device: str = "cpu"
    sweep_interval_s: float = 1.0
    table_capacity: int = 1024

    def __post_init__(self) -> None:
        check(self.name in ("tensor", "cpu"), f"name must be tensor or cpu, got {self.name!r}")
        check(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        check(self.device in ("auto", "cpu") or self.device.startswith("cuda"),
              f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        check(self.sweep_interval_s > 0,
              f"sweep_interval_s must be > 0, got {self.sweep_interval_s}")
        check(self.table_capacity >= 16 and self.table_capacity & (self.table_capacity - 1) == 0,
              f"table_capacity must be a power of two >= 16, got {self.table_capacity}")


@record
class NfConfig:
    """An NF chain and its engine; ``l4_chain`` a chain of L3/L4 packet NFs
    (``dl-nfv nfv chain``, see ``l4chain.py``)."""

    kind: str = "nf-config"
    schema_version: int = 1
    name: str
    chain: tuple[NfSpec, ...] = ()
    engine: EngineSpec = EngineSpec()
    l4_chain: tuple[L4NfSpec, ...] = ()
    l4_engine: L4EngineSpec = L4EngineSpec()

    def __post_init__(self) -> None:
        check(self.kind == "nf-config", f"kind must be 'nf-config', got {self.kind!r}")
        check(len(self.chain) > 0 or len(self.l4_chain) > 0,
              "chain (or l4_chain) must list at least one NF")
        l4 = [s.nf for s in self.l4_chain]
        for kind in set(l4):
            check(l4.count(kind) == 1, f"l4_chain lists nf {kind.value!r} twice")
        kinds = [s.nf for s in self.chain]
        for kind in set(kinds):
            check(kinds.count(kind) == 1, f"chain lists nf {kind.value!r} twice")
