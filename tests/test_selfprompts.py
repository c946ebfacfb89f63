"""The target writes its own prompts (Magpie): the pre-query read off a chat template, the stop tokens,
and the sampled continuations' bookkeeping."""

from __future__ import annotations

import pytest
import torch

from serving.distill.selfprompts import SENTINEL, pre_query, sample_continuations, stop_ids
from tests.tiny import tiny_model


class ChatML:
    """A stand-in tokenizer with a ChatML template: characters are tokens, `|` ends a turn (id 124)."""

    chat_template = "chatml"
    eos_token_id = 2

    def apply_chat_template(self, messages, tokenize=False):
        assert not tokenize
        return "".join(f"<{m['role']}>{m['content']}|" for m in messages)

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_pre_query_and_stops_read_off_the_template():
    before, after = pre_query(ChatML(), system="be brief")
    assert before == "<system>be brief|<user>" and after == "|"
    assert stop_ids(ChatML(), after) == {ord("|"), 2}
    assert SENTINEL not in before


def test_a_tokenizer_without_a_chat_template_is_refused():
    class Plain(ChatML):
        chat_template = None

    with pytest.raises(ValueError, match="no chat template"):
        pre_query(Plain())

    class Hiding(ChatML):
        def apply_chat_template(self, messages, tokenize=False):
            return "<user>?|"

    with pytest.raises(ValueError, match="verbatim"):
        pre_query(Hiding())


def test_sampled_continuations_stop_and_are_deterministic_for_a_seed():
    target = tiny_model(0)
    prefixes = [[5, 9, 14], [3, 7], [11, 12, 13, 4], [6], [8, 8, 8]]
    stops = {1, 2, 3}
    a = sample_continuations(target, prefixes, stops, max_tokens=6, seed=4, batch=2)
    b = sample_continuations(target, prefixes, stops, max_tokens=6, seed=4, batch=2)
    assert a == b and len(a) == len(prefixes)
    ended = [c for c in a if c is not None]
    assert ended, "some continuation should reach a stop token"
    assert all(len(c) <= 6 and not set(c) & stops for c in ended)
    # the same seed with a different batch size samples in a different order: still valid output
    c = sample_continuations(target, prefixes, stops, max_tokens=6, seed=4, batch=5)
    assert all(x is None or (len(x) <= 6 and not set(x) & stops) for x in c)
    # with no reachable stop every continuation runs out
    assert sample_continuations(target, prefixes[:2], {10_000}, max_tokens=3, seed=0, batch=2) == [None, None]


def test_a_continuation_is_what_the_model_samples_after_its_prefix():
    """With temperature near 0 sampling is greedy: the continuation equals the model's own greedy tokens."""
    from serving.llama import contiguous_batch

    target = tiny_model(1)
    prefix = [5, 9, 14]
    (got,) = sample_continuations(target, [prefix], {10_000}, max_tokens=4, seed=0, batch=1, temperature=1e-6,
                                  top_p=1.0)
    assert got is None  # no stop reachable: ran out
    toks = list(prefix)
    with torch.inference_mode():
        for _ in range(4):
            cache = target.new_cache(1, len(toks))
            logits = target(torch.tensor([toks]), contiguous_batch(0, 1, 0, len(toks)), cache)
            toks.append(int(logits[0, -1].argmax()))
    g = toks[len(prefix):]
    stop = g[2]
    (greedy,) = sample_continuations(target, [prefix], {stop}, max_tokens=4, seed=0, batch=1,
                                     temperature=1e-6, top_p=1.0)
    assert greedy == g[: g.index(stop)]


@pytest.mark.slow
def test_the_bundled_target_writes_code_questions():
    """On the real target: n distinct questions, each starting with one of the openers, none an evaluation
    prompt, the same for the same seed."""
    from serving import models
    from serving.distill.prompts import _evaluation_texts
    from serving.distill.selfprompts import CODE_OPENERS, self_prompts

    target_dir = models.pull(say=lambda m: None, verify=False)
    a = self_prompts(target_dir, 3, seed=5, max_tokens=40, batch=4, progress=False)
    assert len(a) == 3 and len({p["prompt"] for p in a}) == 3
    assert all(p["domain"] == "code" and len(p["prompt"]) >= 20 for p in a)
    assert all(p["prompt"].startswith(CODE_OPENERS) for p in a)
    assert not {p["prompt"] for p in a} & _evaluation_texts()
    assert self_prompts(target_dir, 3, seed=5, max_tokens=40, batch=4, progress=False) == a
    with pytest.raises(ValueError, match="n must be"):
        self_prompts(target_dir, 0)


def test_distill_records_and_checks_self_prompts(tmp_path, capsys):
    from app.cli import build_parser, main
    from serving.distill.pipeline import command_line

    args = build_parser().parse_args(["distill", "--out", str(tmp_path), "--self-prompts", "40", "--steps", "5"])
    assert "--self-prompts 40" in command_line(args)
    assert main(["distill", "--out", str(tmp_path), "--self-prompts", "-2"]) == 2
    assert "--self-prompts" in capsys.readouterr().err


def test_a_target_too_short_for_a_question_after_the_prefix_is_refused_before_it_loads(tmp_path):
    """The questions were sampled past the target's positions: a raw IndexError at the rope table's end."""
    import json

    from serving.distill.selfprompts import self_prompts
    from tests.test_hf_models import hf_dir

    target_dir = hf_dir(tmp_path / "short", max_position_embeddings=8)
    config = json.loads((target_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} |{% endfor %}"
    (target_dir / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"the target's context \(8 positions, its max_position_embeddings\) leaves "
                                         r"no room for a question after the \d+-token chat prefix"):
        self_prompts(target_dir, 2, progress=False)
