"""The Snort rule subset: what it accepts, what it rejects (with the line number)."""

from __future__ import annotations

import pytest

from dl_nfv.nfv.nfs.snort import InvalidRules, load_rules, parse_rules

from .helpers import RULES


def test_example_rules_parse():
    rules = load_rules(RULES)
    assert [r.sid for r in rules] == list(range(1000001, 1000011))
    sqli = rules[1]
    assert sqli.msg == "SQL injection: union select"
    assert [(c.pattern, c.nocase) for c in sqli.contents] == [(b"union", True), (b"select", True)]
    assert rules[8].contents[0].pattern == b"\x90" * 8
    assert rules[0].port == 80 and rules[0].applies("tcp", 5555, 80)
    assert not rules[0].applies("tcp", 5555, 8080) and not rules[0].applies("udp", 1, 80)


def test_escapes_and_hex():
    (rule,) = parse_rules(r'alert tcp any any <> any any (msg:"q"; content:"a\"b\;c|0d 0a|"; sid:5;)')
    assert rule.contents[0].pattern == b'a"b;c\r\n' and rule.port is None


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
