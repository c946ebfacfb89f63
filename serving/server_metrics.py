"""Prometheus metrics of the server, in its own registry, named as vLLM names them.

prometheus-client appends `_total` to a counter's name when it exposes it, exactly as vLLM's own
`/metrics` does (vLLM also registers `vllm:spec_decode_num_drafts` and serves
`vllm:spec_decode_num_drafts_total{engine="0",model_name=...}`), so dashboards built for vLLM read these
unchanged. Counters are updated when a request finishes (not per step): the hot path only appends to
the request record.

What they count. vLLM's counters count all the work done, the tokens and drafts of requests that were cancelled
(a client that disconnected) or failed included, and dashboards built for vLLM read them so; ours keep that
meaning: they equal the store's sums over all the requests the server recorded (`requests.num_draft_tokens`
summed, any status; docs/serving.md says which requests a server leaves to a load test's runs). The store's
figures (`queries.mode_summaries`: the dashboard, `cost`, the reports) count ok requests only, as the latency
histograms here do, so the acceptance rate and tokens read from the vLLM counters are not theirs once a request
ends otherwise. The `specfinops:` twins (`specfinops:generation_tokens_total{status,mode}`,
`specfinops:spec_decode_num_drafts_total{status}`, `..._num_draft_tokens_total{status}`,
`..._num_accepted_tokens_total{status}`) split the same counts by the request's status: their `status="ok"` series
are the store's ok-only figures, and summed over status they equal the vLLM counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from telemetry.records import PowerReading, RequestRecord

CONTENT_TYPE = CONTENT_TYPE_LATEST
MODES = ("spec", "ar")  # a server's modes: one run each in the store, one `mode` label each here
MEASURED_POWER_SOURCES = ("nvml", "rapl")  # an estimate is not a measurement: no power gauges for it

_LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                      10.0, 20.0, 40.0, 80.0, 160.0)
_TPOT_BUCKETS_S = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                   0.75, 1.0, 2.5, 5.0)


class ServeMetrics:
    def __init__(self, model_name: str, *, running=None, waiting=None):
        self.registry = r = CollectorRegistry(auto_describe=True)
        base = ["model_name", "engine"]
        self._base = (model_name, "0")
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Speculative steps (draft-verify cycles).",
                              base, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", base, registry=r)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", base, registry=r)
        self.accepted_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted draft tokens per draft position (position i counts when "
                                        "more than i drafts of a step were accepted).", [*base, "position"],
                                        registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Arrival at the server -> first token.",
                              base, buckets=_LATENCY_BUCKETS_S, registry=r)
        self.tpot = Histogram("vllm:request_time_per_output_token_seconds",
                              "Per request (E2E - TTFT) / (output tokens - 1).", base, buckets=_TPOT_BUCKETS_S,
                              registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Arrival at the server -> last token.", base,
                             buckets=_LATENCY_BUCKETS_S, registry=r)
        self.requests = Counter("specfinops:requests", "Finished requests by status (ok | error | cancelled) "
                                "and mode (spec | ar).", [*base, "status", "mode"], registry=r)
        self.rejected = Counter("specfinops:requests_rejected", "Requests refused before they reached the engine "
                                "(reason: overloaded | shutting_down): neither in specfinops:requests nor in the "
                                "store.", [*base, "reason"], registry=r)
        self.rejected.labels(*self._base, "overloaded")  # at 0 from the start: a rate of refusals reads 0, no gap
        self.generation_tokens = Counter("vllm:generation_tokens", "Output tokens emitted.", base, registry=r)
        # the same counts by the request's status (module docstring): status="ok" is what the store's figures count
        by_status = [*base, "status"]
        self.generation_tokens_by_status = Counter(
            "specfinops:generation_tokens", "Output tokens emitted, by the request's status (ok | error | "
            "cancelled) and mode; status=\"ok\" is what the store's figures count.", [*by_status, "mode"], registry=r)
        self.drafts_by_status = Counter("specfinops:spec_decode_num_drafts", "vllm:spec_decode_num_drafts by the "
                                        "request's status (ok | error | cancelled).", by_status, registry=r)
        self.draft_tokens_by_status = Counter("specfinops:spec_decode_num_draft_tokens",
                                              "vllm:spec_decode_num_draft_tokens by the request's status.", by_status,
                                              registry=r)
        self.accepted_by_status = Counter("specfinops:spec_decode_num_accepted_tokens",
                                          "vllm:spec_decode_num_accepted_tokens by the request's status.", by_status,
                                          registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens prefilled (requests that reached the "
                                     "engine and emitted a first token).", base, registry=r)
        if running is not None:
            Gauge("vllm:num_requests_running", "Sequences in the engine batch, prefilling ones included.", base,
                  registry=r).labels(*self._base).set_function(running)
        if waiting is not None:
            Gauge("vllm:num_requests_waiting", "Requests waiting for a batch slot.", base,
                  registry=r).labels(*self._base).set_function(waiting)
        self.power_w = Gauge("specfinops:power_watts", "Device power (measured).", ["source", "device"],
                             registry=r)
        self.energy_j = Gauge("specfinops:energy_joules", "Device energy since the server started (measured).",
                              ["source", "device"], registry=r)
        self._energy_origin_mj: dict[int, float] = {}

    def observe_request(self, mode: str, rec: RequestRecord) -> None:
        b = self._base
        self.requests.labels(*b, rec.status, mode).inc()
        # prefilled = a first token came out: a request cancelled while it waited, or failed at prefill, was not
        if rec.ttft_ms is not None:
            self.prompt_tokens.labels(*b).inc(rec.prompt_tokens)
        self.generation_tokens.labels(*b).inc(rec.output_tokens)
        self.generation_tokens_by_status.labels(*b, rec.status, mode).inc(rec.output_tokens)
        if rec.num_drafts:
            for total, by_status, n in ((self.drafts, self.drafts_by_status, rec.num_drafts),
                                        (self.draft_tokens, self.draft_tokens_by_status, rec.num_draft_tokens),
                                        (self.accepted, self.accepted_by_status, rec.num_accepted_tokens)):
                total.labels(*b).inc(n)
                by_status.labels(*b, rec.status).inc(n)
            per_pos: dict[int, int] = {}
            for s in rec.steps:
                for i in range(s.accepted):
                    per_pos[i] = per_pos.get(i, 0) + 1
            for i, n in sorted(per_pos.items()):
                self.accepted_per_pos.labels(*b, str(i)).inc(n)
        if rec.status != "ok":
            return
        if rec.ttft_ms is not None:
            self.ttft.labels(*b).observe(rec.ttft_ms / 1000.0)
        if rec.e2e_ms is not None:
            self.e2e.labels(*b).observe(rec.e2e_ms / 1000.0)
        if rec.ttft_ms is not None and rec.e2e_ms is not None and rec.output_tokens > 1:
            self.tpot.labels(*b).observe((rec.e2e_ms - rec.ttft_ms) / (rec.output_tokens - 1) / 1000.0)

    def observe_rejected(self, reason: str) -> None:
        self.rejected.labels(*self._base, reason).inc()

    def prepare_positions(self, k_max: int) -> None:
        """Expose positions 0..k_max-1 from the start (at 0), as vLLM does for its configured K."""
        for i in range(k_max):
            self.accepted_per_pos.labels(*self._base, str(i))
        for c in (self.drafts, self.draft_tokens, self.accepted, self.generation_tokens, self.prompt_tokens):
            c.labels(*self._base)
        for c in (self.drafts_by_status, self.draft_tokens_by_status, self.accepted_by_status):
            c.labels(*self._base, "ok")  # the ok-only figure reads 0 from the start, like its vLLM twin
        for mode in MODES:
            self.generation_tokens_by_status.labels(*self._base, "ok", mode)

    def observe_power(self, readings: list[PowerReading]) -> None:
        for p in readings:
            if p.source not in MEASURED_POWER_SOURCES:
                continue
            dev = str(p.device_index)
            if p.power_w is not None:
                self.power_w.labels(p.source, dev).set(p.power_w)
            if p.energy_mj is not None:
                origin = self._energy_origin_mj.setdefault(p.device_index, p.energy_mj)
                self.energy_j.labels(p.source, dev).set(max(p.energy_mj - origin, 0.0) / 1000.0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
