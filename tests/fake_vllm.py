"""A fake of exactly the vLLM surface `serving.vllm_backend` uses, with deterministic tokens and counters.

Surface (vLLM v1): `vllm.LLM(model=..., speculative_config=..., disable_log_stats=False, ...)`,
`LLM.get_tokenizer()`, `LLM.get_metrics()` (Counter / Vector objects as `vllm.v1.metrics.reader` makes),
`LLM.llm_engine.add_request(request_id, {"prompt_token_ids": [...]}, params)`, `.step()` (a list of
RequestOutput whose `outputs[0].token_ids` holds the step's new tokens with `RequestOutputKind.DELTA`),
`.has_unfinished_requests()`, `.engine_core.shutdown()`, `vllm.SamplingParams(...)` and
`vllm.sampling_params.RequestOutputKind`. Also a fake pynvml whose energy counter counts up with time.

The fake's rules, so tests can compute what the backend must report:
- output token i of a prompt is `100 + (sum(prompt) + i) % 50`; EOS never comes, so outputs are max_tokens long
- the first step after add_request emits 1 token (prefill); with speculation every later step proposes K
  tokens, accepts ACCEPT_CYCLE[step % 4] of them (capped so the output never passes max_tokens) and emits
  accepted + 1; without speculation every step emits 1 token
- counters are split over two label sets (engine 0 and 1), as vLLM reports one per engine
"""

from __future__ import annotations

import enum
import sys
import time
import types
from dataclasses import dataclass, field

ACCEPT_CYCLE = (2, 0, 4, 1)
STEP_S = 0.002  # each fake step "computes" this long


def token(prompt: list[int], i: int) -> int:
    return 100 + (sum(prompt) + i) % 50


# ------------------------------------------------------------------------------ vllm.v1.metrics.reader


@dataclass
class Counter:
    name: str
    labels: dict[str, str]
    value: int


@dataclass
class Vector:
    name: str
    labels: dict[str, str]
    values: list[int]


@dataclass
class Gauge:
    name: str
    labels: dict[str, str]
    value: float


# ------------------------------------------------------------------------------ vllm.sampling_params


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class SamplingParams:
    def __init__(self, *, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=16, seed=None, stop=None,
                 output_kind=RequestOutputKind.CUMULATIVE):
        if top_k == 0 or top_k < -1:
            raise ValueError(f"top_k must be -1 (disable), or at least 1, got {top_k}.")  # vLLM 0.8's check
        self.temperature, self.top_p, self.top_k, self.max_tokens = temperature, top_p, top_k, max_tokens
        self.seed, self.stop, self.output_kind = seed, stop, output_kind


# ------------------------------------------------------------------------------ vllm.outputs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    outputs: list[CompletionOutput]
    finished: bool


# ------------------------------------------------------------------------------ the engine


class FakeTokenizer:
    chat_template = "{fake}"

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, return_dict=False):
        assert add_generation_prompt and tokenize and not return_dict
        text = " ".join(m["content"] for m in messages)
        return [1] + self.encode(text) + [2]

    def encode(self, text: str) -> list[int]:
        return [3 + len(w) % 40 for w in text.split()][:200]


@dataclass
class _Req:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    emitted: int = 0
    steps: int = 0


@dataclass
class _Counters:
    drafts: list[int] = field(default_factory=lambda: [0, 0])
    draft_tokens: list[int] = field(default_factory=lambda: [0, 0])
    accepted: list[int] = field(default_factory=lambda: [0, 0])
    per_pos: list[list[int]] = field(default_factory=list)


class FakeEngineCore:
    def __init__(self) -> None:
        self.shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


class FakeLLMEngine:
    def __init__(self, k: int | None, counters: _Counters) -> None:
        self.k, self.counters = k, counters
        self.running: list[_Req] = []
        self.engine_core = FakeEngineCore()
        self.num_steps = 0

    def add_request(self, request_id, prompt, params) -> None:
        assert isinstance(request_id, str) and set(prompt) == {"prompt_token_ids"}, prompt
        assert params.output_kind is RequestOutputKind.DELTA, "the backend streams DELTA outputs"
        assert all(r.request_id != request_id for r in self.running), f"duplicate request id {request_id}"
        self.running.append(_Req(request_id, list(prompt["prompt_token_ids"]), params))

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self) -> list[RequestOutput]:
        time.sleep(STEP_S)
        self.num_steps += 1
        outs = []
        for r in list(self.running):
            room = r.params.max_tokens - r.emitted
            if r.emitted == 0 or self.k is None:
                n = 1
            else:
                accepted = min(ACCEPT_CYCLE[r.steps % len(ACCEPT_CYCLE)], self.k, room - 1)
                engine = r.steps % 2  # spread over two label sets
                c = self.counters
                c.drafts[engine] += 1
                c.draft_tokens[engine] += self.k
                c.accepted[engine] += accepted
                for pos in range(accepted):
                    c.per_pos[engine][pos] += 1
                n = accepted + 1
            if r.emitted:
                r.steps += 1
            ids = [token(r.prompt, r.emitted + i) for i in range(n)]
            r.emitted += n
            done = r.emitted >= r.params.max_tokens
            if done:
                self.running.remove(r)
            text = "".join(f"<{t}>" for t in ids)
            outs.append(RequestOutput(r.request_id, [CompletionOutput(0, text, ids, "length" if done else None)], done))
        return outs


class LLM:
    instances: list[LLM] = []

    def __init__(self, model: str, *, speculative_config: dict | None = None, tensor_parallel_size: int = 1,
                 dtype: str = "auto", seed: int = 0, max_model_len: int | None = None,
                 disable_log_stats: bool = True, **engine_args) -> None:
        if speculative_config is not None:
            method = speculative_config["method"]
            assert method in ("draft_model", "ngram", "eagle", "eagle3", "mtp"), method
            if method in ("draft_model", "eagle", "eagle3"):
                assert speculative_config.get("model"), "draft model required"
        self.kwargs = dict(model=model, speculative_config=speculative_config, tensor_parallel_size=tensor_parallel_size,
                           dtype=dtype, seed=seed, max_model_len=max_model_len, disable_log_stats=disable_log_stats,
                           **engine_args)
        self.log_stats = not disable_log_stats
        k = speculative_config["num_speculative_tokens"] if speculative_config else None
        self.counters = _Counters(per_pos=[[0] * (k or 1), [0] * (k or 1)])
        self.llm_engine = FakeLLMEngine(k, self.counters)
        self.metric_reads = 0
        LLM.instances.append(self)

    def get_tokenizer(self) -> FakeTokenizer:
        return FakeTokenizer()

    def get_metrics(self) -> list:
        """Like vLLM: spec-decode metrics exist only with stat logging and a speculative_config."""
        self.metric_reads += 1
        out: list = [Gauge("vllm:num_requests_running", {}, float(len(self.llm_engine.running)))]
        if not self.log_stats or self.llm_engine.k is None:
            return out
        c = self.counters
        for e in (0, 1):
            labels = {"model_name": "fake", "engine": str(e)}
            out += [Counter("vllm:spec_decode_num_drafts", labels, c.drafts[e]),
                    Counter("vllm:spec_decode_num_draft_tokens", labels, c.draft_tokens[e]),
                    Counter("vllm:spec_decode_num_accepted_tokens", labels, c.accepted[e]),
                    Vector("vllm:spec_decode_num_accepted_tokens_per_pos", labels, list(c.per_pos[e]))]
        return out


def modules() -> tuple[types.ModuleType, types.ModuleType]:
    """(vllm, vllm.sampling_params) as module objects holding the fakes above."""
    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.0-fake"
    vllm.LLM, vllm.SamplingParams = LLM, SamplingParams
    sp = types.ModuleType("vllm.sampling_params")
    sp.RequestOutputKind, sp.SamplingParams = RequestOutputKind, SamplingParams
    vllm.sampling_params = sp
    return vllm, sp


def install(monkeypatch) -> types.ModuleType:
    """Put the fake where `import vllm` finds it, for this test only."""
    vllm, sp = modules()
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sp)
    LLM.instances.clear()
    return vllm


# ------------------------------------------------------------------------------ pynvml


class FakeNvml:
    """pynvml with one GPU drawing POWER_W: its energy counter (mJ) is POWER_W x elapsed wall time."""

    POWER_W = 300.0

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
        pass

    def __init__(self) -> None:
        self.t0 = time.time()

    def nvmlInit(self):  # noqa: N802 - pynvml's names below
        pass

    def nvmlShutdown(self):  # noqa: N802
        pass

    def nvmlDeviceGetCount(self):  # noqa: N802
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return i

    def nvmlDeviceGetName(self, handle):  # noqa: N802
        return b"Fake H200"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):  # noqa: N802
        return int(1_000_000 + (time.time() - self.t0) * self.POWER_W * 1000)

    def nvmlDeviceGetPowerUsage(self, handle):  # noqa: N802
        return int(self.POWER_W * 1000)

    def nvmlDeviceGetUtilizationRates(self, handle):  # noqa: N802
        return types.SimpleNamespace(gpu=90, memory=50)
