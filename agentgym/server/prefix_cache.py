"""Which KV-cache slot holds which tokens, and the longest cached prefix of a new prompt.

Every slot whose cache is worth reusing has an entry: the tokens whose keys and values are
in it, in order. A running sequence's entry is its prompt (``live``: never evicted or
moved by the index); a finished sequence's entry is its prompt plus all but its last token
(the last one was sampled, never fed back), kept until its slot is needed, least recently
used first. The next turn of a multi-turn episode starts with exactly those tokens, and the
n samples of one group start with the same prompt, so either finds its prefix here and only
the new tokens are prefilled.

Lookups hash the prompt in blocks of ``block`` tokens (each block's hash chains the one
before it, so equal hashes mean equal prefixes up to collisions, which the exact comparison
that follows rules out) and take the entry sharing the most tokens. Nothing here touches
tensors: the engine copies the columns.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Entry:
    slot: int
    tokens: list[int]
    live: bool
    hashes: list[int] = field(default_factory=list)


def block_hashes(tokens: list[int], block: int) -> list[int]:
    """The chained hash of every full block of ``tokens``: ``h[k]`` covers ``tokens[: (k+1) * block]``."""
    out: list[int] = []
    h = 0
    for start in range(0, len(tokens) - block + 1, block):
        h = hash((h, *tokens[start : start + block]))
        out.append(h)
    return out


def common_prefix(a: list[int], b: list[int], start: int = 0) -> int:
    """Length of the common prefix of ``a`` and ``b``, known to be at least ``start``."""
    n = min(len(a), len(b))
    i = start
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixIndex:
    """Entries by slot, lookups by block hash, eviction in least-recently-used order, and the
    slots that hold nothing (``free``)."""

    def __init__(self, slots: int, block: int = 16) -> None:
        self.block = block
        self.free = set(range(slots))
        self.entries: dict[int, Entry] = {}
        self._by_hash: dict[int, set[int]] = {}
        self._cached: OrderedDict[int, None] = OrderedDict()  # finished entries' slots, oldest first

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, slot: int) -> bool:
        return slot in self.entries

    # ---- entries -----------------------------------------------------------------------------
    def add(self, slot: int, tokens: list[int], live: bool) -> None:
        """``slot`` now holds ``tokens`` (replacing what it held)."""
        self.remove(slot)
        entry = Entry(slot, tokens, live, block_hashes(tokens, self.block))
        self.entries[slot] = entry
        self.free.discard(slot)
        for h in entry.hashes:
            self._by_hash.setdefault(h, set()).add(slot)
        if not live:
            self._cached[slot] = None

    def remove(self, slot: int) -> None:
        entry = self.entries.pop(slot, None)
        if entry is None:
            return
        self.free.add(slot)
        for h in entry.hashes:
            slots = self._by_hash.get(h)
            if slots is not None:
                slots.discard(slot)
                if not slots:
                    del self._by_hash[h]
        self._cached.pop(slot, None)

    def move(self, src: int, dst: int) -> None:
        """The entry of ``src`` now lives in ``dst`` (the engine copied the columns)."""
        entry = self.entries.get(src)
        if entry is None:
            self.remove(dst)
            return
        self.remove(src)
        self.add(dst, entry.tokens, entry.live)

    def relocate(self, slot: int, keep_out: range, copy: Callable[[int, int, int], None]) -> None:
        """Move ``slot``'s entry to a slot outside ``keep_out``: a free one past it, else over the least
        recently used finished entry outside it; drop it when there is neither. ``copy(src, dst,
        length)`` moves the columns."""
        entry = self.entries[slot]
        target = self.free_slot(above=keep_out.stop)
        if target is None:
            target = self.oldest_cached(exclude=keep_out)
            if target is None or target == slot:
                self.remove(slot)
                return
            self.remove(target)
        copy(slot, target, len(entry.tokens))
        self.move(slot, target)

    def fit(self, slots: int, keep_from: int, length: int, copy: Callable[[int, int, int], None]) -> None:
        """Make the entries fit a cache of ``slots`` slots of ``length`` tokens: an entry past the last
        slot moves (``copy(src, dst, length)``) to a free slot in ``keep_from .. slots-1`` (the most
        recently used first) or is dropped; an entry longer than ``length`` keeps its first ``length``
        tokens (still a prefix worth reusing)."""
        outside = [slot for slot in self.entries if slot >= slots]
        recent = {slot: i for i, slot in enumerate(self._cached)}
        outside.sort(key=lambda slot: (not self.entries[slot].live, -recent.get(slot, -1)))
        targets = sorted(slot for slot in self.free if keep_from <= slot < slots)
        for slot in outside:
            if targets:
                target = targets.pop(0)
                copy(slot, target, min(len(self.entries[slot].tokens), length))
                self.move(slot, target)
            else:
                self.remove(slot)
        for slot, entry in list(self.entries.items()):
            if len(entry.tokens) > length:
                self.add(slot, entry.tokens[:length], entry.live)
        self.free = set(range(slots)) - set(self.entries)

    def clear(self) -> None:
        self.free.update(self.entries)
        self.entries.clear()
        self._by_hash.clear()
        self._cached.clear()

    def free_slot(self, above: int) -> int | None:
        """A slot holding nothing, at or past ``above``."""
        return next((slot for slot in self.free if slot >= above), None)

    def oldest_cached(self, exclude: range | None = None) -> int | None:
        for slot in self._cached:
            if exclude is None or slot not in exclude:
                return slot
        return None

    def touch(self, slot: int) -> None:
        if slot in self._cached:
            self._cached.move_to_end(slot)

    # ---- lookups -----------------------------------------------------------------------------
    def match(self, tokens: list[int], limit: int | None = None) -> tuple[int | None, int]:
        """``(slot, length)`` of the entry sharing the longest prefix with ``tokens`` (at least one
        block), ``length`` at most ``limit``; ``(None, 0)`` when none does."""
        candidates: set[int] = set()
        depth = 0
        h = 0
        block = self.block
        for start in range(0, len(tokens) - block + 1, block):
            h = hash((h, *tokens[start : start + block]))
            found = self._by_hash.get(h)
            if not found:
                break
            candidates, depth = found, start + block
        best, best_len = None, 0
        for slot in candidates:
            entry = self.entries[slot]
            if entry.tokens[:depth] != tokens[:depth]:  # a hash collision
                continue
            length = common_prefix(entry.tokens, tokens, depth)
            if length > best_len:
                best, best_len = slot, length
        if limit is not None:
            best_len = min(best_len, limit)
        return (best, best_len) if best is not None and best_len > 0 else (None, 0)
