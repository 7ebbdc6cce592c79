"""Tokens: short names for tensors that go once to where clients live (Ray actors, Flower nodes).

The same object gets the same token for as long as the caller holds it; once the caller drops it,
``live`` no longer lists its token and the receiving side may drop its copy too.
"""

from __future__ import annotations

import itertools
import weakref


class Tokens:
    def __init__(self):
        self._entries: dict[int, tuple[weakref.ref, int]] = {}  # id(object) -> (weakref, token)
        self._counter = itertools.count()

    def __call__(self, obj) -> int:
        entry = self._entries.get(id(obj))
        if entry is not None and entry[0]() is obj:
            return entry[1]
        token = next(self._counter)
        self._entries[id(obj)] = (weakref.ref(obj), token)
        return token

    def live(self) -> list[int]:
        """Tokens of objects still held, sorted; forgets the others."""
        for key in [k for k, (ref, _) in self._entries.items() if ref() is None]:
            del self._entries[key]
        return sorted(token for _, token in self._entries.values())
