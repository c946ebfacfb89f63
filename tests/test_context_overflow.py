"""serving.context: the one wording of a prompt that does not fit its context window (engine, bench, vLLM)."""

from __future__ import annotations

import subprocess
import sys

from serving.context import context_overflow, prompt_room


def test_a_window_fits_two_tokens_fewer_than_its_positions():
    assert prompt_room(16) == 14
    assert context_overflow("prompt", 14, 16) is None
    assert context_overflow("prompt", 15, 16) == ("prompt is 15 tokens; the context window (16 tokens) fits at most "
                                                  "14 prompt tokens (the prompt and its answer share 15 positions)")
    assert context_overflow("prompt p1", 30, 24, window="the target's 24 positions (max_position_embeddings)",
                            advice="drop it") == (
        "prompt p1 is 30 tokens; the context window (the target's 24 positions (max_position_embeddings)) fits at "
        "most 22 prompt tokens (the prompt and its answer share 23 positions); drop it")


def test_the_cli_reads_it_without_torch():
    code = ("import sys; from app.cli import build_parser; build_parser(); "
            "assert 'serving.context' in sys.modules, 'bench reads its wording'; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m in ('serving.models', 'serving.engine')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
