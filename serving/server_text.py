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
            limit = min(limit, _growing_into(text, safe, stop))
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


def _growing_into(text: str, end: int, stop: str) -> int:
    """Where the longest tail of text[:end] that is a proper prefix of `stop` begins (`end` when none does).

    Only the positions holding stop's first character are tried (str.find, in C), and of those only where the
    tail's last character matches too is the tail compared: this runs on the event loop once per decode step of
    every stream, and trying every prefix length of a long stop string (one slice and comparison each) took time
    quadratic in its length, every step."""
    i = text.find(stop[0], max(end - len(stop) + 1, 0), end)
    while i != -1:
        if text[end - 1] == stop[end - 1 - i] and stop.startswith(text[i:end]):
            return i
        i = text.find(stop[0], i + 1, end)
    return end


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
