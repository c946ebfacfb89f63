"""Incremental detokenization for streaming: decode the whole output, send only the new text.

Text is held back while it ends in an incomplete UTF-8 character (the tokenizer shows U+FFFD) or in a
prefix of a stop string, so a client never receives text that the final answer would not contain.
"""

from __future__ import annotations

from collections.abc import Callable

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...] = ()):
        self._decode = decode
        self._stop = stop
        self._ids: list[int] = []
        self._sent = 0  # characters of the text already sent

    def final(self, ids: list[int]) -> str:
        """The complete answer: decoded and cut at the first stop string."""
        return _cut(self._decode(ids), self._stop)

    def add(self, ids: list[int]) -> str:
        """New tokens -> the text that can safely be sent now."""
        self._ids.extend(ids)
        text = self.final(self._ids)
        safe = len(text)
        if text.endswith(REPLACEMENT):
            safe = len(text.rstrip(REPLACEMENT))
        limit = safe
        for stop in self._stop:  # hold back a tail that may still grow into a stop string
            for n in range(min(len(stop) - 1, safe), 0, -1):
                if text[safe - n: safe] == stop[:n]:
                    limit = min(limit, safe - n)
                    break
        return self._take(text, limit)

    def flush(self) -> str:
        """At the end: whatever is left."""
        text = self.final(self._ids)
        return self._take(text, len(text))

    def _take(self, text: str, upto: int) -> str:
        if upto <= self._sent:
            return ""
        piece = text[self._sent: upto]
        self._sent = upto
        return piece


def _cut(text: str, stops: tuple[str, ...]) -> str:
    cut = min((text.index(s) for s in stops if s in text), default=len(text))
    return text[:cut]
