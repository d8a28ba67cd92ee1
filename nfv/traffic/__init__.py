"""Packets in, messages out: pcap/pcapng I/O, flow table, TCP reassembly, HTTP/1.1 framing."""

from .pcap import MalformedCounts, read_frames
from .trace import FlowInfo, Trace, load_trace

__all__ = ["FlowInfo", "MalformedCounts", "Trace", "load_trace", "read_frames"]
