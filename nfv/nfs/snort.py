"""A parser for the subset of the Snort rule language dl-nfv's IDS understands.

Accepted::

    alert tcp any any -> any 80 (msg:"SQL injection"; content:"union select"; nocase; sid:1000001; rev:1;)

* action ``alert``; protocol ``tcp``, ``udp``, ``ip`` or ``http``; addresses
  ``any``; ports ``any`` or a number; direction ``->`` or ``<>`` (the port
  filter applies to the server port; ``<>`` matches either end);
* options ``msg``, ``content`` (quoted, with ``|41 42|`` hex blocks and ``\\"``,
  ``\\;``, ``\\\\`` escapes), ``nocase`` (applies to the content before it),
  ``sid`` (required, unique), ``rev`` and ``classtype`` (kept, not used);
* blank lines and ``#`` comments are skipped.

Anything else (``pcre``, ``depth``, variables such as ``$HOME_NET``, ``drop``
actions, ...) is rejected with ``InvalidRules`` naming the file and line.
A rule alerts once per flow, at the message where the last of its contents
has been seen in the flow's reassembled payload (either direction).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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
class Rule:
    sid: int
    msg: str
    contents: tuple[Content, ...]
    proto: str = "tcp"
    port: int | None = None  # server port filter; None is any
    bidirectional: bool = False
    rev: int = 1
    line: int = 0

    def applies(self, proto: str, client_port: int, server_port: int) -> bool:
        if self.proto in ("tcp", "http") and proto != "tcp":
            return False
        if self.proto == "udp" and proto != "udp":
            return False
        if self.port is None:
            return True
        return server_port == self.port or (self.bidirectional and client_port == self.port)


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
    ports = []
    for port in (sport, dport):
        if port == "any":
            ports.append(None)
        elif port.isdigit() and 0 < int(port) < 65536:
            ports.append(int(port))
        else:
            raise InvalidRules(f"{where}: unsupported port {port!r} (only 'any' or a number)")
    if ports[0] is not None and ports[1] is not None:
        raise InvalidRules(f"{where}: give a port on one side only")
    port = ports[1] if ports[1] is not None else ports[0]
    bidirectional = arrow == "<>" or (ports[0] is not None)
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
        elif name == "classtype":
            continue
        else:
            raise InvalidRules(f"{where}: unsupported option {name!r} (supported: msg, content, "
                               f"nocase, sid, rev, classtype)")
    if sid is None:
        raise InvalidRules(f"{where}: rule has no 'sid'")
    if not contents:
        raise InvalidRules(f"{where}: rule sid {sid} has no 'content'")
    return Rule(sid=sid, msg=msg or f"sid {sid}", contents=tuple(contents), proto=proto,
                port=port, bidirectional=bidirectional, rev=rev, line=line)


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
