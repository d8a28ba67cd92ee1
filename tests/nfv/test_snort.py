"""The Snort rule subset: what it accepts, what it rejects (with the line number)."""

from __future__ import annotations

import numpy as np
import pytest

from dl_nfv.nfv.nfs.snort import InvalidRules, load_rules, parse_ports, parse_rules

from .helpers import RULES


def test_example_rules_parse():
    rules = load_rules(RULES)
    assert [r.sid for r in rules] == list(range(1000001, 1000011))
    sqli = rules[1]
    assert sqli.msg == "SQL injection: union select"
    assert [(c.pattern, c.nocase) for c in sqli.contents] == [(b"union", True), (b"select", True)]
    assert rules[8].contents[0].pattern == b"\x90" * 8
    # "any any -> any 80": what a client sends to port 80, nothing the server answers
    assert rules[0].applies("tcp", 5555, 80, 0) and not rules[0].applies("tcp", 5555, 80, 1)
    assert not rules[0].applies("tcp", 5555, 8080, 0) and not rules[0].applies("udp", 1, 80, 0)
    assert not rules[0].applies("tcp", 5555, 80, 0, established=False)  # flow:established
    # "any 80 -> any any" with flow:to_client: what the server on port 80 answers
    assert rules[5].applies("tcp", 5555, 80, 1) and not rules[5].applies("tcp", 5555, 80, 0)
    # "<>": both directions
    assert rules[6].applies("tcp", 5555, 80, 0) and rules[6].applies("tcp", 5555, 80, 1)


def test_escapes_and_hex():
    (rule,) = parse_rules(r'alert tcp any any <> any any (msg:"q"; content:"a\"b\;c|0d 0a|"; sid:5;)')
    assert rule.contents[0].pattern == b'a"b;c\r\n' and rule.bidirectional


@pytest.mark.parametrize("spec, inside, outside", [
    ("any", [0, 80, 65535], []),
    ("80", [80], [79, 81]),
    ("1024:", [1024, 65535], [1023]),
    (":1023", [0, 1023], [1024]),
    ("8000:8999", [8000, 8500, 8999], [7999, 9000]),
    ("[80,443,8000:8080]", [80, 443, 8000, 8080], [81, 8081]),
    ("!80", [79, 81], [80]),
    ("![80,443]", [8080], [80, 443]),
])
def test_port_specs(spec, inside, outside):
    ports = parse_ports(spec)
    assert all(ports.mask(np.array(inside))) and not any(ports.mask(np.array(outside)))


def test_ports_on_both_sides_and_the_direction_operator():
    (rule,) = parse_rules('alert tcp any 1024: -> any 80 (content:"a"; sid:1;)')
    assert rule.applies("tcp", 5000, 80, 0)  # client 5000 -> server 80
    assert not rule.applies("tcp", 1000, 80, 0)  # client port outside 1024:
    assert not rule.applies("tcp", 5000, 80, 1)  # server 80 -> client 5000: wrong way
    (both,) = parse_rules('alert tcp any 1024: <> any 80 (content:"a"; sid:1;)')
    assert both.applies("tcp", 5000, 80, 0) and both.applies("tcp", 5000, 80, 1)
    assert not both.applies("tcp", 1000, 80, 0)
    (to_client,) = parse_rules('alert ip any any <> any any (content:"a"; flow:from_server; '
                               'sid:1;)')
    assert to_client.applies("udp", 1, 2, 1) and not to_client.applies("udp", 1, 2, 0)


@pytest.mark.parametrize("line, message", [
    ('alert tcp any any -> any 80 (msg:"x"; content:"a"; pcre:"/a/"; sid:1;)',
     "unsupported option 'pcre'"),
    ('alert tcp any any -> any 80 (msg:"x"; content:"a";)', "no 'sid'"),
    ('alert tcp any any -> any 80 (msg:"x"; sid:1;)', "no 'content'"),
    ('drop tcp any any -> any 80 (content:"a"; sid:1;)', "unsupported action 'drop'"),
    ('alert tcp $HOME_NET any -> any 80 (content:"a"; sid:1;)', "unsupported address"),
    ('alert tcp any any -> any 80 (content:"a|4|"; sid:1;)', "bad hex block"),
    ('alert tcp any any -> any 80 (content:"a"; sid:1)', "must end with ';'"),
    ('alert tcp any any -> any 80 (nocase; content:"a"; sid:1;)', "'nocase' must follow"),
    ('alert tcp any any -> any 80 (content:"a; sid:1;)', "unterminated"),
    ('alert icmp any any -> any any (content:"a"; sid:1;)', "unsupported protocol"),
    ("this is not a rule", "not a rule"),
    ('alert tcp any any -> any 80 (content:"a"; flow:stateless; sid:1;)',
     "unsupported flow option 'stateless'"),
    ('alert tcp any any -> any 80 (content:"a"; flow:to_server,to_client; sid:1;)',
     "names both directions"),
    ('alert tcp any any -> any 80 (content:"a"; flow:to_server; flow:established; sid:1;)',
     "'flow' given twice"),
    ('alert udp any any -> any 53 (content:"a"; flow:established; sid:1;)', "needs TCP"),
    ('alert tcp any any -> any 70000 (content:"a"; sid:1;)', "bad port '70000'"),
    ('alert tcp any any -> any 90:80 (content:"a"; sid:1;)', "bad port range"),
    ('alert tcp any any -> any [80,!81] (content:"a"; sid:1;)', "unsupported port"),
    ('alert tcp any any -> any $HTTP_PORTS (content:"a"; sid:1;)', "variables are not supported"),
])
def test_rejects_with_line_number(line, message):
    text = "# comment\n\nalert tcp any any -> any 80 (msg:\"ok\"; content:\"ok\"; sid:9;)\n" + line
    with pytest.raises(InvalidRules) as err:
        parse_rules(text, "r.rules")
    assert str(err.value).startswith("r.rules:4: ") and message in str(err.value)


def test_duplicate_sid_and_empty_file():
    with pytest.raises(InvalidRules, match=r"r:2: duplicate sid 1 \(first on line 1\)"):
        parse_rules('alert tcp any any -> any any (content:"a"; sid:1;)\n'
                    'alert tcp any any -> any any (content:"b"; sid:1;)', "r")
    with pytest.raises(InvalidRules, match="no rules"):
        parse_rules("# nothing\n", "r")
