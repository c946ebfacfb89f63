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
