"""HTTP request bodies (pydantic, strict) and OpenAI-style errors for the serving API.

Everything a client sends is checked here, before a request reaches the engine thread: a body that
fails any check becomes an `APIError` (4xx) and leaves nothing in the store.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from serving.request_limits import MAX_STOP_STRINGS, MAX_TEMPERATURE, MIN_TOP_P, SEED_MAX, SEED_MIN
from serving.sampling import SamplingParams

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
TOOL_ROLES = ("tool", "function")  # a tool's (or a function's, the deprecated form) answer: refused in check()
NO_TOOL_CALLS = "tool calls are not supported by specfinops serve"
# What a request that fits a context window of max_len tokens holds at most, in JSON values (strings, numbers,
# arrays, objects) and in arrays and objects alone: a prompt of token ids holds one value per token; a message
# (one token at least) an object, its role, its content (perhaps an array) and a few keys more, and a content part
# an object, its type and its text; the rest (the top-level fields, stop strings, metadata) fits the fixed part.
# json.loads holds the GIL from start to end, and a value costs it about a microsecond, an array or object several,
# where a megabyte of string costs it a few milliseconds: a 12 MB body of small arrays froze the event loop
# (/health, every stream in flight) for seconds from the tokenizer thread.
VALUES_PER_TOKEN, VALUES_FIXED = 32, 4096
CONTAINERS_PER_TOKEN, CONTAINERS_FIXED = 3, 256


class APIError(Exception):
    """An error answered to the client as {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type_: str | None = None, retry_after_s: int | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after_s = retry_after_s  # sent as Retry-After: when to try again (clients back off by it)
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


class _Strict(BaseModel):
    # strict: "10" is not an integer, true is not a number; unknown fields are ignored like OpenAI does
    model_config = ConfigDict(strict=True, extra="ignore")


def _one_of(value: Any, handler: ValidatorFunctionWrapHandler, accepted: str) -> Any:
    """A union field's value, or ONE error naming the field and what it accepts (pydantic reports each
    branch of the union, e.g. 'stop.str', which names no field a client sent)."""
    try:
        return handler(value)
    except ValidationError:
        raise ValueError(f"must be {accepted}") from None


class Message(_Strict):
    role: str
    # null on an assistant turn only, as OpenAI takes it (rendered ""); an assistant turn without it is the same
    content: str | list[dict[str, Any]] | None
    # a turn that called tools, parsed only to be refused (check): dropping them answered another conversation
    tool_calls: list[Any] | None = None
    function_call: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _content_left_out(cls, data: Any) -> Any:
        if isinstance(data, dict) and "content" not in data and data.get("role") in ("assistant", *TOOL_ROLES):
            return {**data, "content": None}
        return data

    @field_validator("content", mode="wrap")
    @classmethod
    def _content(cls, v: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        role = info.data.get("role")
        if role in TOOL_ROLES:  # the message is refused whole (check): its content is not judged
            return None
        if v is None and role == "assistant":
            return None
        accepted = "a string or a list of content parts ({'type': 'text', 'text': ...})"
        if v is None:
            raise ValueError(f"must be {accepted} (null only in an assistant message)")
        return _one_of(v, handler, accepted)

    @field_validator("role")
    @classmethod
    def _role(cls, v: str) -> str:
        if v in TOOL_ROLES:
            return v
        if v not in ROLES:
            raise ValueError(f"unknown role {v!r}: use one of system, developer, user, assistant")
        return ROLES[v]

    def text(self) -> str:
        if self.content is None:  # an assistant turn without text
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported")
            parts.append(part["text"])
        return "".join(parts)


class _Common(_Strict):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension (as vLLM): 0 or -1 = off
    n: int | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool | int | None = None
    logit_bias: dict[str, Any] | None = None  # empty only
    user: str | None = None
    # extension: false decodes this request autoregressively (recorded as AR); null is the default, as for every
    # other optional field (it was a 400)
    speculative: bool | None = True

    @field_validator("stop", mode="wrap")
    @classmethod
    def _stop(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _one_of(v, handler, "a string, a list of strings or null")

    @field_validator("logprobs", mode="wrap")
    @classmethod
    def _logprobs(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _one_of(v, handler, "a boolean, an integer or null")


class ChatRequest(_Common):
    messages: list[Message]
    max_completion_tokens: int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None  # "none" only
    functions: list[Any] | None = None  # the deprecated form of tools
    function_call: str | dict[str, Any] | None = None  # "none" only
    response_format: dict[str, Any] | None = None  # {"type": "text"} only
    top_logprobs: int | None = None  # 0 only
    # output this engine cannot give, or a different way to answer: refused unless null (they were ignored,
    # a 200 with text only where OpenAI answers a model without them with a 400)
    modalities: list[Any] | None = None  # ["text"] only
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    reasoning_effort: str | None = None  # "none" only: no reasoning here (OpenAI's models without it refuse it too)

    @field_validator("tool_choice", "function_call", mode="wrap")
    @classmethod
    def _choice(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _one_of(v, handler, "a string, an object or null")


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str]
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _prompt(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _one_of(v, handler, "a string, a list of one string, or a list of token ids (integers)")


def max_json_values(max_len: int) -> tuple[int, int]:
    """The most JSON values, and arrays and objects, a request body may hold with a context window of `max_len`
    tokens."""
    return VALUES_PER_TOKEN * max_len + VALUES_FIXED, CONTAINERS_PER_TOKEN * max_len + CONTAINERS_FIXED


def parse_body(raw: bytes, model: type[_Common], *, max_len: int | None = None) -> _Common:
    """Raw body -> request model, or APIError(400) saying what is wrong and where.

    `max_len` (the context window, tokens): a body holding more JSON values than a request that fits can
    (`max_json_values`) is refused (413) before it is parsed, and a `messages`, content-parts or `prompt` list
    longer than the window before the (slow) validation of its items. Slow for a big body: the server runs this
    off its event loop."""
    if not raw.strip():
        raise bad("the request body is empty: send a JSON object")
    if max_len is not None:
        _check_structure(raw, max_len)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad("the request body is not valid JSON for this server: it is nested too deeply") from None
    except ValueError as exc:
        if _TOO_MANY_DIGITS in str(exc):
            raise _too_many_digits(raw) from None
        raise bad(f"the request body is not valid JSON for this server: {exc}") from None
    if not isinstance(data, dict):
        raise bad(f"the request body must be a JSON object, got {_json_type(data)}")
    if max_len is not None:
        _check_list_lengths(data, model, max_len)
    _check_unicode(raw, data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def _check_structure(raw: bytes, max_len: int) -> None:
    """APIError(413) when the body holds more JSON values, or arrays and objects, than a request that fits
    `max_len` tokens (`max_json_values`), counted without parsing it: strings by their quotes, the other values
    by the commas and brackets outside the strings. Each count is one pass in C over the bytes, and the strings
    are split out only once there are few enough. (An invalid body's values count alike up to its first error:
    json.loads reads no further.)"""
    max_values, max_containers = max_json_values(max_len)
    encoding = json.detect_encoding(raw)
    if not encoding.startswith("utf-8"):  # UTF-16 / 32, as json.loads takes it
        try:
            raw = raw.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
        except UnicodeError:
            return  # json.loads says what is wrong with it
    # an escaped backslash, then an escaped quote, is no string's end: what is left of the quotes pairs up
    # (`in` first: a search is quicker than a replace that finds nothing)
    text = raw
    for escape in (b"\\\\", b'\\"'):
        if escape in text:
            text = text.replace(escape, b"")
    values = text.count(b'"') // 2
    containers = 0
    if values <= max_values:
        outside = b"".join(text.split(b'"')[::2])
        containers = outside.count(b"[") + outside.count(b"{")
        values += outside.count(b",") + containers + 1
    window = f"any request that fits this model's context window of {max_len} tokens"
    if values > max_values:
        raise APIError(413, f"the request body holds more than {max_values:,} JSON values (strings, numbers, arrays, "
                       f"objects), more than {window} needs (the limit grows with the server's --max-len)",
                       code="request_too_large")
    if containers > max_containers:
        raise APIError(413, f"the request body holds {containers:,} JSON arrays and objects, more than the "
                       f"{max_containers:,} {window} needs (the limit grows with the server's --max-len)",
                       code="request_too_large")


# json.loads' ValueError for an integer literal beyond Python's int-to-str digit limit (sys.int_info)
_TOO_MANY_DIGITS = "for integer string conversion"


@dataclass(frozen=True, slots=True)
class _LongInteger:
    """An integer literal too long to read, in place of its value: where it was is found after parsing."""

    digits: int


def _too_many_digits(raw: bytes) -> APIError:
    """The 400 for a body holding an integer literal too long for Python to read, naming where it is (json.loads
    said only that it 'exceeds the limit', with advice to raise it meant for the server's own code)."""
    limit = sys.get_int_max_str_digits()

    def read(literal: str) -> int | _LongInteger:
        digits = len(literal.lstrip("-"))
        return _LongInteger(digits) if digits > limit else int(literal)

    try:
        data = json.loads(raw, parse_int=read)
    except (ValueError, RecursionError):  # invalid further on: where the integer is goes unsaid
        data = None
    path, found = next(((path, x) for path, x in _walk(data) if isinstance(x, _LongInteger)), ((), None))
    param = ".".join(path) or None
    if found is None or param is None:
        return bad(f"the request body holds an integer of more than {limit} digits, more than this server reads (no "
                   "parameter takes a number that large)", code="invalid_value")
    return bad(f"invalid value for {param!r}: an integer of {found.digits} digits, more than this server reads "
               f"({limit} at most; no parameter takes a number that large)", param=param, code="invalid_value")


def _walk(data: object) -> Iterator[tuple[tuple[str, ...], object]]:
    """Every value of parsed JSON with its path (object keys, list indices), depth first in the body's order."""
    stack: list[tuple[tuple[str, ...], Any]] = [((), data)]
    while stack:
        path, x = stack.pop()
        yield path, x
        if isinstance(x, dict):
            stack.extend(((*path, str(k)), v) for k, v in reversed(x.items()))
        elif isinstance(x, list):
            stack.extend(((*path, str(i)), v) for i, v in reversed(list(enumerate(x))))


def _json_type(x: object) -> str:
    """The JSON name of a parsed value's type (what the client sent, not Python's 'NoneType' or 'list')."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "a boolean"
    if isinstance(x, int | float):
        return "a number"
    return {str: "a string", list: "an array"}.get(type(x), type(x).__name__)


def _check_list_lengths(data: dict, model: type[_Common], max_len: int) -> None:
    """Lists that cannot fit `max_len` tokens, refused by their length alone: every message takes one token at
    least (its role's markers), a prompt's token id one each. Content parts are bounded likewise, all the
    messages' together (an empty part takes none, but a client that means its text sends it in fewer)."""
    if model is ChatRequest and isinstance(messages := data.get("messages"), list):
        if len(messages) > max_len:
            raise bad(f"{len(messages)} messages cannot fit this model's context window of {max_len} tokens "
                      "(each message takes one token at least)", param="messages", code="context_length_exceeded")
        num_parts = 0
        for i, m in enumerate(messages):
            parts = m.get("content") if isinstance(m, dict) else None
            num_parts += len(parts) if isinstance(parts, list) else 0
            if num_parts > max_len:
                raise bad(f"the messages hold more than {max_len} content parts, this model's context window in "
                          "tokens (send a message's text as one part)", param=f"messages.{i}.content",
                          code="context_length_exceeded")
    if model is CompletionRequest and isinstance(prompt := data.get("prompt"), list) and len(prompt) > max_len:
        raise bad(f"the prompt is a list of {len(prompt)} items, more than this model's context window of "
                  f"{max_len} tokens can hold", param="prompt", code="context_length_exceeded")


# A JSON string may spell a UTF-16 surrogate (\ud800-\udfff) as an escape; json.loads pairs a high and a low
# one into a character and keeps a lone one as is: a str that is not valid Unicode (the tokenizer raises on
# it, and it cannot be encoded as UTF-8 to be stored or sent back).
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _check_unicode(raw: bytes, data: dict) -> None:
    """APIError(400) naming the first string (or object key) of the body that holds a lone surrogate.
    A UTF-8 body without a surrogate escape (nearly all) is passed without looking at its strings."""
    if json.detect_encoding(raw).startswith("utf-8") and not _SURROGATE_ESCAPE.search(raw):
        return
    for path, x in _walk(data):
        param = ".".join(path) or None
        if isinstance(x, str):
            found = _SURROGATE.search(x)
        elif isinstance(x, dict):
            found = next((m for k in x if (m := _SURROGATE.search(k))), None)
        else:
            continue
        if found is not None:
            lone = f"a lone surrogate, \\u{ord(found.group()):04x}"
            if isinstance(x, str):
                why = f"invalid value for {param!r}: must be valid Unicode ({lone}, at character {found.start()}"
            else:
                why = f"invalid key in {param or 'the request body'!r}: must be valid Unicode ({lone}"
            raise bad(f"{why}; UTF-16 surrogates come only in pairs)", param=param, code="invalid_value")


def validation_error(errors: list[dict]) -> APIError:
    """The first pydantic (or FastAPI) validation error as one readable 400."""
    if not errors:
        return bad("invalid request")
    err = errors[0]
    loc = [str(x) for x in err.get("loc", ()) if x not in ("body",)]
    param = ".".join(loc) or None
    if err.get("type") == "missing":
        return bad(f"missing required parameter {param!r}", param=param, code="missing_required_parameter")
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    got = err.get("input")
    shown = json.dumps(got)[:80] if _jsonable(got) else type(got).__name__
    return bad(f"invalid value for {param!r}: {msg} (got {shown})", param=param, code="invalid_value")


def _jsonable(x: object) -> bool:
    try:
        json.dumps(x)
    except (TypeError, ValueError):
        return False
    return True


Kind = Literal["chat", "completion"]


@dataclass(frozen=True, slots=True)
class Checked:
    """A request that passed every check: what the engine thread needs."""

    kind: Kind
    prompt_ids: list[int]
    params: SamplingParams
    speculate: bool
    stream: bool
    include_usage: bool


def check(req: _Common, kind: Kind, *, model_id: str, max_len: int, vocab_size: int,
          encode_chat: Callable[[list[dict]], list[int]], encode_text: Callable[[str], list[int]],
          max_chars: int | None = None, default_max_tokens: int | None = None) -> Checked:
    """Semantic checks (the types are already right): APIError(4xx) naming the parameter on failure.

    `default_max_tokens` (`serve --default-max-tokens`): the answer's cap when the client sends no max_tokens;
    None (the default) is the room left in the context window, as OpenAI and vLLM do.

    `max_chars`: the most characters a prompt that fits the window can have (`server_text.max_prompt_chars`);
    a longer one is refused before it is tokenized. Tokenizing is the slow part: the server runs this off
    its event loop."""
    if req.model != model_id:
        raise APIError(404, f"the model {req.model!r} does not exist: this server serves {model_id!r}",
                       param="model", code="model_not_found")
    if req.n is not None and req.n < 1:
        raise bad(f"n must be >= 1, got {req.n}", param="n", code="invalid_value")
    if req.n is not None and req.n > 1:
        raise bad(f"n = {req.n} is not supported by this engine: it returns one choice (n = 1)", param="n",
                  code="unsupported_value")
    _unsupported(req)
    if req.seed is not None and not SEED_MIN <= req.seed <= SEED_MAX:
        raise bad(f"seed must be an integer within [{SEED_MIN}, {SEED_MAX}] (a 64-bit seed), got {req.seed}",
                  param="seed", code="invalid_value")
    max_tokens = req.max_tokens
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        max_tokens = req.max_completion_tokens
    param = ("max_completion_tokens" if isinstance(req, ChatRequest) and req.max_completion_tokens is not None
             else "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise bad(f"{param} must be >= 1, got {max_tokens}", param=param, code="invalid_value")
    temperature = 1.0 if req.temperature is None else req.temperature
    if not 0 <= temperature <= MAX_TEMPERATURE or temperature != temperature:
        raise bad(f"temperature must be within [0, {MAX_TEMPERATURE:g}], got {temperature}", param="temperature",
                  code="invalid_value")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0 <= top_p <= 1:
        raise bad(f"top_p must be within [0, 1], got {top_p}", param="top_p", code="invalid_value")
    # a top_p that tiny (or 0, which OpenAI accepts: 'be deterministic') keeps the most likely token alone, as any
    # top_p below the likeliest token's probability does; below float32's range it rounded to 0 in the sampler,
    # which then kept nothing (a 500, NaN probabilities)
    top_p = max(top_p, MIN_TOP_P)
    top_k = 0 if req.top_k in (None, -1) else req.top_k
    if top_k < 0:
        raise bad(f"top_k must be -1, 0 (off) or a positive integer, got {req.top_k}", param="top_k",
                  code="invalid_value")
    # keeping the whole vocabulary is top-k off, and is recorded so (a top_k beyond the store's integer column
    # had the request's record rejected by the database: a 200 to the client and no row)
    top_k = 0 if top_k >= vocab_size else top_k
    stop = _stops(req.stop)
    opts = req.stream_options or {}
    if opts and not req.stream:
        raise bad("stream_options is only allowed with stream = true", param="stream_options", code="invalid_value")
    include_usage = opts.get("include_usage")
    include_usage = False if include_usage is None else include_usage  # null is false, as OpenAI reads it (was a 400)
    if not isinstance(include_usage, bool):
        raise bad("stream_options.include_usage must be a boolean", param="stream_options.include_usage",
                  code="invalid_value")
    # the cheap checks are done: only now tokenize (the dear part for a long prompt)
    prompt_ids = _prompt_ids(req, encode_chat, encode_text, max_len, max_chars)
    if any(not 0 <= t < vocab_size for t in prompt_ids):
        raise bad(f"prompt token ids must be within [0, {vocab_size})", param="prompt", code="invalid_value")
    # the prompt and the generated tokens share max_len - 1 positions (the engine keeps one spare)
    room = max_len - 1 - len(prompt_ids)
    if room < 1:
        fits = f"at most {max_len - 2} prompt tokens fit (with {param} = 1"
        if max_tokens is not None and 1 < max_tokens <= max_len - 2:
            fits += f"; {max_len - 1 - max_tokens} with {param} = {max_tokens}"
        raise bad(f"the prompt is {len(prompt_ids)} tokens; this model's context window is {max_len} tokens: "
                  f"{fits})", param="messages" if kind == "chat" else "prompt", code="context_length_exceeded")
    if max_tokens is not None and max_tokens > room:
        raise bad(f"{param} = {max_tokens} is too large: the prompt is {len(prompt_ids)} tokens and the context "
                  f"window {max_len}, so at most {room} tokens can be generated", param=param,
                  code="context_length_exceeded")
    # no max_tokens: until a stop, EOS or the window's end, as OpenAI and vLLM (a silent cap of 256 tokens cut long
    # answers short with finish_reason 'length'); an operator's --default-max-tokens caps it
    max_new = max_tokens if max_tokens is not None else min(room, default_max_tokens or room)
    try:
        params = SamplingParams(temperature=float(temperature), top_k=top_k, top_p=float(top_p),
                                max_new_tokens=max_new, stop=stop, seed=req.seed)
    except ValueError as exc:
        raise bad(str(exc), code="invalid_value") from None
    return Checked(kind, prompt_ids, params, req.speculative is not False, bool(req.stream), include_usage)


def _refuse(name: str, what: str, detail: str = "") -> APIError:
    return bad(f"{what} is not supported by this engine{detail}", param=name, code="unsupported_value")


def _unsupported(req: _Common) -> None:
    """Fields the engine cannot honour are refused, never silently ignored (their harmless values pass)."""
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value not in (None, 0, 0.0):
            raise _refuse(name, name, f" (only 0), got {value}")
    # chat's logprobs is a boolean (false, or 0, asks for none); a completion's is a count, and 0 still asks for
    # the chosen tokens' own logprobs: there only null and false ask for none
    lp = req.logprobs
    asks_none = lp is None or lp is False or (isinstance(req, ChatRequest) and lp == 0)
    if not asks_none:
        raise _refuse("logprobs", "logprobs")
    if req.logit_bias:
        raise _refuse("logit_bias", "logit_bias", " (only an empty object)")
    if isinstance(req, ChatRequest):
        if req.top_logprobs not in (None, 0):
            raise _refuse("top_logprobs", "top_logprobs", " (logprobs are not returned)")
        if req.tools:
            raise _refuse("tools", "tools")
        if req.functions:
            raise _refuse("functions", "functions")
        for i, m in enumerate(req.messages):
            if m.role in TOOL_ROLES:
                raise bad(f"{NO_TOOL_CALLS}: messages.{i} is a {m.role!r} message, the answer to a tool call",
                          param=f"messages.{i}.role", code="unsupported_value")
            for name in ("tool_calls", "function_call"):
                if getattr(m, name):
                    raise bad(f"{NO_TOOL_CALLS}: messages.{i} holds {name}", param=f"messages.{i}.{name}",
                              code="unsupported_value")
        for name in ("tool_choice", "function_call"):
            value = getattr(req, name)
            if value not in (None, "none"):
                raise _refuse(name, name, f" (only \"none\"), got {json.dumps(value)[:80]}")
        fmt = req.response_format
        if fmt is not None and fmt != {"type": "text"}:
            raise _refuse("response_format", "response_format", f" (only {{\"type\": \"text\"}}), got "
                          f"{json.dumps(fmt)[:80]}")
        if req.modalities is not None and req.modalities != ["text"]:
            raise _refuse("modalities", "modalities", f" (only [\"text\"]), got {json.dumps(req.modalities)[:80]}")
        for name in ("audio", "prediction", "web_search_options"):
            if getattr(req, name) is not None:
                raise _refuse(name, name)
        if req.reasoning_effort not in (None, "none"):
            raise _refuse("reasoning_effort", "reasoning_effort", f" (only \"none\": this model does not reason), "
                          f"got {json.dumps(req.reasoning_effort)[:80]}")
    if isinstance(req, CompletionRequest):
        if req.echo:
            raise _refuse("echo", "echo")
        if req.best_of not in (None, 1):
            raise _refuse("best_of", f"best_of = {req.best_of}", " (only 1)")
        if req.suffix:
            raise _refuse("suffix", "suffix")
    opts = req.stream_options or {}
    for key, value in opts.items():
        if key == "include_usage" or key == "include_obfuscation" and value is False:
            continue
        raise _refuse(f"stream_options.{key}", f"stream_options.{key}",
                      " (only include_usage is honoured)" if key != "include_obfuscation" else
                      " (only false: chunks carry no obfuscation padding)")


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise bad(f"at most {MAX_STOP_STRINGS} stop sequences, got {len(stops)}", param="stop", code="invalid_value")
    if any(not s for s in stops):
        raise bad("stop sequences must be non-empty strings", param="stop", code="invalid_value")
    return tuple(stops)


def _too_many_chars(chars: int, max_len: int, max_chars: int | None, param: str) -> None:
    if max_chars is not None and chars > max_chars:
        raise bad(f"the prompt is {chars} characters, more than this model's context window of {max_len} tokens "
                  f"can hold (at most {max_chars} characters with this tokenizer)", param=param,
                  code="context_length_exceeded")


def _prompt_ids(req: _Common, encode_chat, encode_text, max_len: int, max_chars: int | None) -> list[int]:
    if isinstance(req, ChatRequest):
        if not req.messages:
            raise bad("messages must hold at least one message", param="messages", code="invalid_value")
        msgs = []
        for i, m in enumerate(req.messages):
            try:
                msgs.append({"role": m.role, "content": m.text()})
            except ValueError as exc:
                raise bad(str(exc), param=f"messages.{i}.content", code="unsupported_value") from None
        # the contents as sent: a template that trims them is not assumed (the bundled one keeps every space,
        # and tokenizing megabytes of them is what this bound spares the tokenizer thread)
        _too_many_chars(sum(len(m["content"]) for m in msgs), max_len, max_chars, "messages")
        return list(encode_chat(msgs))
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise bad(f"one prompt per request is supported, got {len(prompt)}", param="prompt",
                      code="unsupported_value")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad("prompt must not be empty", param="prompt", code="invalid_value")
        _too_many_chars(len(prompt), max_len, max_chars, "prompt")
        return list(encode_text(prompt))
    if not prompt:
        raise bad("prompt must not be empty", param="prompt", code="invalid_value")
    return list(prompt)
