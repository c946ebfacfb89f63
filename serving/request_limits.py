"""The limits the server puts on a request's sampling parameters, torch-free: the server's checks
(`serving.server_schemas`) and the clients that must stay within them (`loadtest`, `bench --seed`) read
them here, so a pure HTTP client does not load torch to know them."""

from __future__ import annotations

MAX_TEMPERATURE = 2.0  # OpenAI's documented range is [0, 2]
MIN_TOP_P = 1e-30  # a smaller top_p is applied as this one: both keep the most likely token alone
MAX_STOP_STRINGS = 4
# what torch.Generator.manual_seed takes (a negative seed wraps to its unsigned 64-bit value)
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
