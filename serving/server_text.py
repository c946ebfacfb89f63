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


def max_prompt_chars(tokenizer: object, max_len: int) -> int | None:
    """The most characters a prompt that fits `max_len` tokens can have, or None when unknown.

    A token stands for at most as many characters as its vocabulary string is long (a byte-level vocabulary
    spells each byte as one character, and a character is at least one byte), so a text of more than
    max_len * longest characters needs more than max_len tokens. A normalizer could merge characters
    (NFKC composes accents), so with one the bound is four times as generous. Lets the server refuse a
    multi-megabyte prompt without tokenizing it."""
    try:
        longest = max(len(t) for t in tokenizer.get_vocab())
    except Exception:  # noqa: BLE001 - no usable vocabulary: no bound (the tokenizer decides)
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    normalized = backend is None or getattr(backend, "normalizer", None) is not None
    return max_len * max(longest, 1) * (4 if normalized else 1)
