"""Request checks of the OpenAI API against what OpenAI does (an audit's findings), on the schema alone: no model
but for one tiny random one, to see `serve --default-max-tokens` reach the checks."""

from __future__ import annotations

import json

import pytest

from serving.server_schemas import (
    MIN_TOP_P,
    APIError,
    ChatRequest,
    Checked,
    CompletionRequest,
    check,
    parse_body,
)

MODEL, MAX_LEN, VOCAB = "m", 400, 50  # a window with room for more than the old cap of 256
PROMPT_IDS = list(range(10))  # what the fake tokenizer makes of any text


def _check(body: dict, *, chat: bool = False, **kw) -> Checked:
    model = ChatRequest if chat else CompletionRequest
    req = parse_body(json.dumps({"model": MODEL, **body}).encode(), model, max_len=MAX_LEN)
    return check(req, "chat" if chat else "completion", model_id=MODEL, max_len=MAX_LEN, vocab_size=VOCAB,
                 encode_chat=lambda msgs: PROMPT_IDS, encode_text=lambda text: PROMPT_IDS, **kw)


def _refused(body: dict, *, chat: bool = False) -> APIError:
    with pytest.raises(APIError) as exc:
        _check(body, chat=chat)
    return exc.value


CHAT = {"messages": [{"role": "user", "content": "hi"}]}
ROOM = MAX_LEN - 1 - len(PROMPT_IDS)  # what the prompt leaves for the answer


@pytest.mark.parametrize("chat", [False, True])
def test_without_max_tokens_the_answer_may_fill_the_window_as_openai_and_vllm(chat):
    """It was capped at 256 tokens unsaid (finish_reason 'length' where the window had room for far more)."""
    body = CHAT if chat else {"prompt": "hi"}
    assert _check(body, chat=chat).params.max_new_tokens == ROOM
    assert _check(body, chat=chat, default_max_tokens=7).params.max_new_tokens == 7  # the operator's cap
    assert _check(body, chat=chat, default_max_tokens=ROOM + 50).params.max_new_tokens == ROOM  # the window's end
    # the client's own max_tokens is what counts, beyond the operator's default too
    assert _check({**body, "max_tokens": 20}, chat=chat, default_max_tokens=7).params.max_new_tokens == 20


HARMLESS = {"store": True, "metadata": {"k": "v"}, "user": "u-1", "service_tier": "auto", "parallel_tool_calls": False}


@pytest.mark.parametrize("field,value,do_nothing", [
    ("modalities", ["text", "audio"], ["text"]), ("modalities", ["audio"], None), ("modalities", [], ["text"]),
    ("audio", {"voice": "alloy", "format": "wav"}, None), ("audio", {}, None),
    ("prediction", {"type": "content", "content": "x = 1"}, None), ("web_search_options", {}, None),
    ("reasoning_effort", "high", "none"), ("reasoning_effort", "minimal", None),
])
def test_fields_that_change_the_answer_are_refused_not_ignored(field, value, do_nothing):
    """They were ignored (a 200 with text only, no audio, no search) where OpenAI refuses them for such a model;
    their do-nothing values pass, and so does metadata that changes no answer."""
    err = _refused({**CHAT, **HARMLESS, field: value}, chat=True)
    assert (err.status, err.param, err.code) == (400, field, "unsupported_value"), err.message
    assert "is not supported by this engine" in err.message
    _check({**CHAT, **HARMLESS, field: do_nothing}, chat=True)


@pytest.mark.parametrize("chat", [False, True])
def test_include_usage_null_is_false_as_openai_reads_it(chat):
    """It was a 400 'stream_options.include_usage must be a boolean'."""
    body = {**(CHAT if chat else {"prompt": "hi"}), "stream": True, "stream_options": {"include_usage": None}}
    checked = _check(body, chat=chat)
    assert checked.stream and checked.include_usage is False
    err = _refused({**body, "stream_options": {"include_usage": "yes"}}, chat=chat)  # still a boolean or null
    assert err.param == "stream_options.include_usage"


def test_top_p_zero_keeps_the_likeliest_token_as_a_tiny_top_p_does():
    """OpenAI takes top_p within [0, 1]; 0 ('be deterministic') was a 400 here."""
    assert _check({"prompt": "hi", "top_p": 0}).params.top_p == MIN_TOP_P
    assert _check({**CHAT, "top_p": 0.0}, chat=True).params.top_p == MIN_TOP_P
    for bad in (-0.1, 1.5):
        err = _refused({"prompt": "hi", "top_p": bad})
        assert err.param == "top_p" and "within [0, 1]" in err.message, err.message


# ------------------------------------------------------------------------- serve --default-max-tokens


def test_default_max_tokens_is_refused_below_one_before_anything(tmp_path, capsys):
    from app.cli import main
    from serving.server_setup import ServeOptions

    with pytest.raises(ValueError, match="^--default-max-tokens must be >= 1, got 0"):
        ServeOptions(default_max_tokens=0).validate()
    db = tmp_path / "serve.db"
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--default-max-tokens", "0", "--db", str(db)])
    assert exc.value.code == 2 and not db.exists()
    assert "--default-max-tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--default-max-tokens N cap on the answer of a request that sends no max_tokens" in out


@pytest.mark.parametrize("cap", [None, 5])
def test_the_servers_default_max_tokens_reaches_the_checks(cap, tmp_path, monkeypatch):
    """build_state -> ServerState -> check(): a tiny random target, no telemetry, no HTTP."""
    from serving.server import _parse_and_check, shutdown
    from serving.server_setup import ServeOptions, build_state
    from serving.worker import EngineSpec
    from tests.test_hf_models import hf_dir

    for name in ("SPECFINOPS_PACKED_LINEAR", "SPECFINOPS_BF16_KERNEL", "SPECFINOPS_DECODE_ATTENTION",
                 "SPECFINOPS_ATTENTION_FLOAT32", "SPECFINOPS_DRAFT_INT8"):
        monkeypatch.setenv(name, "off")  # a tiny model needs no CPU kernel measurement
    target = hf_dir(tmp_path / "target", max_position_embeddings=512)
    spec = EngineSpec(target=str(target), drafter="ngram", k="2", dtype="float32", max_batch=1, max_len=400)
    state = build_state(ServeOptions(spec=spec, telemetry=False, power="none", default_max_tokens=cap))
    try:
        raw = json.dumps({"model": state.model_id, "prompt": [2, 3, 4]}).encode()
        assert _parse_and_check(raw, "completion", state).params.max_new_tokens == (cap or 400 - 1 - 3)
    finally:
        shutdown(state)


def test_a_hugging_face_cache_snapshot_is_served_by_its_hub_id(tmp_path, monkeypatch):
    """A target in a Hugging Face cache (.../models--ORG--NAME/snapshots/<commit>) was served as its commit hash:
    clients had to send the hash as the model."""
    from serving.server import shutdown
    from serving.server_setup import ServeOptions, build_state
    from serving.worker import EngineSpec
    from tests.test_hf_models import hf_dir

    for name in ("SPECFINOPS_PACKED_LINEAR", "SPECFINOPS_BF16_KERNEL", "SPECFINOPS_DECODE_ATTENTION",
                 "SPECFINOPS_ATTENTION_FLOAT32", "SPECFINOPS_DRAFT_INT8"):
        monkeypatch.setenv(name, "off")  # a tiny model needs no CPU kernel measurement
    target = hf_dir(tmp_path / "models--me--tiny-llama" / "snapshots" / "9f8e7d6c5b4a3928")
    spec = EngineSpec(target=str(target), drafter="ngram", k="2", dtype="float32", max_batch=1, max_len=64)
    state = build_state(ServeOptions(spec=spec, telemetry=False, power="none"))
    try:
        assert state.model_id == "me/tiny-llama"
    finally:
        shutdown(state)


# ------------------------------------------------------------------------- what a body may hold


def _parsed(raw: bytes, *, chat: bool = False):
    return parse_body(raw, ChatRequest if chat else CompletionRequest, max_len=MAX_LEN)


def _refused_raw(raw: bytes, *, chat: bool = False) -> APIError:
    with pytest.raises(APIError) as exc:
        _parsed(raw, chat=chat)
    return exc.value


@pytest.mark.parametrize("junk,what", [
    ([{"a": [1, 2]}] * 20_000, "JSON values"),  # the audit's body, smaller: 12 MB of it froze /health for 2 s
    ([0] * 20_000, "JSON values"),
    ([[]] * 2_000, "arrays and objects"),  # few values, but each a container (the dearest to parse)
])
def test_a_body_holding_more_values_than_a_request_can_is_refused_before_parsing(junk, what, monkeypatch):
    """json.loads holds the GIL for all of a body's parse, however many threads: a 12 MB body (under the 16 MiB
    cap) of small arrays stalled /health for 2.2 s and a stream in flight for 9.6 s. A body holding more values than
    a request that fits the window can is refused with 413, naming the limit, without being parsed."""
    parsed = []
    monkeypatch.setattr(json, "loads", lambda *a, **kw: parsed.append(1))
    err = _refused_raw(json.dumps({"model": MODEL, "prompt": "hi", "zzz": junk}).encode())
    assert (err.status, err.code, err.type) == (413, "request_too_large", "invalid_request_error")
    assert what in err.message and f"context window of {MAX_LEN} tokens" in err.message, err.message
    assert "--max-len" in err.message  # how the limit grows
    assert not parsed


def test_what_a_request_that_fits_may_hold_passes_the_count():
    """The legitimate extremes: a message per token, each with a content part and a name; a prompt of token ids
    filling the window; and strings full of commas, brackets and escaped quotes (they hold no values)."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "x"}], "name": "n"}] * (MAX_LEN - 1)
    body = {"model": MODEL, "messages": messages, "stop": ["a", "b", "c", "d"], "metadata": {str(i): "v" for i in
                                                                                             range(16)}}
    assert len(_parsed(json.dumps(body).encode(), chat=True).messages) == MAX_LEN - 1
    assert len(_parsed(json.dumps({"model": MODEL, "prompt": [1] * MAX_LEN}).encode()).prompt) == MAX_LEN
    text = 'a,[{"}]\\' * 50_000
    for raw in (json.dumps({"model": MODEL, "prompt": text}).encode(),
                json.dumps({"model": MODEL, "prompt": text}).encode("utf-16")):  # as json.loads reads it too
        assert _parsed(raw).prompt == text


def test_an_integer_too_long_to_read_is_named_in_the_servers_words():
    """json.loads' error went to the client as it was: '... use sys.set_int_max_str_digits() to increase the
    limit', advice for the server's code, naming no parameter."""
    err = _refused_raw(b'{"model": "m", "prompt": "hi", "seed": ' + b"9" * 5000 + b"}")
    assert (err.status, err.param, err.code) == (400, "seed", "invalid_value")
    assert "invalid value for 'seed': an integer of 5000 digits, more than this server reads" in err.message
    assert "sys." not in err.message
    err = _refused_raw(b'{"model": "m", "prompt": [1, -' + b"1" * 4400 + b"]}")
    assert err.param == "prompt.1" and "4400 digits" in err.message, err.message
    err = _refused_raw(b'{"model": "m", "prompt": [1, ' + b"1" * 4400 + b"], oops")  # invalid after it: unnamed
    assert err.param is None and "holds an integer of more than 4300 digits" in err.message, err.message


def test_an_assistant_turn_may_have_null_content_as_openai_takes_it():
    """OpenAI accepts `"content": null` on an assistant message (a turn that said nothing): it was refused 400. It
    is rendered as empty text; null content on any other role is still refused. (A turn that called tools is
    refused: test_tool_calls_in_the_conversation_are_refused_in_one_message.)"""
    seen: list = []
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
            {"role": "user", "content": "and?"}]
    req = parse_body(json.dumps({"model": MODEL, "messages": msgs}).encode(), ChatRequest, max_len=MAX_LEN)
    check(req, "chat", model_id=MODEL, max_len=MAX_LEN, vocab_size=VOCAB,
          encode_chat=lambda m: seen.append(m) or PROMPT_IDS, encode_text=lambda text: PROMPT_IDS)
    assert seen == [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""},
                     {"role": "user", "content": "and?"}]]
    for role in ("user", "system", "developer"):
        with pytest.raises(APIError) as exc:
            _check({"messages": [{"role": role, "content": None}]}, chat=True)
        assert exc.value.param == "messages.0.content" and "a string or a list" in exc.value.message
        assert "null only in an assistant message" in exc.value.message


TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(("msgs", "param"), [
    # the assistant turn's calls were dropped (content null rendered as ""): another conversation was answered
    ([{"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}], "messages.1.tool_calls"),
    # without "content" at all (as clients send a turn that only called tools): 'missing required parameter'
    ([{"role": "assistant", "tool_calls": [TOOL_CALL]}], "messages.1.tool_calls"),
    ([{"role": "assistant", "content": "", "function_call": {"name": "f", "arguments": "{}"}}],
     "messages.1.function_call"),
    # the tool's answer was refused as an 'unknown role'
    ([{"role": "tool", "tool_call_id": "c1", "content": "42"}], "messages.1.role"),
    ([{"role": "function", "name": "f", "content": "42"}], "messages.1.role"),
    ([{"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}], "messages.1.tool_calls"),
])
def test_tool_calls_in_the_conversation_are_refused_in_one_message(msgs, param):
    err = _refused({"messages": [{"role": "user", "content": "hi"}, *msgs]}, chat=True)
    assert err.status == 400 and err.code == "unsupported_value" and err.param == param, err.message
    assert err.message.startswith("tool calls are not supported by specfinops serve: messages.1 "), err.message


def test_an_assistant_turn_without_content_is_taken_as_null():
    """An assistant message with no "content" key was refused 'missing required parameter' where null is taken;
    other roles still need it, and an empty tool_calls list calls nothing."""
    seen: list = []
    for extra in ({}, {"tool_calls": []}):
        msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", **extra}]
        req = parse_body(json.dumps({"model": MODEL, "messages": msgs}).encode(), ChatRequest, max_len=MAX_LEN)
        check(req, "chat", model_id=MODEL, max_len=MAX_LEN, vocab_size=VOCAB,
              encode_chat=lambda m: seen.append(m) or PROMPT_IDS, encode_text=lambda text: PROMPT_IDS)
    assert seen == [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]] * 2
    for role in ("user", "system"):
        err = _refused({"messages": [{"role": role}]}, chat=True)
        assert err.param == "messages.0.content" and "missing required parameter" in err.message, err.message
