"""Requests the server must accept (and what it answers) at the edges of its contract: the widest seeds,
harmless OpenAI fields, the usage field of streamed chunks, HEAD /health and GET /v1/models/{id}. The refusals are in test_server_bad_input."""

from __future__ import annotations

import json

import httpx
import pytest
from serve_live import AUTH, shared_live

pytestmark = pytest.mark.slow

CHAT, COMP = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def live(request):
    return shared_live(request.config)


@pytest.mark.parametrize("seed", [2**64 - 1, -(2**63), 0])
def test_the_widest_seeds_torch_takes_are_served(live, seed):
    body = {"model": live.model, "prompt": "hello", "max_tokens": 3, "temperature": 1.0, "seed": seed}
    r = httpx.post(live.url + COMP, json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_the_harmless_values_of_unhonoured_fields_are_accepted(live):
    """What the engine does anyway: text output, no bias, no tools, no logprobs, no obfuscation padding."""
    body = {"model": live.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0,
            "response_format": {"type": "text"}, "logit_bias": {}, "tool_choice": "none", "top_logprobs": 0,
            "logprobs": False, "presence_penalty": 0, "frequency_penalty": 0.0, "n": 1, "user": "u-1",
            "stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False}}
    r = httpx.post(live.url + CHAT, json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    assert r.text.rstrip().endswith("data: [DONE]") and '"usage"' in r.text and '"error"' not in r.text


@pytest.mark.parametrize("path", [CHAT, COMP])
def test_with_include_usage_every_chunk_carries_usage_null_but_the_last(live, path):
    """OpenAI: with stream_options.include_usage every chunk has "usage" (null), the last one the usage
    with empty choices. Without the option no chunk has the field."""
    body = {"model": live.model, "max_tokens": 4, "temperature": 0, "stream": True,
            **({"messages": [{"role": "user", "content": "hi"}]} if path == CHAT else {"prompt": "Hello"})}

    def events(extra: dict) -> list[dict]:
        r = httpx.post(live.url + path, json={**body, **extra}, headers=AUTH, timeout=120)
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text
        return [json.loads(line[6:]) for line in r.text.splitlines()
                if line.startswith("data: ") and line != "data: [DONE]"]

    with_usage = events({"stream_options": {"include_usage": True}})
    assert len(with_usage) >= 2 and all("usage" in e and e["usage"] is None for e in with_usage[:-1]), with_usage
    assert with_usage[-1]["choices"] == [] and with_usage[-1]["usage"]["completion_tokens"] >= 1
    assert all("usage" not in e for e in events({}))


def test_the_context_window_error_says_how_many_prompt_tokens_fit_and_that_many_do(live):
    w = live.state.max_len
    r = httpx.post(live.url + COMP, json={"model": live.model, "prompt": [1] * (w - 1), "max_tokens": 1},
                   headers=AUTH, timeout=120)
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == "prompt", err
    assert f"at most {w - 2} prompt tokens fit (with max_tokens = 1)" in err["message"], err
    r = httpx.post(live.url + COMP, json={"model": live.model, "prompt": [1] * (w - 1), "max_tokens": 10},
                   headers=AUTH, timeout=120)
    assert f"{w - 11} with max_tokens = 10" in r.json()["error"]["message"], r.text
    # what the message promises is served: w - 2 prompt tokens and one generated
    r = httpx.post(live.url + COMP, json={"model": live.model, "prompt": [1] * (w - 2), "max_tokens": 1,
                                          "temperature": 0}, headers=AUTH, timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == w - 2


def test_head_health_is_allowed(live):
    r = httpx.head(live.url + "/health")
    assert r.status_code == 200 and r.content == b""


def test_models_retrieve_gives_the_listed_model_and_404_for_another(live):
    from openai import NotFoundError, OpenAI
    from serve_live import API_KEY

    client = OpenAI(base_url=live.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    listed = client.models.list().data
    got = client.models.retrieve(live.model)
    assert [got.model_dump()] == [m.model_dump() for m in listed] and got.id == live.model
    from serving.worker import (
        device_name,  # the server's device, as its runs record it: a load test's are priced by it
    )

    assert got.model_dump()["specfinops"]["device"] == device_name()
    with pytest.raises(NotFoundError) as exc:
        client.models.retrieve("gpt-4o")
    assert exc.value.body["code"] == "model_not_found" and exc.value.body["param"] == "model"
    assert httpx.get(live.url + f"/v1/models/{live.model}").status_code == 401  # the API key guards it too


def test_a_prompt_of_many_characters_that_fits_in_tokens_is_served(live):
    """The character bound refuses only what cannot fit: 60,000 spaces are about 940 tokens here."""
    r = httpx.post(live.url + COMP, json={"model": live.model, "prompt": " " * 60_000 + "hi", "max_tokens": 1,
                                          "temperature": 0}, headers=AUTH, timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] < live.state.max_len - 1
