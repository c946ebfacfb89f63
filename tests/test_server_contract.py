"""Requests the server must accept (and what it answers) at the edges of its contract: the widest seeds,
harmless OpenAI fields, HEAD /health and GET /v1/models/{id}. The refusals are in test_server_bad_input."""

from __future__ import annotations

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
