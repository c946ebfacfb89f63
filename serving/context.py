"""How many prompt tokens a context window fits, and the one way every check says a prompt does not fit (the
engine's check_request, bench's checks before and after the models load, the vLLM backend's). Imports nothing:
the CLI reads it at start-up without torch."""

from __future__ import annotations


def prompt_room(ctx: int) -> int:
    """The prompt tokens a context window of `ctx` positions fits: the prompt and its answer share ctx - 1 (one
    position is kept spare), and an answer needs at least one, so ctx - 2."""
    return ctx - 2


def context_overflow(what: str, n_tokens: int, ctx: int, *, window: str | None = None,
                     advice: str | None = None) -> str | None:
    """Why prompt `what` ("prompt", "prompt w.txt:1") of `n_tokens` tokens does not fit a context window of `ctx`
    positions, in one line: "prompt is 15 tokens; the context window (16 tokens) fits at most 14 prompt tokens (the
    prompt and its answer share 15 positions)", then "; `advice`" (what the command can do about it) where given.
    `window`: what sets the window, in words, where not "`ctx` tokens". None where the prompt fits."""
    if n_tokens <= prompt_room(ctx):
        return None
    text = (f"{what} is {n_tokens} tokens; the context window ({window or f'{ctx} tokens'}) fits at most "
            f"{prompt_room(ctx)} prompt tokens (the prompt and its answer share {ctx - 1} positions)")
    return f"{text}; {advice}" if advice else text
