"""The cache of a communicator's recorded calls: schedules by layout (host), plans by the
identity of their arrays (device), and what was seen once of each.

A call is recorded only the second time its key comes: a program that never repeats a shape
keeps its unrecorded cost and fills no cache. Entries are evicted least recently used first,
bounded in number and in the bytes they allocated themselves (outputs and scratch), not in the
caller's arrays a device plan holds (counting those would make large buffers a program reuses
evict each other every call). Pinned entries (`pinned` > 0: something replays their messages
directly, as the benchmark's ceiling does) are never evicted.

`compiled` mirrors the schedules that have a C form, key -> Program: what the C Shortcut looks
up (mpiring.engine.native), so that it reads no Python object of the cache. It is the
communicator's HotState.programs, which the Shortcut holds.
"""

from __future__ import annotations

from typing import Any

# Entries kept: a few per layout or buffer set a program cycles through.
ENTRIES_KEPT = 64
ENTRY_BYTES_KEPT = 256 << 20


class Cache:
    """A communicator's schedules, plans and sightings, least recently used evicted first.

    Recency is each entry's `used` (the communicator's call count when it last ran, set by the
    call that hits it): cheaper on every call than reordering the table, and eviction is rare."""

    __slots__ = ("table", "compiled", "allocated", "_max_entries", "_max_bytes")

    def __init__(self, compiled: dict[tuple, Any] | None = None, entries: int = ENTRIES_KEPT,
                 nbytes: int = ENTRY_BYTES_KEPT) -> None:
        self.table: dict[tuple, Any] = {}  # key -> schedule, plan or sighting; the same dict for life
        # key -> a schedule's Program; the same dict for life (HotState.programs)
        self.compiled: dict[tuple, Any] = {} if compiled is None else compiled
        self._max_entries, self._max_bytes = entries, nbytes
        self.allocated = 0

    def __len__(self) -> int:
        return len(self.table)

    def add(self, key: tuple, entry: Any, now: int) -> None:
        """Keep `entry` under `key`, used at call `now`; evict the least recently used beyond the bounds."""
        self._remove(key)
        entry.used = now
        self.table[key] = entry
        program = getattr(entry, "compiled", None)
        if program is not None and getattr(entry, "layout_keyed", False):
            self.compiled[key] = program
            program.cached = True  # the Shortcut's memo may find it again while it is here
        self.allocated += entry.allocated
        while len(self.table) > 1 and (len(self.table) > self._max_entries or self.allocated > self._max_bytes):
            evictable = [(e.used, k) for k, e in self.table.items() if not e.pinned and e is not entry]
            if not evictable:  # all pinned
                break
            self._remove(min(evictable, key=lambda pair: pair[0])[1])

    def clear(self, keep: list[Any] = ()) -> None:
        """Drop every entry; free each, except those in `keep` (abandoned with messages in flight:
        MPI may still use their buffers)."""
        for program in self.compiled.values():
            program.cached = False
        self.compiled.clear()
        while self.table:
            entry = self.table.popitem()[1]
            if not any(entry is kept for kept in keep):
                entry.free()
        self.allocated = 0

    def _remove(self, key: tuple) -> None:
        entry = self.table.pop(key, None)
        program = self.compiled.pop(key, None)
        if program is not None:
            program.cached = False
        if entry is not None:
            self.allocated -= entry.allocated
            entry.free()
