"""The firewall's ACL as a rule table matched against many packets (or flows) at once.

The IPv4 rules of ``reference.compile_acl`` become a [fields, rules, 1] block (source
mask and value, destination mask and value, the port ranges' ends, protocol, any
protocol); every rule is matched against every packet at once ([rules, packets]), and
the first match wins by a code per rule (0: no match; else 2 * (rules - rank) + allow,
so the first match has the largest code and the largest code's low bit is the answer).
``match`` runs over torch tensors or over numpy arrays: the firewall matches a CPU's
flows (a few hundred entries, two per flow) by numpy, whose calls cost a fraction of
torch's at that size.
"""

from __future__ import annotations

import numpy as np
import torch

from .ops import take


def rule_table(rules, default_allow: bool, device):
    """(fields [10, rules, 1], codes [rules, 1], answer by code) of the IPv4 ``rules``."""
    rules = [r for r in rules if r[3] >= 0 and r[5] >= 0]
    fields = [[r[k] for r in rules] for k in (3, 2, 5, 4, 6, 7, 8, 9, 1)]
    fields.append([int(r[1] == 0) for r in rules])
    codes = [2 * (len(rules) - i) + r[0] for i, r in enumerate(rules)]
    answer = [int(default_allow)] * (2 * len(rules) + 2)
    for code in codes:
        answer[code] = code & 1
    return (torch.tensor(fields, dtype=torch.int64, device=device).reshape(
                len(fields), len(rules), 1),
            torch.tensor(codes, dtype=torch.int64, device=device).unsqueeze(1),
            torch.tensor(answer, dtype=torch.int64, device=device))


def match(table, default_allow: bool, src, dst, sport, dport, proto):
    """Per entry, the first matching rule's answer (1: allow; ``default_allow`` where none
    matches): tensors, or numpy arrays (with ``table`` on a CPU)."""
    host = isinstance(src, np.ndarray)
    if host:
        table = [t.numpy() for t in table]
    (smask, rsrc, dmask, rdst, slo, shi, dlo, dhi, rproto, anyproto), codes, answer = table
    if codes.shape[0] == 0:
        return np.full_like(src, int(default_allow)) if host else \
            torch.full_like(src, int(default_allow))
    hit = ((src & smask) == rsrc) & ((dst & dmask) == rdst) & (sport >= slo) \
        & (sport <= shi) & (dport >= dlo) & (dport <= dhi) \
        & ((proto == rproto) | (anyproto != 0))
    if host:
        return answer[(hit * codes).max(0)]
    return take(answer, (hit * codes).amax(0))
