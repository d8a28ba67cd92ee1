"""Shared fixtures for the NFV tests: frame builders and small generated traces."""

from __future__ import annotations

from pathlib import Path

import dpkt

from dl_nfv.nfv.traffic.pcap import PcapWriter

DATA = Path(__file__).resolve().parents[1] / "data"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "nf"
REAL_TRACE = DATA / "loopback-http.pcap"
RULES = EXAMPLES / "ids.rules"


def tcp_frame(src: bytes, dst: bytes, sport: int, dport: int, seq: int, flags: int,
              data: bytes = b"", ack: int = 0, vlan: int | None = None, v6: bool = False) -> bytes:
    tcp = dpkt.tcp.TCP(sport=sport, dport=dport, seq=seq % 2**32, ack=ack, flags=flags,
                       win=65535, data=data)
    if v6:
        ip = dpkt.ip6.IP6(src=src, dst=dst, nxt=dpkt.ip.IP_PROTO_TCP, hlim=64, data=tcp)
        ip.plen = len(tcp)
        eth_type = dpkt.ethernet.ETH_TYPE_IP6
    else:
        ip = dpkt.ip.IP(src=src, dst=dst, p=dpkt.ip.IP_PROTO_TCP, data=tcp)
        ip.len = 20 + len(tcp)
        eth_type = dpkt.ethernet.ETH_TYPE_IP
    eth = dpkt.ethernet.Ethernet(src=b"\x02" * 6, dst=b"\x04" * 6, type=eth_type, data=ip)
    frame = bytes(eth)
    if vlan is not None:  # insert an 802.1Q tag after the MAC addresses
        frame = frame[:12] + b"\x81\x00" + vlan.to_bytes(2, "big") + frame[12:]
    return frame


def write_pcap(path: Path, frames: list[bytes]) -> Path:
    with PcapWriter(path) as w:
        for i, frame in enumerate(frames):
            w.write(frame, 1_000_000 + i)
    return path


def http_connection(client: bytes, server: bytes, cport: int, messages: list[tuple[int, bytes]],
                    *, v6: bool = False, vlan: int | None = None, mss: int = 100,
                    sport: int = 80) -> list[bytes]:
    """Frames of one TCP connection carrying ``messages`` ((direction, bytes) in order):
    the handshake (the first three frames), the data, the FINs (the last two)."""
    S, A, F, P = dpkt.tcp.TH_SYN, dpkt.tcp.TH_ACK, dpkt.tcp.TH_FIN, dpkt.tcp.TH_PUSH
    seq = [1000, 5000]
    ends = [(client, cport), (server, sport)]
    kw = {"v6": v6, "vlan": vlan}
    frames = [tcp_frame(client, server, cport, sport, seq[0], S, **kw),
              tcp_frame(server, client, sport, cport, seq[1], S | A, ack=seq[0] + 1, **kw)]
    seq = [seq[0] + 1, seq[1] + 1]
    frames.append(tcp_frame(client, server, cport, sport, seq[0], A, **kw))
    for d, data in messages:
        (src, sp), (dst, dp) = ends[d], ends[1 - d]
        for i in range(0, len(data), mss):
            piece = data[i:i + mss]
            frames.append(tcp_frame(src, dst, sp, dp, seq[d], A | P, piece, **kw))
            seq[d] += len(piece)
    frames.append(tcp_frame(client, server, cport, sport, seq[0], F | A, **kw))
    frames.append(tcp_frame(server, client, sport, cport, seq[1], F | A, **kw))
    return frames
