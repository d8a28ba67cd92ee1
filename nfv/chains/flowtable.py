"""A flow table on the device: open addressing over int64 tensors, batched operations.

Keys are the two words of ``packets.key_pair`` (``k2`` is never negative, so
``k2 == EMPTY`` marks a free slot and ``k2 == TOMB`` a deleted one); values are
named int64 columns of a row per slot (``values``: one gather or scatter moves
every column of a flow). Every operation takes a batch of keys:

* ``lookup(k1, k2)`` — linear probing from ``mix_hash % capacity``, all keys at
  once: the home slot, then a window of slots per round for the keys still
  searching (a long probe sequence costs few rounds); a key stops at its slot or
  at an empty slot (not found; tombstones are probed past).
* ``insert(k1, k2)`` — keys that are distinct and absent. Each round, every key
  still looking takes the first free slot of a window of ``PROBE_WINDOW`` slots
  from its probe position; when several want the same free slot one scatter picks
  a winner and the others probe on from the slot after it (collision handling
  within the batch). Tombstones are reused.
* ``delete(slots)`` — tombstones; ``reserve`` (called by ``insert``, or before a
  batch's lookup by a caller that will insert its new keys) rehashes the table when
  live entries plus tombstones would pass half the capacity, doubling it until they
  fill at most a quarter, which moves every entry: callers holding slots look them
  up again.

Expected probes per key are O(1) at load <= 1/2 (about 2.5 for a miss); the
rounds of a batch are as many as its longest probe sequence over ``PROBE_WINDOW``. No host round-trip per key: the loops run
over tensors and stop when no key is left searching. On a CPU the same probes run by
numpy over the tensors' memory (``ops.HOST``): a batch's keys are a few hundred,
where a numpy call costs a fraction of a torch call.
"""

from __future__ import annotations

import numpy as np
import torch

from .ops import on_host, pick, put, take
from .packets import mix_hash

EMPTY, TOMB = -1, -2
PROBE_WINDOW = 8  # slots a lookup (after the home slot) or an insert probes per round
MAX_LOAD = 0.5  # short probe sequences, and half the table's memory of a load of 1/4


def capacity_for(keys: int) -> int:
    """The capacity a rehash would give a table of ``keys`` live entries (a power of two
    they fill at most a quarter of): sized so once, the table never rehashes for them."""
    capacity = 16
    while keys > MAX_LOAD * capacity / 2:
        capacity *= 2
    return capacity


class DeviceFlowTable:
    """Open-addressing flow table with int64 value ``columns`` (name -> fill value)."""

    def __init__(self, capacity: int, device, columns: dict[str, int]):
        self.device = device
        self.fills = dict(columns)
        self._alloc(capacity)
        self.live = 0
        self.used = 0  # live entries + tombstones

    def add_columns(self, columns: dict[str, int]) -> None:
        """More value columns (name -> fill value), at their fill in every slot."""
        old = self.values
        self.fills.update(columns)
        self._columns(self.capacity)
        self.values[:, :old.shape[1]] = old

    def _columns(self, capacity: int) -> None:
        """``values``: a row per slot, a column per name (``index``); ``cols``: its columns."""
        fills = torch.tensor(list(self.fills.values()), dtype=torch.int64, device=self.device)
        self.values = fills.repeat(capacity, 1)
        self.index = {name: j for j, name in enumerate(self.fills)}
        self.cols = {name: self.values[:, j] for name, j in self.index.items()}

    def _alloc(self, capacity: int) -> None:
        self.capacity = capacity
        self.k1 = torch.zeros(capacity, dtype=torch.int64, device=self.device)
        self.k2 = torch.full((capacity,), EMPTY, dtype=torch.int64, device=self.device)
        self._columns(capacity)
        # which key claimed a slot in an insert round; every claimant of a free slot writes
        # it in that round, so values left from earlier rounds are never read
        self._owner = torch.full((capacity,), -1, dtype=torch.int64, device=self.device)

    def _home(self, k1, k2):
        return mix_hash(k1, k2, 32) & (self.capacity - 1)

    def lookup(self, k1, k2):
        """Slots of the keys, -1 where absent.

        The first round probes each key's home slot (where most keys end); the keys still
        searching then probe ``PROBE_WINDOW`` consecutive slots per round and stop at the
        window's first hit or empty slot, the order linear probing visits them in."""
        if self._host():
            return torch.from_numpy(self._lookup_host(k1.numpy(), k2.numpy())[0])
        return self._lookup(k1, k2)[0]

    def _host(self) -> bool:
        return on_host(self.k2)

    def upsert(self, k1, k2):
        """Slots of the keys (distinct), the absent ones inserted with their columns left as
        they were (for callers that write every column); and which keys were present (bool).

        One probe serves most keys: the lookup's first round finds a key at its home slot
        or stops it at an empty one, and an absent key whose home slot is free (empty, or
        a tombstone: the slot ``insert`` would give it first) takes that slot at once (a
        scatter picks one winner where several share it); only the others go on to
        ``insert``'s rounds. Rehashes before the lookup if the keys might not fit,
        so nothing moves after."""
        self.reserve(int(k1.shape[0]))
        if self._host():
            return self._upsert_host(k1.numpy(), k2.numpy())
        found, home, at_home = self._lookup(k1, k2)
        present = found >= 0
        claim = torch.nonzero((at_home < 0) & ~present).squeeze(1)
        if claim.numel():
            at = take(home, claim)
            put(self._owner, at, claim)
            won = take(claim, torch.nonzero(take(self._owner, at) == claim).squeeze(1))
            slots = take(home, won)
            put(self.k1, slots, take(k1, won))
            put(self.k2, slots, take(k2, won))
            put(found, won, slots)
            self.live += int(won.numel())
            self.used += int((take(at_home, won) == EMPTY).sum())  # tombstones were counted
        rest = torch.nonzero(found < 0).squeeze(1)
        if rest.numel():
            put(found, rest, self.insert(take(k1, rest), take(k2, rest), fill=False))
        return found, present

    def _lookup(self, k1, k2):
        """``lookup``'s slots; each key's home slot; the key word there (``EMPTY``, ``TOMB``
        or a key's)."""
        n = k1.shape[0]
        found = torch.full((n,), -1, dtype=torch.int64, device=self.device)
        home = self._home(k1, k2)
        slot = home.clone()
        mask = self.capacity - 1
        t2 = take(self.k2, slot)
        hit = (t2 == k2) & (take(self.k1, slot) == k1)
        found = pick(hit, slot, found)
        at_home = t2
        empty = t2 == EMPTY
        todo = torch.nonzero(~hit & ~empty).squeeze(1)
        step = torch.arange(1, PROBE_WINDOW + 1, device=self.device)
        while todo.numel():
            at = take(slot, todo)
            s = (at.unsqueeze(1) + step) & mask  # [keys, window]
            t2 = take(self.k2, s)
            hit = (t2 == take(k2, todo).unsqueeze(1)) \
                & (take(self.k1, s) == take(k1, todo).unsqueeze(1))
            stop = hit | (t2 == EMPTY)
            first = torch.argmax(stop.to(torch.uint8), dim=1, keepdim=True)
            ended = stop.gather(1, first).squeeze(1)
            got = hit.gather(1, first).squeeze(1) & ended
            put(found, todo, pick(got, s.gather(1, first).squeeze(1), -1))
            left = torch.nonzero(~ended).squeeze(1)
            todo = take(todo, left)
            put(slot, todo, (take(at, left) + PROBE_WINDOW) & mask)
        return found, home, at_home

    def _upsert_host(self, k1, k2):
        """``upsert`` by numpy (``k1``, ``k2``: arrays); where several keys claim one free
        home slot, the last of them takes it."""
        found, home, at_home = self._lookup_host(k1, k2)
        present = found >= 0
        claim = ((at_home < 0) & ~present).nonzero()[0]
        if claim.shape[0]:
            at = home[claim]
            owner = self._owner.numpy()
            owner[at] = claim
            won = claim[owner[at] == claim]
            slots = home[won]
            self.k1.numpy()[slots] = k1[won]
            self.k2.numpy()[slots] = k2[won]
            found[won] = slots
            self.live += int(won.shape[0])
            self.used += int((at_home[won] == EMPTY).sum())  # tombstones were counted
        rest = (found < 0).nonzero()[0]
        if rest.shape[0]:
            found[rest] = self.insert(torch.from_numpy(k1[rest]), torch.from_numpy(k2[rest]),
                                      fill=False).numpy()
        return torch.from_numpy(found), torch.from_numpy(present)

    def _lookup_host(self, k1, k2):
        """``_lookup`` by numpy (``k1``, ``k2``: arrays): the same probes."""
        t1, t2 = self.k1.numpy(), self.k2.numpy()
        mask = self.capacity - 1
        home = mix_hash(k1, k2, 32) & mask
        slot = home.copy()
        at_home = t2.take(slot)
        hit = (at_home == k2) & (t1[slot] == k1)
        found = np.where(hit, slot, -1)
        empty = at_home == EMPTY
        todo = (~hit & ~empty).nonzero()[0]
        step = np.arange(1, PROBE_WINDOW + 1)
        while todo.shape[0]:
            at = slot[todo]
            s = (at[:, None] + step) & mask  # [keys, window]
            got2 = t2[s]
            hit = (got2 == k2[todo, None]) & (t1[s] == k1[todo, None])
            stop = hit | (got2 == EMPTY)
            first = stop.argmax(1)
            keys = np.arange(todo.shape[0])
            ended = stop[keys, first]
            found[todo] = np.where(hit[keys, first] & ended, s[keys, first], -1)
            left = (~ended).nonzero()[0]
            todo = todo[left]
            slot[todo] = (at[left] + PROBE_WINDOW) & mask
        return found, home, at_home

    def insert(self, k1, k2, *, fill: bool = True):
        """Slots given to the keys (distinct, absent), with their columns at the fill values
        (left as they were with ``fill=False``, for callers that write every column)."""
        n = int(k1.shape[0])
        if n == 0:
            return torch.zeros(0, dtype=torch.int64, device=self.device)
        self.reserve(n)
        if self._host():
            got, fresh = self._insert_host(k1.numpy(), k2.numpy())
            got = torch.from_numpy(got)
        else:
            got, fresh = self._insert(k1, k2)
        if fill and self.fills:
            self.values[got] = torch.tensor(list(self.fills.values()), dtype=torch.int64,
                                            device=self.device)
        self.live += n
        self.used += fresh
        return got

    def _insert(self, k1, k2):
        """``insert``'s rounds: the slots taken, and how many of them were empty (not
        tombstones)."""
        n = int(k1.shape[0])
        got = torch.full((n,), -1, dtype=torch.int64, device=self.device)
        owner = self._owner
        todo = torch.arange(n, device=self.device)
        slot = self._home(k1, k2)
        mask = self.capacity - 1
        step = torch.arange(PROBE_WINDOW, device=self.device)
        fresh = 0
        while todo.numel():
            at = take(slot, todo)
            window = (at.unsqueeze(1) + step) & mask  # [keys, window]
            free = take(self.k2, window) < 0
            first = torch.argmax(free.to(torch.uint8), dim=1, keepdim=True)
            has = free.gather(1, first).squeeze(1)
            s = window.gather(1, first).squeeze(1)
            # every key writes its claim; a key without a free slot writes at an occupied
            # one (its window's first), whose owner no winner check reads
            put(owner, s, todo)
            win = torch.nonzero(has & (take(owner, s) == todo)).squeeze(1)
            ws, tw = take(s, win), take(todo, win)
            fresh += int((take(self.k2, ws) == EMPTY).sum())
            put(self.k1, ws, take(k1, tw))
            put(self.k2, ws, take(k2, tw))
            put(got, tw, ws)
            # left: keys whose window was full (the next window) or whose slot another key
            # took (the slot after it)
            nxt = pick(has, s + 1, at + PROBE_WINDOW) & mask
            left = torch.ones_like(has).index_fill_(0, win, False)
            todo = todo[left]
            put(slot, todo, nxt[left])
        return got, fresh

    def _insert_host(self, k1, k2):
        """``_insert`` by numpy (``k1``, ``k2``: arrays): the same rounds; where several keys
        claim one free slot, the last of them takes it."""
        n = k1.shape[0]
        got = np.full(n, -1, dtype=np.int64)
        owner, t1, t2 = self._owner.numpy(), self.k1.numpy(), self.k2.numpy()
        todo = np.arange(n)
        mask = self.capacity - 1
        slot = mix_hash(k1, k2, 32) & mask
        step = np.arange(PROBE_WINDOW)
        fresh = 0
        while todo.shape[0]:
            at = slot[todo]
            window = (at[:, None] + step) & mask  # [keys, window]
            free = t2[window] < 0
            first = free.argmax(1)
            keys = np.arange(todo.shape[0])
            has = free[keys, first]
            s = window[keys, first]
            owner[s] = todo  # as ``_insert``: keys without a free slot write where none reads
            won = has & (owner[s] == todo)
            ws, tw = s[won], todo[won]
            fresh += int((t2[ws] == EMPTY).sum())
            t1[ws] = k1[tw]
            t2[ws] = k2[tw]
            got[tw] = ws
            nxt = np.where(has, s + 1, at + PROBE_WINDOW) & mask
            todo = todo[~won]
            slot[todo] = nxt[~won]
        return got, fresh

    def reserve(self, n: int) -> bool:
        """Make room for ``n`` more keys; True if the table was rehashed (slots moved)."""
        if self.used + n <= MAX_LOAD * self.capacity:
            return False
        self._rehash(self.live + n)
        return True

    def delete(self, slots) -> None:
        """Tombstones at ``slots`` (tensor, or numpy array: by numpy over the keys' memory)."""
        if isinstance(slots, np.ndarray):
            self.k2.numpy()[slots] = TOMB
            self.live -= int(slots.shape[0])
        elif slots.numel():
            self.k2[slots] = TOMB
            self.live -= int(slots.numel())

    def live_slots(self):
        return torch.nonzero(self.k2 >= 0).squeeze(1)

    def _rehash(self, need: int) -> None:
        capacity = self.capacity
        while need > MAX_LOAD * capacity / 2:
            capacity *= 2
        slots = self.live_slots()
        k1, k2 = self.k1[slots], self.k2[slots]
        values = self.values[slots]
        self._alloc(capacity)
        self.live = self.used = 0
        self.values[self.insert(k1, k2, fill=False)] = values

    def items(self, slots=None, names=None) -> dict[tuple[int, int], tuple[int, ...]]:
        """Every live entry (or those at ``slots``): key -> values of ``names`` (default:
        every column, in column order); a host copy, for tests and reports."""
        slots = self.live_slots() if slots is None else slots
        k1, k2 = self.k1[slots].tolist(), self.k2[slots].tolist()
        cols = [self.cols[name][slots].tolist() for name in (names or self.fills)]
        return {(a, b): tuple(c[i] for c in cols) for i, (a, b) in enumerate(zip(k1, k2))}
