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
    lo, _, hi = text.partition("-")
    if not lo.isdigit() or (hi and not hi.isdigit()):
        return False
    return 0 <= int(lo) <= int(hi or lo) <= 65535


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


@record
class NfConfig:
    """An NF chain and its engine."""

    kind: str = "nf-config"
    schema_version: int = 1
    name: str
    chain: tuple[NfSpec, ...]
    engine: EngineSpec = EngineSpec()

    def __post_init__(self) -> None:
        check(self.kind == "nf-config", f"kind must be 'nf-config', got {self.kind!r}")
        check(len(self.chain) > 0, "chain must list at least one NF")
        kinds = [s.nf for s in self.chain]
        for kind in set(kinds):
            check(kinds.count(kind) == 1, f"chain lists nf {kind.value!r} twice")
