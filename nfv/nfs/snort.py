"""A parser for the subset of the Snort rule language dl-nfv's IDS understands.

Accepted::

    alert tcp any any -> any 80 (msg:"SQL injection"; content:"union select"; nocase;
                                 flow:to_server,established; sid:1000001; rev:1;)

(one rule per line in a rules file).

* action ``alert``; protocol ``tcp``, ``udp``, ``ip`` or ``http`` (``http``:
  TCP flows); addresses ``any``;
* ports on both sides: ``any``, a number, a range (``1024:``, ``:1023``,
  ``8000:8999``), a list (``[80,8080,8000:8999]``), the whole spec negatable
  with ``!``;
* direction ``->`` (from the rule's source to its destination: a message from
  a sender whose port matches the source ports to a receiver whose port
  matches the destination ports) or ``<>`` (either way round);
* options ``msg``, ``content`` (quoted, with ``|41 42|`` hex blocks and ``\\"``,
  ``\\;``, ``\\\\`` escapes), ``nocase`` (applies to the content before it),
  ``flow`` with ``to_server``/``from_client`` (client-to-server data only),
  ``to_client``/``from_server`` (server-to-client only) and ``established``
  (TCP flows whose three-way handshake was seen), ``sid`` (required, unique),
  ``rev`` and ``classtype`` (kept, not used);
* blank lines and ``#`` comments are skipped.

Anything else (``pcre``, ``depth``, other ``flow`` keywords, variables such as
``$HOME_NET``, ``drop`` actions, ...) is rejected with ``InvalidRules`` naming
the file and line. What a rule means for a flow (``Rule.applies``): per
direction of the flow, whether that direction's data is the rule's to inspect.
The IDS requires all of a rule's contents in the data of one such direction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dl_nfv.artifacts.errors import BadInput

PROTOCOLS = ("tcp", "udp", "ip", "http")
_HEADER = re.compile(r"^(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(->|<>)\s+(\S+)\s+(\S+)\s*\((.*)\)\s*$")


class InvalidRules(BadInput):
    """A rules file the subset parser does not understand; names the file and line."""


@dataclass(frozen=True, slots=True)
class Content:
    pattern: bytes
    nocase: bool


@dataclass(frozen=True, slots=True)
class Ports:
    """A Snort port spec: inclusive ``ranges`` (none: any port), maybe ``negated``."""

    ranges: tuple[tuple[int, int], ...] = ()
    negated: bool = False

    def mask(self, ports: np.ndarray) -> np.ndarray:
        """Which of ``ports`` the spec matches (bool array)."""
        if not self.ranges:
            return np.ones(ports.shape, dtype=bool)
        hit = np.zeros(ports.shape, dtype=bool)
        for lo, hi in self.ranges:
            hit |= (ports >= lo) & (ports <= hi)
        return hit != self.negated


ANY_PORT = Ports()


@dataclass(frozen=True, slots=True)
class Rule:
    sid: int
    msg: str
    contents: tuple[Content, ...]
    proto: str = "tcp"
    src_ports: Ports = ANY_PORT
    dst_ports: Ports = ANY_PORT
    bidirectional: bool = False  # the ``<>`` operator
    to: str = ""  # flow:to_server -> "server", flow:to_client -> "client", "" either
    established: bool = False  # flow:established
    rev: int = 1
    line: int = 0

    def applies(self, proto: str, client_port: int, server_port: int, direction: int,
                established: bool = True) -> bool:
        """Whether the data of ``direction`` (0: client to server, 1: server to client) of a
        flow with these ends is this rule's to inspect."""
        one = self.applies_all([proto], np.array([client_port]), np.array([server_port]),
                               np.array([established]))
        return bool(one[0, direction])

    def applies_all(self, protos: list[str], client_ports: np.ndarray, server_ports: np.ndarray,
                    established: np.ndarray) -> np.ndarray:
        """``[flows, 2]`` bool: ``applies`` for every flow and direction at once."""
        names = np.asarray(protos, dtype=object)
        if self.proto in ("tcp", "http"):
            ok = names == "tcp"
        elif self.proto == "udp":
            ok = names == "udp"
        else:
            ok = np.ones(len(names), dtype=bool)
        if self.established:
            ok = ok & (names == "tcp") & established.astype(bool)
        c_src, c_dst = self.src_ports.mask(client_ports), self.dst_ports.mask(client_ports)
        s_src, s_dst = self.src_ports.mask(server_ports), self.dst_ports.mask(server_ports)
        forward = c_src & s_dst  # client sends, server receives
        backward = s_src & c_dst  # server sends, client receives
        if self.bidirectional:  # either end may be the rule's source
            forward, backward = forward | backward, forward | backward
        out = np.stack([ok & forward, ok & backward], axis=1)
        if self.to == "server":
            out[:, 1] = False
        elif self.to == "client":
            out[:, 0] = False
        return out


def _port_number(text: str, spec: str, where: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise InvalidRules(f"{where}: bad port {spec!r} (a port is 0-65535)")
    return int(text)


def parse_ports(spec: str, where: str = "rule") -> Ports:
    """``any``, ``80``, ``1024:``, ``:1023``, ``80:90``, ``[80,8080,9000:]``, each maybe ``!``."""
    text = spec
    negated = text.startswith("!")
    if negated:
        text = text[1:]
    if "$" in text:
        raise InvalidRules(f"{where}: unsupported port {spec!r} (variables are not supported; "
                           f"give numbers, ranges or lists)")
    if text == "any":
        if negated:
            raise InvalidRules(f"{where}: port '!any' matches nothing")
        return ANY_PORT
    if text.startswith("[") and text.endswith("]"):
        items = text[1:-1].split(",")
    else:
        items = [text]
    ranges = []
    for item in items:
        if item.startswith("!") or item.startswith("[") or item == "any":
            raise InvalidRules(f"{where}: unsupported port {spec!r} (negation and 'any' only "
                               f"for the whole port spec, no nested lists)")
        if ":" in item:
            lo, _, hi = item.partition(":")
            if not lo and not hi:
                raise InvalidRules(f"{where}: bad port range {spec!r}")
            low = _port_number(lo, spec, where) if lo else 0
            high = _port_number(hi, spec, where) if hi else 65535
            if low > high:
                raise InvalidRules(f"{where}: bad port range {spec!r} ({low} > {high})")
            ranges.append((low, high))
        else:
            port = _port_number(item, spec, where)
            ranges.append((port, port))
    return Ports(ranges=tuple(ranges), negated=negated)


FLOW_KEYWORDS = {"to_server": "server", "from_client": "server", "to_client": "client",
                 "from_server": "client", "established": ""}


def _flow_option(value: str | None, where: str) -> tuple[str, bool]:
    """(``to``, ``established``) of a ``flow:`` option."""
    if not value:
        raise InvalidRules(f"{where}: option 'flow' needs a value (e.g. flow:to_server,established)")
    to, established = "", False
    for word in (w.strip() for w in value.split(",")):
        if word not in FLOW_KEYWORDS:
            raise InvalidRules(f"{where}: unsupported flow option {word!r} (supported: "
                               f"{', '.join(FLOW_KEYWORDS)})")
        if word == "established":
            established = True
        elif to and to != FLOW_KEYWORDS[word]:
            raise InvalidRules(f"{where}: flow option {value!r} names both directions")
        else:
            to = FLOW_KEYWORDS[word]
    return to, established


def _split_options(body: str, where: str) -> list[tuple[str, str | None]]:
    out = []
    i, n = 0, len(body)
    while i < n:
        while i < n and body[i] in " \t":
            i += 1
        if i >= n:
            break
        j = i
        while j < n and body[j] not in ":;":
            j += 1
        name = body[i:j].strip()
        value = None
        if j < n and body[j] == ":":
            j += 1
            while j < n and body[j] in " \t":
                j += 1
            if j < n and body[j] == '"':
                k = j + 1
                while k < n and body[k] != '"':
                    k += 2 if body[k] == "\\" else 1
                if k >= n:
                    raise InvalidRules(f"{where}: unterminated quoted value in option {name!r}")
                value = body[j:k + 1]
                j = k + 1
                while j < n and body[j] in " \t":
                    j += 1
            else:
                k = j
                while k < n and body[k] != ";":
                    k += 1
                value = body[j:k].strip()
                j = k
        if j < n and body[j] != ";":
            raise InvalidRules(f"{where}: expected ';' after option {name!r}")
        if j >= n:
            raise InvalidRules(f"{where}: option {name!r} must end with ';'")
        out.append((name, value))
        i = j + 1
    return out


def _unquote(value: str | None, name: str, where: str) -> str:
    if value is None or len(value) < 2 or value[0] != '"' or value[-1] != '"':
        raise InvalidRules(f"{where}: option {name!r} needs a quoted value")
    return value[1:-1]


def _content_bytes(text: str, where: str) -> bytes:
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i + 1 >= len(text) or text[i + 1] not in '"\\;:':
                raise InvalidRules(f"{where}: bad escape in content {text!r}")
            out += text[i + 1].encode()
            i += 2
        elif c == "|":
            end = text.find("|", i + 1)
            if end < 0:
                raise InvalidRules(f"{where}: unterminated hex block in content {text!r}")
            hexpart = text[i + 1:end].replace(" ", "")
            try:
                out += bytes.fromhex(hexpart)
            except ValueError:
                raise InvalidRules(f"{where}: bad hex block |{text[i + 1:end]}| in content") from None
            i = end + 1
        elif c in '";':
            raise InvalidRules(f"{where}: unescaped {c!r} in content {text!r}")
        else:
            out += c.encode("latin-1", errors="strict") if ord(c) < 256 else c.encode()
            i += 1
    if not out:
        raise InvalidRules(f"{where}: empty content")
    return bytes(out)


def parse_rule(text: str, where: str = "rule", line: int = 0) -> Rule:
    """Parse one rule; ``InvalidRules`` (exit 2) prefixed with ``where`` when not understood."""
    m = _HEADER.match(text.strip())
    if not m:
        raise InvalidRules(f"{where}: not a rule (expected 'alert PROTO SRC SPORT -> DST DPORT "
                           f"(options;)')")
    action, proto, src, sport, arrow, dst, dport, body = m.groups()
    if action != "alert":
        raise InvalidRules(f"{where}: unsupported action {action!r} (only 'alert')")
    if proto not in PROTOCOLS:
        raise InvalidRules(f"{where}: unsupported protocol {proto!r} (valid: {', '.join(PROTOCOLS)})")
    for addr in (src, dst):
        if addr != "any":
            raise InvalidRules(f"{where}: unsupported address {addr!r} (only 'any')")
    src_ports, dst_ports = parse_ports(sport, where), parse_ports(dport, where)
    to, established = "", False
    seen_flow = False
    msg, sid, rev = None, None, 1
    contents: list[Content] = []
    for name, value in _split_options(body, where):
        if name == "msg":
            msg = _unquote(value, name, where)
        elif name == "content":
            raw = _unquote(value, name, where)
            if raw.startswith("!"):
                raise InvalidRules(f"{where}: negated content is not supported")
            contents.append(Content(_content_bytes(raw, where), False))
        elif name == "nocase":
            if value is not None:
                raise InvalidRules(f"{where}: 'nocase' takes no value")
            if not contents:
                raise InvalidRules(f"{where}: 'nocase' must follow a 'content'")
            last = contents.pop()
            contents.append(Content(last.pattern, True))
        elif name in ("sid", "rev"):
            if value is None or not value.isdigit():
                raise InvalidRules(f"{where}: option {name!r} needs a positive integer, got {value!r}")
            if name == "sid":
                sid = int(value)
            else:
                rev = int(value)
        elif name == "flow":
            if seen_flow:
                raise InvalidRules(f"{where}: option 'flow' given twice")
            seen_flow = True
            to, established = _flow_option(value, where)
        elif name == "classtype":
            continue
        else:
            raise InvalidRules(f"{where}: unsupported option {name!r} (supported: msg, content, "
                               f"nocase, flow, sid, rev, classtype)")
    if sid is None:
        raise InvalidRules(f"{where}: rule has no 'sid'")
    if not contents:
        raise InvalidRules(f"{where}: rule sid {sid} has no 'content'")
    if established and proto == "udp":
        raise InvalidRules(f"{where}: flow:established needs TCP; a udp rule never matches it")
    return Rule(sid=sid, msg=msg or f"sid {sid}", contents=tuple(contents), proto=proto,
                src_ports=src_ports, dst_ports=dst_ports, bidirectional=arrow == "<>", to=to,
                established=established, rev=rev, line=line)


def parse_rules(text: str, source: str = "rules") -> tuple[Rule, ...]:
    """Parse a rules file's text; each error names ``source`` and the 1-based line."""
    rules = []
    seen: dict[int, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        rule = parse_rule(stripped, f"{source}:{number}", number)
        if rule.sid in seen:
            raise InvalidRules(f"{source}:{number}: duplicate sid {rule.sid} "
                               f"(first on line {seen[rule.sid]})")
        seen[rule.sid] = number
        rules.append(rule)
    if not rules:
        raise InvalidRules(f"{source}: no rules")
    return tuple(rules)


def load_rules(path: str | Path) -> tuple[Rule, ...]:
    """Read and parse a rules file; ``BadInput`` if it cannot be read."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{path}: no such rules file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read rules file: {exc}") from None
    return parse_rules(text, str(path))
