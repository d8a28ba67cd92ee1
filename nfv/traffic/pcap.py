"""Read and write pcap and pcapng files, and decode frames down to TCP/UDP (dpkt).

This is the one pcap reader of dl-nfv. ``read_frames`` yields raw frames with
their link type and timestamp (``capture.py`` walks the file formats);
``decode`` turns one frame into a ``Packet`` or the reason it was skipped. Link types: Ethernet (with 802.1Q/802.1ad VLAN
tags), raw IP, Linux cooked capture (SLL and SLL2), BSD loopback. Network
layers: IPv4 and IPv6; transport: TCP and UDP. Nothing here raises on a bad
packet: every malformed, truncated or non-IP frame is counted by reason.
A file that is not a pcap or pcapng at all is ``BadInput``.

dpkt is imported on the first frame ``decode`` walks (the columnar decoder hands it only
the frames its array path leaves), so reading a capture does not pay dpkt's import.
"""

from __future__ import annotations

import socket
import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dl_nfv.artifacts.errors import BadInput

from .capture import (  # noqa: F401  (re-exported: the link types and the format sniffer)
    DLT_EN10MB,
    DLT_IPV4,
    DLT_IPV6,
    DLT_LINUX_SLL,
    DLT_LINUX_SLL2,
    DLT_LOOP,
    DLT_NULL,
    DLT_RAW,
    LINKTYPES,
    RECORD_REASONS,
    records,
    sniff_format,
)

TCP, UDP = 6, 17
FIN, SYN, RST, ACK = 0x01, 0x02, 0x04, 0x10


class MalformedCounts(Counter):
    """Skipped packets by reason (``truncated_ip``, ``non_ip``, ...)."""


@dataclass(slots=True)
class Packet:
    """One decoded TCP or UDP packet. Addresses are 4 (IPv4) or 16 (IPv6) raw bytes."""

    ts_us: int
    proto: int
    src: bytes
    sport: int
    dst: bytes
    dport: int
    flags: int
    seq: int
    payload: bytes
    wire_bytes: int


def address_text(addr: bytes) -> str:
    """``10.0.0.1`` or ``2001:db8::1`` for a 4- or 16-byte address."""
    return socket.inet_ntop(socket.AF_INET if len(addr) == 4 else socket.AF_INET6, addr)


def read_frames(path: str | Path, malformed: MalformedCounts) -> Iterator[tuple[int, bytes, int]]:
    """Yield ``(ts_us, frame, linktype)`` for every readable record of a pcap or pcapng file.

    Records that cannot be read (cut by the end of the file, oversized, with an
    inconsistent header) are counted in ``malformed`` and never lost silently
    (``capture.py`` says how); a bad file header is ``BadInput``. Linear in the
    file size.
    """
    return records(path, malformed)


def _network_layer(frame: bytes, linktype: int) -> tuple[int, bytes] | str:
    """(ethertype-like version 4/6, IP bytes) or a skip reason."""
    if linktype == DLT_EN10MB:
        import dpkt

        try:
            eth = dpkt.ethernet.Ethernet(frame)
        except (dpkt.Error, struct.error, ValueError):
            return "truncated_ethernet"
        tags = len(getattr(eth, "vlan_tags", None) or ())
        inner = eth.data
        ip = frame[14 + 4 * tags:]
        if isinstance(inner, dpkt.ip.IP):
            return 4, ip
        if isinstance(inner, dpkt.ip6.IP6):
            return 6, ip
        if eth.type not in (dpkt.ethernet.ETH_TYPE_IP, dpkt.ethernet.ETH_TYPE_IP6) and not tags:
            return "non_ip"
        if not ip:
            return "truncated_ip"
        return (ip[0] >> 4, ip) if ip[0] >> 4 in (4, 6) else "non_ip"
    if linktype in (DLT_RAW, DLT_IPV4, DLT_IPV6):
        ip = frame
    elif linktype == DLT_LINUX_SLL:
        if len(frame) < 16:
            return "truncated_link_header"
        proto = struct.unpack("!H", frame[14:16])[0]
        if proto not in (0x0800, 0x86DD):
            return "non_ip"
        ip = frame[16:]
    elif linktype == DLT_LINUX_SLL2:
        if len(frame) < 20:
            return "truncated_link_header"
        proto = struct.unpack("!H", frame[0:2])[0]
        if proto not in (0x0800, 0x86DD):
            return "non_ip"
        ip = frame[20:]
    else:  # DLT_NULL / DLT_LOOP: 4-byte address family, host or network order
        if len(frame) < 4:
            return "truncated_link_header"
        ip = frame[4:]
    if not ip:
        return "truncated_ip"
    version = ip[0] >> 4
    if version not in (4, 6):
        return "non_ip"
    return version, ip


def _raw(layer) -> bytes:
    return layer if isinstance(layer, bytes) else bytes(layer)


def decode(ts_us: int, frame: bytes, linktype: int) -> Packet | str:
    """Decode one frame into a TCP/UDP ``Packet``, or return the reason it is skipped.

    Checks that the IP and transport headers and the IP total length fit in the
    captured bytes; fragments (other than a first fragment's headers) and other
    transport protocols are skipped. O(frame length).
    """
    layer = _network_layer(frame, linktype)
    if isinstance(layer, str):
        return layer
    version, raw = layer
    import dpkt

    try:
        ip = dpkt.ip.IP(raw) if version == 4 else dpkt.ip6.IP6(raw)
    except (dpkt.NeedData, struct.error):
        return "truncated_ip"
    except (dpkt.UnpackError, ValueError):
        return "bad_ip_header"
    if version == 4:
        if ip.v != 4:
            return "bad_ip_header"
        header = ip.hl * 4
        if ip.len and ip.len < header:
            return "bad_ip_length"
        if ip.len and len(raw) < ip.len:
            return "truncated_ip"
        if ip.offset != 0 or ip.mf:
            return "ip_fragment"
        proto, src, dst = ip.p, ip.src, ip.dst
        body = raw[header:ip.len] if ip.len else raw[header:]
    else:
        if len(raw) < 40 + ip.plen:
            return "truncated_ip"
        proto, src, dst = ip.nxt, ip.src, ip.dst
        inner = ip.data
        if proto not in (TCP, UDP):
            if isinstance(inner, (dpkt.tcp.TCP, dpkt.udp.UDP)):
                proto = TCP if isinstance(inner, dpkt.tcp.TCP) else UDP
            elif proto in (0, 43, 60, 44):  # extension headers dpkt could not walk
                return "bad_ip_header" if proto != 44 else "ip_fragment"
        body = _raw(inner) if proto in (TCP, UDP) else b""
    wire = len(frame)
    if proto == TCP:
        if len(body) < 20:
            return "truncated_tcp"
        offset = (body[12] >> 4) * 4
        if offset < 20:
            return "bad_tcp_header"
        if len(body) < offset:
            return "truncated_tcp"
        sport, dport, seq = struct.unpack("!HHI", body[:8])
        flags = body[13]
        return Packet(ts_us, TCP, src, sport, dst, dport, flags, seq, body[offset:], wire)
    if proto == UDP:
        if len(body) < 8:
            return "truncated_udp"
        sport, dport, ulen = struct.unpack("!HHH", body[:6])
        if ulen < 8:
            return "bad_udp_length"
        if ulen > len(body):
            return "truncated_udp"
        return Packet(ts_us, UDP, src, sport, dst, dport, 0, 0, body[8:ulen], wire)
    return "other_protocol"


class PcapWriter:
    """Write Ethernet frames to a pcap (``.pcap``) or pcapng (``.pcapng``) file (dpkt)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.parent.exists():
            raise BadInput(f"{self.path}: folder {self.path.parent} does not exist")
        import dpkt

        self._fh = self.path.open("wb")
        if self.path.suffix == ".pcapng":
            self._writer = dpkt.pcapng.Writer(self._fh, linktype=DLT_EN10MB)
        else:
            self._writer = dpkt.pcap.Writer(self._fh, linktype=DLT_EN10MB)
        self.packets = 0

    def write(self, frame: bytes, ts_us: int) -> None:
        self._writer.writepkt(frame, ts=ts_us / 1_000_000)
        self.packets += 1

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
