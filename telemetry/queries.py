"""SQL aggregations over the store: THE one implementation of every figure the CLI, dashboard and reports show.

Sums and counts run in SQL (GROUP BY); token_events are never loaded. So does a run's wall span (`_spans`), but
under a domain or prompt filter, where the selected requests' share of the run's serving time walks its requests'
times in order in Python. Percentiles (TTFT, TPOT) are computed in Python from one SELECT of the filtered
per-request values, two numbers a request (`_latency_values` says why not in SQL), and only where a figure shows
them: `costs` and `speedups` read none (`run_summaries(latency=False)`).

Definitions (README, "Metric definitions"): only requests with status 'ok' count towards tokens, latency and acceptance.
    TPOT              = (e2e_ms - ttft_ms) / (output_tokens - 1), for output_tokens > 1
    wall_s            = first request start -> last request end (start + e2e) of the run's filtered
                        requests; the run's ended_at - started_at when no request has an e2e time and no time
                        window or domain narrows the run (else unknown). Under a time window, the span of the
                        run's requests that started inside it. Under a prompt filter, the selected requests' share
                        of the time the run served: while n requests are in flight, k of them selected, k / n of
                        that time; under a domain filter, that share of the span, idle time shared in the same
                        proportion (the domains of a run add up to its span)
    tokens_per_s      = output tokens / wall_s  (aggregate throughput: concurrent requests overlap)
    acceptance_rate   = accepted / drafted;  mean_acceptance_length = 1 + accepted / drafts
    alpha             = accepted / tested over the steps (a step tests its accepted drafts and the first
                        rejected one): the per-token acceptance of `specfinops calibrate` and the bound
    energy_j          = sum of requests.energy_j (None when no request has one); J/token over the requests
                        that have one; energy_estimated when a run with energy in the figure had the
                        'estimate' power source
    speedup           = spec tokens/s / AR tokens/s, same workload, target, device, precision, concurrency,
                        sampling (temperature, top_p, top_k), answer length cap (max_new_tokens) and run kind,
                        over the prompts both modes ran (a load test's: all its requests) (`speedups`); pooled over every run in view
    paired speedups   = the same ratio within each invocation (runs.invocation_id: one bench or load test) that
                        recorded both modes, with the same prompt rule (`Speedup.invocation_speedups`)
    speedup above the mean acceptance length (of the spec runs over the same requests, x finops'
                        MAX_SPEEDUP_OVER_ACCEPTANCE_LENGTH): impossible, the AR timing was inflated
                        (`Speedup.above_acceptance`, said beside the figure and the money resting on it)

Public API:
    Filters(since, until, node_id, run_ids, target, drafter, workload, domain, mode, temperature, kind,
            prompt_ids, top_p, top_k, max_new_tokens, invocation_id)
    run_summaries(engine, filters=None) -> list[RunSummary]
    mode_summaries(engine, filters=None) -> list[ModeSummary]
    config_summaries(engine, filters=None) -> list[ConfigSummary]  (runs pooled per configuration)
    acceptance_by_domain(engine, filters=None) -> list[DomainAcceptance]
    speedups(engine, filters=None) -> list[Speedup]  (pooled, and paired per invocation: `invocation_speedups`)
    paired_text(speedup) -> str  (the paired figures in words, flagging a pooled figure outside them)
    above_acceptance_text(speedup) -> str | None  (a figure above its mean acceptance length, in words)
    above_acceptance_lines(speedups) -> list[str]  (those texts, each naming its configuration among several)
    percentile(values, q) -> float | None

Costs and node projections over these figures live in telemetry.costing (run_cost, costs,
project_from_store).
"""

from __future__ import annotations

import math
import numbers
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

from sqlalchemy import Float, and_, case, cast, func, or_, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from telemetry.db import Request, Run, Step, read_snapshot
from telemetry.finops import speedup_exceeds_acceptance, speedup_over_acceptance_text
from telemetry.liveness import shown_status

MODES = ("spec", "ar")
# What the synthetic data generator (scripts.synth_store) marks its runs with: never measurements (the dashboard's
# banner, the report's notice)
SYNTHETIC_WORKLOAD = "synthetic"
SYNTHETIC_HOSTNAME = "synthetic-generator"
RUN_KINDS = ("bench", "serve", "loadtest")  # runs.kind: a bench times the engine, a load test its HTTP clients
GO_LINE = 0.65  # the usual go/no-go for a draft (the alignment phase's line); calibrate's --threshold defaults to it
MAX_TOP_K = 2**31 - 1  # runs.top_k is a 32-bit INTEGER
MAX_NEW_TOKENS = 2**31 - 1  # runs.max_new_tokens is a 32-bit INTEGER
EMPTY_STORE_HINT = "run `specfinops bench --workload code --mode both` to measure spec and AR runs"


def empty_store_hint(engine: Engine | None = None) -> str:
    """EMPTY_STORE_HINT for the store `engine` reads: the bench records into it, so the command names it with
    `--db STORE` where a bench without --db would record elsewhere (a store other than $SPECFINOPS_DB_URL, else
    var/specfinops.db), its password masked, as the dashboard's empty-store page and `no store at PATH` do."""
    command = bench_command(engine)
    if engine is None or _db_option(engine.url) is None:
        return f"run `{command}` to measure spec and AR runs"
    from telemetry.db import masked_password_note

    return f"run `{command}`{masked_password_note(engine.url)} to measure spec and AR runs"


def bench_command(engine: Engine | None = None, workload: str = "code", *, always_db: bool = False,
                  options: Iterable[tuple[str, object]] = ()) -> str:
    """`specfinops bench --workload WORKLOAD --mode both`, recording into the store `engine` reads: with
    `--db STORE` where a bench without --db would record elsewhere (_db_option), as empty_store_hint says it.
    `always_db`: even where it is this process's default store (the dashboard's: `specfinops dashboard --db X`
    makes X its $SPECFINOPS_DB_URL, which the shell the command is copied into does not have). `options`: more
    bench options as (flag, value) pairs, after --mode (`--concurrency 1,2,4`, a run's `--temperature 0.7`)."""
    return _record_command("bench", engine, workload, always_db, options)


def _record_command(verb: str, engine: Engine | None, workload: str, always_db: bool,
                    options: Iterable[tuple[str, object]]) -> str:
    """`specfinops VERB --workload WORKLOAD --mode both OPTIONS [--db STORE]` (bench_command)."""
    import shlex

    store = None if engine is None else _db_option(engine.url, always=always_db)
    command = f"specfinops {verb} --workload {shlex.quote(workload)} --mode both"
    command += "".join(f" {flag} {shlex.quote(str(value))}" for flag, value in options)
    return command if store is None else f"{command} --db {store}"


# The workloads `bench --workload` and `loadtest --workload` take by name, and the suffixes of the workload files
# they read (serving.workloads.BUILTIN_WORKLOADS and FILE_SUFFIXES: telemetry does not import serving)
BUILTIN_WORKLOADS = ("code", "chat", "rewrite", "mixed", "all")
WORKLOAD_FILE_SUFFIXES = (".jsonl", ".txt")


def bench_workload(name: str | None) -> str:
    """`name` where `bench --workload` (and loadtest's) takes it: a builtin workload or an existing workload file;
    else `mixed`: a server's runs (workload 'serve'), the generator's ('synthetic'), a file no longer there, named
    a workload bench refuses."""
    if name in BUILTIN_WORKLOADS:
        return name
    if not name:
        return "mixed"
    path = Path(name).expanduser()
    try:
        exists = path.suffix in WORKLOAD_FILE_SUFFIXES and path.is_file()
    except OSError:
        exists = False
    return name if exists else "mixed"


# `specfinops bench`'s defaults of the settings runs are compared by (app/commands/bench.py; telemetry does not
# import the app): bench_settings names a setting only where it differs from these
BENCH_DEFAULTS = {"backend": "torch", "temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 128}
BENCH_DTYPES = ("bfloat16", "float32")  # the precisions `bench --dtype` takes besides auto
BENCH_BACKENDS = ("torch", "vllm")  # `bench --backend`'s choices (a server's run may record 'unknown')
# `specfinops loadtest`'s defaults of the settings its runs record (app/commands/loadtest.py)
LOADTEST_DEFAULTS = {"temperature": 0.0, "max_new_tokens": 64}


def bench_settings(item) -> list[tuple[str, object]]:
    """The `specfinops bench` options that record runs comparable with `item` (a run, a configuration, a
    costing.Comparison: whatever has the COMPARED_FIELDS but the workload and the kind), as bench_command's
    `options`: its target and precision (`auto` picks by the machine and the batch, the target by default the
    bundled model), and its backend, sampling and answer length cap where they differ from BENCH_DEFAULTS. top_p
    and top_k only where the run sampled (at temperature 0 they change nothing: `effective_cutoffs`); a setting
    the runs did not record (None: a server's run, a store from before it was kept), or records as bench takes no
    value of (a backend or precision 'unknown': a server without specfinops' model card extras), is not named.
    Only a bench's runs (kind 'bench') have settings a bench reproduces: a load test's or a server's give none
    (their target is the served model's name or path; `record_both` says what records theirs)."""
    def g(value) -> str:  # every digit (runs group by exact values: 0.123457 is not 0.1234567891's group)
        return str(float(value))

    if getattr(item, "kind", "bench") != "bench":
        return []
    out: list[tuple[str, object]] = []
    target, backend, dtype = getattr(item, "target", None), getattr(item, "backend", None), getattr(item, "dtype", None)
    if backend in BENCH_BACKENDS and backend != BENCH_DEFAULTS["backend"]:
        out.append(("--backend", backend))
    if target:
        out.append(("--target", target))
    if dtype in BENCH_DTYPES:
        out.append(("--dtype", dtype))
    temperature = getattr(item, "temperature", None)
    if temperature is not None and temperature != BENCH_DEFAULTS["temperature"]:
        out.append(("--temperature", g(temperature)))
        top_p, top_k = getattr(item, "top_p", None), getattr(item, "top_k", None)
        if top_p is not None and top_p != BENCH_DEFAULTS["top_p"]:
            out.append(("--top-p", g(top_p)))
        if top_k is not None and top_k != BENCH_DEFAULTS["top_k"]:
            out.append(("--top-k", top_k))
    cap = getattr(item, "max_new_tokens", None)
    if cap is not None and cap != BENCH_DEFAULTS["max_new_tokens"]:
        out.append(("--max-new-tokens", cap))
    return out


def loadtest_settings(item) -> list[tuple[str, object]]:
    """The `specfinops loadtest` options that ask a server for requests like those of the load-test runs `item`
    (bench_settings' kind of item): their temperature and answer length cap where they differ from
    LOADTEST_DEFAULTS. Not their model: runs record the model card's root (a path), not the id a request names."""
    out: list[tuple[str, object]] = []
    temperature = getattr(item, "temperature", None)
    if temperature is not None and temperature != LOADTEST_DEFAULTS["temperature"]:
        out.append(("--temperature", str(float(temperature))))
    cap = getattr(item, "max_new_tokens", None)
    if cap is not None and cap != LOADTEST_DEFAULTS["max_new_tokens"]:
        out.append(("--max-tokens", cap))
    return out


LOADTEST_URL = "http://127.0.0.1:8000"  # `specfinops loadtest --url`'s default


def record_both(engine: Engine | None, item, workload: str, *, always_db: bool = False,
                words: str = "", kind: str | None = None) -> tuple[str, str]:
    """What records both modes comparable with the runs of `item` (a comparable group, as bench_settings takes;
    None: no one group), as (command, text): the text says how, the command in backquotes at its end. A bench's
    runs: bench_command with bench_settings, said to carry the runs' target and settings only where it carries
    some. A load test's: a load test of both modes against the same server with loadtest_settings. A server's
    runs record the mode each request asks for: requests of both modes, else a bench, whose runs are compared
    among themselves, not with the server's. `workload`: the runs', where the command takes it (`bench_workload`:
    else mixed). `words`: which runs ("AR " in "the AR runs' settings"). `kind`: the kind of the runs where
    `item` is None (runs of several groups, all of one kind: a load test's are recorded by a load test)."""
    kind = getattr(item, "kind", "bench") if item is not None else kind
    workload = bench_workload(workload)
    if kind == "loadtest":
        command = _record_command("loadtest", engine, workload, always_db, loadtest_settings(item))
        # what the command reproduces of the runs (their values, else loadtest's defaults): what they recorded
        known = [said for field, said in (("temperature", "sampling"), ("max_new_tokens", "answer length cap"))
                 if getattr(item, field, None) is not None]
        carried = f", with the {words}runs' {' and '.join(known)}" if known else ""
        return command, (f"record both modes with a load test against the same server{carried} (it asks the "
                         f"default {LOADTEST_URL}: add --url URL for another): `{command}`")
    options = bench_settings(item) if kind == "bench" else []
    command = bench_command(engine, workload, always_db=always_db, options=options)
    if kind not in (None, "bench"):
        return command, ("a server records the mode each request asks for (the 'speculative' extension field): send "
                         f"it requests of both modes, or record both with a bench on the same prompts and machine, "
                         f"whose runs compare among themselves, not with the server's: `{command}`")
    carried = f", with the {words}runs' target and settings" if options else ""
    return command, f"record both modes on the same prompts and machine{carried}: `{command}`"


def _db_option(url, always: bool = False) -> str | None:
    """--db's value naming the store at `url` (a SQLite file by its path); None where it is the default store
    (unless `always`) or no store a bench could record into (an in-memory SQLite database). A SPECFINOPS_DB_URL
    that names no store leaves the default unknown, so --db is said: the command read `url` through --db, which
    beats the variable, and is not to fail on it."""
    import shlex

    from sqlalchemy.engine import make_url

    from telemetry.db import resolve_db_url

    try:
        default = make_url(resolve_db_url(None))
    except ValueError:
        default = None
    always = always or default is None
    if url.get_backend_name() == "sqlite":
        if not url.database or url.database == ":memory:":
            return None
        path = Path(url.database).expanduser()
        if not always and default.get_backend_name() == "sqlite" and default.database \
                and Path(default.database).expanduser().resolve() == path.resolve() and url.query == default.query:
            return None
        return shlex.quote(url.database if not url.query else url.render_as_string(hide_password=True))
    if not always and url.render_as_string(hide_password=False) == default.render_as_string(hide_password=False):
        return None
    from telemetry.db import shown_db_url

    return shlex.quote(shown_db_url(url))  # as the user writes it, its password masked


# The builtin workload of every domain has two names (serving.workloads.MIXED_NAMES): runs record 'mixed' now,
# 'all' before; a filter naming either keeps both.
MIXED_WORKLOADS = ("mixed", "all")


def workload_file(path: str) -> str:
    """A workload file as runs record it (serving.workloads.canonical_workload): its absolute path, links resolved,
    so `my.jsonl`, `./my.jsonl`, `../x/my.jsonl` and `~/x/my.jsonl` are one workload wherever bench ran. A path that
    cannot be resolved (`~nosuchuser/...`, a link loop) stays as typed: a filter then matches that spelling only."""
    try:
        return str(Path(path).expanduser().resolve())
    except (RuntimeError, OSError):
        return path


def workload_names(want: str) -> tuple[str, ...]:
    """The recorded workloads a filter naming `want` keeps: both names of the mixed workload; a name with no path
    in it (code, chat) itself; a path, any spelling of the file, as runs record it now (`workload_file`) and as
    they recorded it before, the path as it was typed."""
    if want in MIXED_WORKLOADS:
        return MIXED_WORKLOADS
    if not any(c in want for c in "/.~"):
        return (want,)
    return tuple(dict.fromkeys((want, workload_file(want))))


def workload_matches(col, want: str):
    """SQL: a run's workload is `want` (`workload_names`: either name of the mixed workload, any path of a file)."""
    names = workload_names(want)
    return col.in_(names) if len(names) > 1 else col == want


def workload_is(have: str | None, want: str) -> bool:
    """workload_matches for a value in hand."""
    return have in workload_names(want)


def as_utc(when: datetime, name: str) -> datetime:
    """A window bound as the aware UTC instant the store compares (naive: taken as UTC, as `parse_when` reads a
    time without an offset). SQLite keeps times as text without their offset: a bound at another offset was
    compared as if its wall time were UTC there, and PostgreSQL gave other rows for the same instant."""
    if not isinstance(when, datetime):
        raise ValueError(f"{name} must be a datetime, got {when!r}")
    try:
        return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{name} {when.isoformat()} is out of the range of dates") from None


@dataclass(frozen=True, slots=True)
class Filters:
    """Which runs and requests to aggregate. since/until bound requests.started_at; domain and prompt_ids
    (requests.external_id: a workload's prompt id) filter requests; the rest filter runs. temperature keeps
    the runs recorded at it (a server's run records none: its requests chose theirs). top_p and top_k keep the
    runs whose cut-off acts as that value (`effective_cutoffs`, as speedups and groups key them): a greedy run
    (temperature 0) counts as top_p 1 and top_k 0 whatever it recorded; an unknown one (NULL) matches none.
    max_new_tokens keeps the runs recorded with that answer length cap (a server's run, or one recorded before
    the store kept it, NULL: unknown, matches none). invocation_id keeps one bench's or load test's runs
    (telemetry.invocations). target keeps the runs of that model as they recorded it, and a bare name (no '/')
    the runs of any model directory of that name (`target_matches`). None means no filter."""

    since: datetime | None = None
    until: datetime | None = None
    node_id: str | None = None
    run_ids: tuple[int, ...] | None = None
    target: str | None = None
    drafter: str | None = None
    workload: str | None = None
    domain: str | None = None
    mode: str | None = None
    temperature: float | None = None
    kind: str | None = None
    prompt_ids: tuple[str, ...] | None = None
    top_p: float | None = None  # 1 = off
    top_k: int | None = None  # 0 = off
    max_new_tokens: int | None = None  # the answer length cap per request
    invocation_id: str | None = None  # one bench or load test's runs (telemetry.invocations resolves a prefix)

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.kind is not None and self.kind not in RUN_KINDS:
            raise ValueError(f"run kind must be one of {RUN_KINDS}, got {self.kind!r}")
        if self.temperature is not None:
            t = self.temperature
            if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
                raise ValueError(f"temperature must be a number >= 0, got {t!r}")
            object.__setattr__(self, "temperature", float(t))
        if self.top_p is not None:
            p = self.top_p
            if isinstance(p, bool) or not isinstance(p, int | float) or not (0 < p <= 1):  # NaN fails too
                raise ValueError(f"top_p must be a number in (0, 1], got {p!r}")
            object.__setattr__(self, "top_p", float(p))
        # whole numbers that an INTEGER column holds: no run records more
        for name, minimum, maximum in (("top_k", 0, MAX_TOP_K), ("max_new_tokens", 1, MAX_NEW_TOKENS)):
            n = getattr(self, name)
            if n is None:
                continue
            if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < minimum:
                raise ValueError(f"{name} must be a whole number >= {minimum}, got {n!r}")
            if n > maximum:
                raise ValueError(f"{name} must be at most {maximum}, got {n!r}")
            object.__setattr__(self, name, int(n))
        if self.invocation_id is not None:
            i = self.invocation_id
            if not isinstance(i, str) or not i or len(i) > 36:
                raise ValueError(f"invocation_id must be an invocation's id (1 to 36 characters), got {i!r}")
        if self.prompt_ids is not None:
            object.__setattr__(self, "prompt_ids", tuple(sorted(str(p) for p in self.prompt_ids)))
        for name in ("since", "until"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, as_utc(getattr(self, name), name))
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError(f"since must be before until, got since={self.since} until={self.until}")
        if self.run_ids is not None:
            object.__setattr__(self, "run_ids", tuple(int(r) for r in self.run_ids))

    def where(self) -> list:
        conds = []
        for col, value in (
            (Run.node_id, self.node_id),
            (Run.drafter, self.drafter),
            (Run.mode, self.mode),
            (Run.temperature, self.temperature),
            (Run.kind, self.kind),
            (Run.max_new_tokens, self.max_new_tokens),  # NULL (unknown) equals nothing
            (Run.invocation_id, self.invocation_id),  # NULL (a server's run, or before 0011) equals nothing
            (Request.domain, self.domain),
        ):
            if value is not None:
                conds.append(col == value)
        if self.workload is not None:
            conds.append(workload_matches(Run.workload, self.workload))
        if self.target is not None:
            conds.append(target_matches(Run.target, self.target))
        if self.top_p is not None:
            conds.append(cutoff_matches(Run.top_p, self.top_p, off=1.0))
        if self.top_k is not None:
            conds.append(cutoff_matches(Run.top_k, self.top_k, off=0))
        if self.run_ids is not None:
            conds.append(Run.id.in_(self.run_ids))
        if self.prompt_ids is not None:
            conds.append(Request.external_id.in_(self.prompt_ids))
        if self.since is not None:
            conds.append(Request.started_at >= self.since)
        if self.until is not None:
            conds.append(Request.started_at < self.until)
        return conds


def target_matches(column, value: str):
    """SQL: the run's target (`column`) is `value` as recorded, or, for a bare name (no '/': what `models list`,
    `invocations` and the pages show), any model directory of that name: a path ending in '/' + name. Runs
    record the target's path on their own machine, so nodes that keep one model in different folders
    (~/.cache/specfinops/models/x on one, /models/x on another) record it under different paths; the name
    selects them all, a path only itself."""
    name = value.rstrip("/") or value
    if "/" in name:
        return or_(column == value, column == name)
    suffix = "/" + name
    # LIKE finds the candidates (SQLite's ignores ASCII case, PostgreSQL's does not); the exact tail decides,
    # so both databases (and target_is) select the same runs
    tail = func.substr(column, func.length(column) - len(suffix) + 1)
    return or_(column == name, and_(column.endswith(suffix, autoescape=True), tail == suffix))


def target_is(recorded: str | None, value: str) -> bool:
    """`target_matches` in Python: whether a run that recorded `recorded` is one of target `value`'s."""
    name = value.rstrip("/") or value
    if recorded is None:
        return False
    if "/" in name:
        return recorded in (value, name)
    return recorded == name or recorded.endswith("/" + name)


def cutoff_matches(column, value: float | int, *, off: float | int, temperature=None):
    """SQL: the run's cut-off (Run.top_p or Run.top_k) acts as `value`, as `effective_cutoffs` reads it: at
    temperature 0 it is off (`off`: top_p 1, top_k 0) whatever was recorded, so a greedy run matches the off
    value only; any other run (sampled, or a server's, temperature NULL) matches its recorded value, and a NULL
    one (unknown) matches nothing. `temperature`: the temperature expression that goes with `column` (default
    Run.temperature; export passes a request's own, else its run's)."""
    temperature = Run.temperature if temperature is None else temperature
    greedy = temperature == 0
    if value == off:
        return or_(greedy, column == value)
    return and_(column == value, or_(temperature.is_(None), ~greedy))


@dataclass(frozen=True, slots=True)
class Aggregate:
    """Figures shared by a run and a mode summary (raw counts and the rates computed from them)."""

    num_requests_ok: int
    num_requests_failed: int  # every request not ok: ended 'error' or 'cancelled' (num_requests_cancelled of them)
    output_tokens: int
    wall_s: float | None
    tokens_per_s: float | None
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    tpot_p50_ms: float | None
    tpot_p95_ms: float | None
    energy_j: float | None
    energy_complete: bool  # every ok request has an energy figure
    j_per_token: float | None
    energy_estimated: bool
    # of num_requests_failed, those cancelled (a client that disconnected, a stopped command): not failures
    num_requests_cancelled: int = 0

    @property
    def num_requests_errored(self) -> int:
        """The requests that ended 'error': num_requests_failed without the cancelled ones."""
        return self.num_requests_failed - self.num_requests_cancelled


@dataclass(frozen=True, slots=True)
class RunSummary:
    run_id: int
    mode: str
    kind: str
    node_id: str
    device: str
    backend: str
    target: str
    drafter: str | None
    k_policy: str
    dtype: str
    workload: str
    concurrency: int
    temperature: float | None  # None: a server's run (each request chose its own)
    power_source: str
    price_snapshot: dict | None
    started_at: datetime
    ended_at: datetime | None
    status: str  # as stored, but 'stale' for a 'running' run whose process is gone (telemetry.liveness)
    stats: Aggregate
    # the rest of the run's sampling; None where unknown (recorded before they were, or a server's run)
    top_p: float | None = None
    top_k: int | None = None  # 0 = off
    seed: int | None = None
    max_new_tokens: int | None = None
    invocation_id: str | None = None  # the command invocation that recorded it; None: before 0011, or a server's


@dataclass(frozen=True, slots=True)
class ModeSummary:
    mode: str
    num_runs: int
    run_ids: tuple[int, ...]
    devices: tuple[str, ...]
    stats: Aggregate


@dataclass(frozen=True, slots=True)
class DomainAcceptance:
    domain: str
    num_requests: int
    # None: unknown, the domain's requests all ended without the server's counts (a load test, revision 0012)
    num_drafts: int | None
    num_draft_tokens: int | None
    num_accepted_tokens: int | None
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    # from the recorded steps (a step tests its accepted drafts and the first rejected one): alpha =
    # accepted / tested, the per-token acceptance `specfinops calibrate` reports and the speedup bound's a;
    # None when the runs recorded no steps (telemetry off, or a backend that reports counts only)
    num_tested_tokens: int | None = None
    alpha: float | None = None

    @property
    def go_figure(self) -> float | None:
        """What the go/no-go line judges: alpha where steps were recorded (as `specfinops calibrate`
        decides), else the acceptance rate (which depends on K and reads lower)."""
        return self.alpha if self.alpha is not None else self.acceptance_rate

    @property
    def go_figure_name(self) -> str:
        return "alpha" if self.alpha is not None else "acceptance rate"

    def meets_go_line(self, line: float = GO_LINE) -> bool | None:
        """go_figure >= line; None when nothing was drafted."""
        return None if self.go_figure is None else self.go_figure >= line


def cutoffs_text(top_p: float | None, top_k: int | None, temperature: float | None = None) -> str:
    """', top_p 0.9, top_k 40': the cut-offs of a sampled distribution, each where it cuts (not 1, not 0); with
    a sampled `temperature` (> 0), one recorded as None is 'unknown' (a run recorded before it was), never read
    as off. '' where none cuts, and at temperature 0 (greedy: no cut-off changes a token). A server's runs
    (temperature None) record none: their requests chose their own."""
    if temperature == 0:
        return ""
    sampled = temperature is not None
    parts = []
    for name, value, off in (("top_p", top_p, 1), ("top_k", top_k, 0)):
        if value is None:
            if sampled:
                parts.append(f", {name} unknown")
        elif value != off:
            parts.append(f", {name} {value:g}")
    return "".join(parts)


def max_new_tokens_text(value: int | None) -> str:
    """An answer length cap in words: '128 new tokens'; None (a server's runs, whose requests chose their own,
    or runs recorded before the store kept it) is 'max new tokens unknown', never a number."""
    return "max new tokens unknown" if value is None else f"{value} new tokens"


def field_text(name: str, value) -> str:
    """One field of a group in words ('device cpu', 'top_p 0.9', 'top_k 0', '128 new tokens'); a sampling
    figure recorded as None is 'unknown' (runs recorded before it was, a server's runs), never a number."""
    if name == "max_new_tokens":
        return max_new_tokens_text(value)
    if value is None and name in ("temperature", "top_p", "top_k"):
        return f"{name} unknown"
    if isinstance(value, float):
        return f"{name} {value:g}"  # 'top_p 1', as every other place writes it, not 'top_p 1.0'
    return f"{name} {value}"


@dataclass(frozen=True, slots=True)
class Speedup:
    """spec tokens/s / AR tokens/s of one configuration pair: runs of the same workload, target, device,
    precision, concurrency, sampling (temperature, top_p, top_k), answer length cap (max_new_tokens) and run kind,
    over the prompts both modes ran where that can be told (`prompts` says how it was compared)."""

    workload: str
    target: str
    device: str
    dtype: str
    concurrency: int
    drafter: str | None
    k_policy: str
    spec_tokens_per_s: float | None
    ar_tokens_per_s: float | None
    speedup: float | None
    spec_run_ids: tuple[int, ...]
    ar_run_ids: tuple[int, ...]
    temperature: float | None = None  # None: server runs (each request chose its own)
    kind: str = "bench"
    prompts: str = ""  # how the prompts of the two modes compare (PROMPTS_* below, with counts)
    num_prompts: int | None = None  # prompts compared on, where the runs recorded prompt ids
    top_p: float | None = None  # None: unknown (runs recorded before it was, server runs)
    top_k: int | None = None
    max_new_tokens: int | None = None  # the answer length cap; None: unknown (as top_p)
    # the paired figures: per command invocation (a bench, a load test) that recorded both this spec configuration
    # and its AR baseline, its own spec tokens/s / AR tokens/s over the prompts both its modes ran, oldest
    # invocation first; () where none did (runs recorded before invocations were, server runs, modes measured by
    # separate commands). `speedup` pools every invocation's runs; these do not (`paired_text`)
    invocation_speedups: tuple[float, ...] = ()
    invocation_ids: tuple[str, ...] = ()  # the invocations of invocation_speedups, in the same order
    # 1 + accepted / drafts of the spec runs over the requests `speedup` is over (None: nothing drafted, or not
    # recorded), and of each paired invocation's as invocation_speedups: what each figure may not exceed
    # (finops.speedup_exceeds_acceptance)
    mean_acceptance_length: float | None = None
    invocation_acceptance_lengths: tuple[float | None, ...] = ()

    @property
    def above_acceptance(self) -> tuple[tuple[str | None, float, float], ...]:
        """(invocation, or None for the pooled figure; speedup; mean acceptance length) of each figure above what
        its spec runs' mean acceptance length allows: the AR timing was inflated. Paired first, oldest first; the
        pooled figure left out where it is the one paired figure (one invocation in view: the same runs)."""
        # strict=False: a Speedup built without the paired acceptance lengths has none to check them against
        figures = list(zip(self.invocation_ids, self.invocation_speedups, self.invocation_acceptance_lengths,
                           strict=False))
        if len(figures) != 1 or self.pooled_outside_paired:
            figures.append((None, self.speedup, self.mean_acceptance_length))
        return tuple((inv, x, mal) for inv, x, mal in figures if speedup_exceeds_acceptance(x, mal))

    @property
    def pooled_outside_paired(self) -> bool:
        """The pooled speedup lies outside the range of the paired ones, at the two decimals shown (False where
        there is no paired figure)."""
        if self.speedup is None or not self.invocation_speedups:
            return False
        lo, hi = (round(x, 2) for x in (min(self.invocation_speedups), max(self.invocation_speedups)))
        return not lo <= round(self.speedup, 2) <= hi

    @property
    def label(self) -> str:
        """'temperature 0.8, top_k 40, bench runs, the same 4 prompts': what a speedup shown alone must say
        beside it (top_p and top_k where they cut, `cutoffs_text`). The answer length cap is named where speedups
        shown together differ in it (the Overview's range; the tables' max new tokens column)."""
        t = "per-request temperatures" if self.temperature is None else f"temperature {self.temperature:g}"
        return f"{t}{cutoffs_text(self.top_p, self.top_k, self.temperature)}, {self.kind} runs, {self.prompts}"


PAIRED_NONE = "no paired invocation"
PAIRED_DISTRUST = "the modes ran under different conditions in different invocations"


def paired_text(s: Speedup, *, flag: bool = True) -> str:
    """The paired speedups in words: '1.93x in 1 paired invocation', '1.88x / 1.93x / 2.00x over 3 paired
    invocations', 'median 1.93x (1.88-2.00x) over 5 paired invocations'; with `flag`, followed by
    `pooled_outside_text` where the pooled figure lies outside them. Where no invocation recorded both modes it
    says so and why (never a 0)."""
    xs = s.invocation_speedups
    if not xs:
        if not s.ar_run_ids:
            return f"{PAIRED_NONE} (no AR runs)"
        if s.kind == "serve":
            return f"{PAIRED_NONE}: a server's runs are not paired (each mode serves the requests sent to it)"
        return (f"{PAIRED_NONE}: no one bench or load test recorded both modes of this configuration (runs from "
                "before invocations were recorded, or the modes benched by separate commands); the pooled figure "
                "compares runs made at different times")
    n = len(xs)
    if n == 1:
        text = f"{xs[0]:.2f}x in 1 paired invocation"
    elif n <= 3:
        text = f"{' / '.join(f'{x:.2f}x' for x in xs)} over {n} paired invocations"
    else:
        text = f"median {percentile(list(xs), 50):.2f}x ({min(xs):.2f}-{max(xs):.2f}x) over {n} paired invocations"
    if flag and s.pooled_outside_paired:
        text += f"; {pooled_outside_text(s)}"
    return text


def pooled_outside_text(s: Speedup) -> str:
    """'pooled 2.36x lies outside the paired range: ...' where `s.pooled_outside_paired`, else ''."""
    if not s.pooled_outside_paired:
        return ""
    xs = s.invocation_speedups
    where = (f"differs from the paired {xs[0]:.2f}x" if len(xs) == 1
             else f"lies outside the paired range ({min(xs):.2f}-{max(xs):.2f}x)")
    trust = "figure" if len(xs) == 1 else "figures"
    return f"pooled {s.speedup:.2f}x {where}: {PAIRED_DISTRUST}; trust the paired {trust}"


def above_acceptance_text(s: Speedup) -> str | None:
    """Where a figure of `s` (`Speedup.above_acceptance`) is above its spec runs' mean acceptance length, the one
    furthest above in words (which figure: the pooled one, or a paired invocation's), and how many others are;
    None where none is. Said beside the speedup and the money resting on it, never instead of them."""
    found = s.above_acceptance
    if not found:
        return None
    inv, x, mal = max(found, key=lambda f: f[1] / f[2])  # the first of equals: a paired figure, over the pooled
    which = "pooled over every invocation in view" if inv is None else f"invocation {inv[:8]}"
    more = len(found) - 1
    return (f"speedup {which}: {speedup_over_acceptance_text(x, mal)}"
            + (f" ({more} other figure{'s' if more > 1 else ''} of this configuration above it too)" if more else ""))


def above_acceptance_lines(found: Sequence[Speedup]) -> list[str]:
    """`above_acceptance_text` of each speedup that has one, naming its configuration where there are several:
    what the report and the dashboard say beside a speedup tile and the savings resting on it."""
    several = len(found) > 1
    return [(f"{s.workload}, concurrency {s.concurrency}, {s.drafter} ({s.k_policy}), {s.label}: " if several else "")
            + text for s in found if (text := above_acceptance_text(s))]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default) of `values`, q in [0, 100]; None when empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q!r}")
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def _latency_values(engine: Engine, filters: Filters) -> dict[int, tuple[array, array]]:
    """Per run in view: the TTFT and the TPOT values of its requests as the README defines them: ok requests
    only, TTFT where known, TPOT = (e2e - ttft) / (output_tokens - 1) where both times are known and more than
    one token came out, computed by the database in doubles as Python computes it (the same numbers).

    One SELECT of two numbers a request, no timestamps: the wall spans are SQL's (`_spans`), and only the
    percentiles need each group's values in order. Ordering them in SQL instead (ROW_NUMBER over each run, mode
    or configuration, interpolating the two order statistics around each percentile) was exact on SQLite and
    PostgreSQL, but at 1M requests SQLite 3.40 spent 3-4x the CPU of this read on it, slower than reading every
    request with its timestamps had been (docs/benchmarks.md, "The store at scale"). Kept as arrays of doubles,
    8 bytes a value, not 32 as floats in a list: a million requests' values are what a page holds; read from a
    server-side cursor, so PostgreSQL's driver does not hold the whole result besides (as exports read)."""
    has_tpot = and_(Request.e2e_ms.is_not(None), Request.output_tokens > 1)
    tpot = case((has_tpot, (Request.e2e_ms - Request.ttft_ms) / (Request.output_tokens - 1)))
    q = (select(Request.run_id, Request.ttft_ms, tpot).join(Run, Request.run_id == Run.id)
         .where(*filters.where(), Request.status == "ok", Request.ttft_ms.is_not(None)))
    out: dict[int, tuple[array, array]] = {}
    with engine.connect() as c:
        for run_id, ttft, tpot_ms in c.execution_options(stream_results=True, yield_per=10_000).execute(q):
            ttfts, tpots = out.setdefault(run_id, (array("d"), array("d")))
            ttfts.append(ttft)
            if tpot_ms is not None:
                tpots.append(tpot_ms)
    return out


def _latency(ttft: Sequence[float], tpot: Sequence[float]) -> dict[str, float | None]:
    """The Aggregate's percentiles of these TTFT and TPOT values."""
    return {"ttft_p50_ms": percentile(ttft, 50), "ttft_p95_ms": percentile(ttft, 95),
            "tpot_p50_ms": percentile(tpot, 50), "tpot_p95_ms": percentile(tpot, 95)}


# How far SQL's reckoning of a request's end may be from Python's (`_end_ms`), with room to spare
END_SLACK_MS = 10.0


def _end_ms(engine: Engine):
    """SQL: a request's end (start + e2e) in milliseconds on some fixed scale, roughly: SQLite's julianday keeps
    milliseconds and its days in a double round them to tens of microseconds. Good to tell which requests may
    end last, not which one does (`_spans`)."""
    if engine.dialect.name == "sqlite":
        return func.julianday(Request.started_at) * 86_400_000.0 + Request.e2e_ms
    return cast(func.extract("epoch", Request.started_at), Float) * 1000.0 + Request.e2e_ms


def _spans(c, engine: Engine, filters: Filters, *extra) -> dict[int, float]:
    """Per run in view: seconds from its first request's start to its last one's end (start + e2e), over its
    requests in view (any status, or those the `extra` conditions keep) that have an e2e time (`_span_bounds`)."""
    return {run_id: (last - first).total_seconds()
            for run_id, (first, last) in _span_bounds(c, engine, filters, *extra).items()}


def span_bounds(engine: Engine, filters: Filters) -> dict[int, tuple[datetime, datetime]]:
    """Per run in view: its requests' first start and last end (start + e2e), UTC (`_span_bounds`). Inside
    `reuse_collections`, the ones the run summaries' wall times were read from (`_collect`), not read again."""
    return _reused(_read_span_bounds, engine, filters)


def _read_span_bounds(engine: Engine, filters: Filters) -> dict[int, tuple[datetime, datetime]]:
    with engine.connect() as c:
        return _utc_bounds(_span_bounds(c, engine, filters))


def _utc_bounds(bounds: dict[int, tuple[datetime, datetime]]) -> dict[int, tuple[datetime, datetime]]:
    return {run_id: (as_utc(first, "first start"), as_utc(last, "last end")) for run_id, (first, last) in bounds.items()}


def longest_e2e_ms(engine: Engine, run_ids: Sequence[int], *, before: datetime) -> float | None:
    """The longest e2e time of the runs' requests that started before `before` (any status, any other filter);
    None where none has one. How far back a request may have started and still ended after `before`."""
    if not run_ids:
        return None
    with engine.connect() as c:
        return c.scalar(select(func.max(Request.e2e_ms)).where(
            Request.run_id.in_(list(run_ids)), Request.started_at < before, Request.e2e_ms.is_not(None)))


def _span_bounds(c, engine: Engine, filters: Filters, *extra) -> dict[int, tuple[datetime, datetime]]:
    """Per run in view: its first request's start and its last one's end (start + e2e), over its requests in view
    (any status, or those the `extra` conditions keep) that have an e2e time. Exactly Python's datetime arithmetic
    (the e2e as a timedelta, rounded to the microsecond), which SQL's own does not reproduce: the store finds each
    run's first start and the requests that may end last (within END_SLACK_MS of its latest end as SQL reckons
    it: usually one), and only those come back to decide the end."""
    end = _end_ms(engine)
    timed = (*filters.where(), *extra, Request.e2e_ms.is_not(None))
    per_run = (
        select(Request.run_id, func.min(Request.started_at).label("first"), func.max(end).label("last_ms"))
        .join(Run, Request.run_id == Run.id).where(*timed).group_by(Request.run_id)
        .subquery()
    )
    q = (
        select(Request.run_id, per_run.c.first, Request.started_at, Request.e2e_ms)
        .join(Run, Request.run_id == Run.id).join(per_run, per_run.c.run_id == Request.run_id)
        .where(*timed, end >= per_run.c.last_ms - END_SLACK_MS)
    )
    first: dict[int, datetime] = {}
    last: dict[int, datetime] = {}
    for run_id, first_start, started, e2e in c.execute(q):
        end_at = started + timedelta(milliseconds=e2e)
        first[run_id] = first_start
        last[run_id] = max(end_at, last.get(run_id, end_at))
    return {run_id: (start, last[run_id]) for run_id, start in first.items()}


def failed_span_s(engine: Engine, filters: Filters | None, run_ids: Sequence[int]) -> dict[int, tuple[float, float]]:
    """Per run of `run_ids` with output tokens and a request in view that did not finish ok (error, cancelled) and
    has an end: (seconds from its first request's start to its last one's end, the same over its ok requests alone;
    0 where it has none). A run's wall time counts every request, the node was paid while they ran: where a failed
    one (a timeout) starts first or ends last, it stretches the span, and the tokens/s over it falls. Their
    difference is how much of the span the failed requests add; one in the middle adds nothing. Both spans are
    SQL's (`_spans`, the second over the ok requests): no request is read into Python.

    A run without output tokens (only failed requests) is left out: it adds no wall time to a pooled figure
    (`_pool`), so its failures stretch nothing. Under a domain or prompt filter: {} (nothing said), since the wall
    time there is the selected requests' share of the run's (`_shared_spans`), which a difference of spans would
    overstate."""
    filters = filters or Filters()
    if not run_ids or filters.domain is not None or filters.prompt_ids is not None:
        return {}
    conds = (*filters.where(), Request.run_id.in_(list(run_ids)))
    ok = Request.status == "ok"
    failed = func.sum(case((and_(~ok, Request.e2e_ms.is_not(None)), 1), else_=0))
    tokens = func.sum(case((ok, Request.output_tokens), else_=0))
    q = (select(Request.run_id).join(Run, Request.run_id == Run.id).where(*conds).group_by(Request.run_id)
         .having(failed > 0, tokens > 0))
    with read_snapshot(engine) as c:
        ids = [row[0] for row in c.execute(q)]
        if not ids:
            return {}
        every = _spans(c, engine, filters, Request.run_id.in_(ids))
        ok_only = _spans(c, engine, filters, Request.run_id.in_(ids), ok)
    return {run_id: (every[run_id], ok_only.get(run_id, 0.0)) for run_id in ids if run_id in every}


def serve_node_shares(engine: Engine, filters: Filters, runs: Sequence[RunSummary]) -> dict[int, float]:
    """Per server run in `runs` that shared its node with another server run: the fraction of its own span (first
    request start to last end, in the time window) that is its share of the node's time. `specfinops serve` keeps
    one run per mode open on one node for its lifetime, the two modes' requests interleaved: each run priced over
    its own span would charge the node's time twice. The server runs of a node whose spans overlap (a cluster)
    share the cluster's span: while n requests are in flight, k of them a run's, k / n of each second is that run's
    (time where only one run has requests goes to it); the time inside the span with none in flight (a gap between
    requests, priced to a lone server run too) goes to the runs whose own span covers it, by the time each was
    busy, so the runs' shares add up to the node's span, as `_Share` shares a run's span among its domains, and
    no run is priced past its own span. A run's priced time is its wall seconds
    times this fraction (under a domain filter, the domain's part of the run's share). Runs absent: 1 (no other
    server run overlapped it on its node). The other runs count whatever the filters keep besides the time
    window (the other mode's run under --mode spec too): the node's time is what is shared. One GROUP BY finds the
    spans; only the requests of runs that overlap another on their node are read (their times, no tokens)."""
    nodes = {r.node_id for r in runs if r.kind == "serve" and r.node_id is not None}
    if not nodes:
        return {}
    window = Filters(since=filters.since, until=filters.until)
    timed = (*window.where(), Run.kind == "serve", Run.node_id.in_(nodes), Request.e2e_ms.is_not(None))
    end = _end_ms(engine)
    spans_q = (select(Request.run_id, Run.node_id, func.min(end - Request.e2e_ms), func.max(end))
               .join(Run, Request.run_id == Run.id).where(*timed).group_by(Request.run_id, Run.node_id))
    in_view = {r.run_id for r in runs}
    with read_snapshot(engine) as c:
        by_node: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
        for run_id, node, first_ms, last_ms in c.execute(spans_q):
            by_node[node].append((first_ms, last_ms, run_id))
        shared: set[int] = set()
        for found in by_node.values():  # clusters of runs whose spans overlap (SQL's ends: a few ms off is fine)
            found.sort()
            cluster: list[int] = []
            cluster_end = None
            for first_ms, last_ms, run_id in found:
                if cluster and first_ms <= cluster_end + END_SLACK_MS:
                    cluster.append(run_id)
                    cluster_end = max(cluster_end, last_ms)
                    continue
                if len(cluster) > 1 and in_view.intersection(cluster):
                    shared.update(cluster)
                cluster, cluster_end = [run_id], last_ms
            if len(cluster) > 1 and in_view.intersection(cluster):
                shared.update(cluster)
        if not shared:
            return {}
        q = (select(Request.run_id, Run.node_id, Request.started_at, Request.e2e_ms)
             .join(Run, Request.run_id == Run.id).where(*timed, Run.id.in_(shared)))
        requests: dict[str, list[tuple[datetime, datetime, int]]] = defaultdict(list)
        for run_id, node, started, e2e in c.execute(q):
            requests[node].append((started, started + timedelta(milliseconds=e2e), run_id))
    out: dict[int, float] = {}
    for reqs in requests.values():
        out.update(_node_fractions(reqs))
    return {run_id: f for run_id, f in out.items() if run_id in in_view}


def _node_fractions(reqs: list[tuple[datetime, datetime, int]]) -> dict[int, float]:
    """`serve_node_shares` for one node's requests (start, end, run): the runs' spans merged into clusters where
    they overlap; in a cluster of two or more runs, each run's share of the cluster's span over its own span.
    While requests are in flight a run takes k / n of each second; a gap with none in flight goes to the runs whose
    own span covers it, by the time each was busy, so no run is priced past its own span (a run that served one
    hour of a ten-hour cluster was charged for most of the nine idle hours after it ended)."""
    by_run: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    for s, e, run_id in reqs:
        by_run[run_id].append((s, e))
    spans = {r: (min(s for s, _ in iv), max(e for _, e in iv)) for r, iv in by_run.items()}
    out: dict[int, float] = {}
    clusters: list[list[int]] = []
    cluster_end = None
    for run_id, (lo, hi) in sorted(spans.items(), key=lambda kv: kv[1]):
        if clusters and lo <= cluster_end:
            clusters[-1].append(run_id)
            cluster_end = max(cluster_end, hi)
        else:
            clusters.append([run_id])
            cluster_end = hi
    for members in clusters:
        if len(members) < 2:
            continue
        # in flight: k / n of each second (processor sharing, as `_Share`); the gaps: the holes in the union
        busy = {r: _shared_s(by_run[r], [iv for o in members if o != r for iv in by_run[o]]) for r in members}
        merged = _merged([iv for r in members for iv in by_run[r]])
        gaps = [(end, start) for (_, end), (start, _) in pairwise(merged)]
        priced = dict(busy)
        for lo, hi in gaps:  # no span boundary lies inside a gap (each is a request's start or end)
            covering = [r for r in members if spans[r][0] <= lo and spans[r][1] >= hi]
            weight = sum(busy[r] for r in covering)
            dt = (hi - lo).total_seconds()
            for r in covering:
                priced[r] += dt * (busy[r] / weight if weight > 0 else 1 / len(covering))
        for r in members:
            own = (spans[r][1] - spans[r][0]).total_seconds()
            if own > 0:
                out[r] = min(priced[r] / own, 1.0)  # (rounding only: priced time lies inside the run's span)
    return out


@dataclass(slots=True)
class _Share:
    """The requests of one run that a filter keeps (a domain, prompt ids), collected in Python for their wall time:
    their share of the time the run was serving (`_shared_s`): while n requests are in flight, k of them kept,
    k / n of that time. The span of the kept requests would count the time the run spent on the requests filtered
    out, and so would the time the kept ones were in flight where the run served others beside them (at
    concurrency 8, a domain with a quarter of the tokens was in flight nearly all the time, and its tokens/s read a
    quarter of the run's). Under a domain filter (`share_idle`) the run's idle time inside its span (between
    requests) is shared in the same proportion, so the shares of a run's domains add up to the span it is priced
    on; a restriction to some prompts (speedups over the prompts both modes ran) keeps the time they were served.
    `others` are the run's requests filtered out (None or empty: none was; under a domain filter the span is then
    the run's own, under a restriction to prompts still the time they were served, as for the other mode's run).
    Unfiltered runs and time windows need none of this: their span comes from SQL (`_spans`)."""

    first_start: datetime | None = None
    last_end: datetime | None = None
    intervals: list[tuple[datetime, datetime]] = field(default_factory=list)
    others: list[tuple[datetime, datetime]] | None = None
    share_idle: bool = False  # a domain filter: the run's idle time is shared too (see above)

    def add(self, started: datetime, e2e: float | None) -> None:
        """A request the filter keeps (one without an e2e time takes no time)."""
        if e2e is not None:
            end = started + timedelta(milliseconds=e2e)
            self.first_start = started if self.first_start is None else min(self.first_start, started)
            self.last_end = end if self.last_end is None else max(self.last_end, end)
            self.intervals.append((started, end))

    def add_other(self, started: datetime, e2e: float | None) -> None:
        """A request of the run that the filter leaves out: it shares the run's time with the kept ones."""
        if e2e is not None:
            if self.others is None:
                self.others = []
            self.others.append((started, started + timedelta(milliseconds=e2e)))

    def span_s(self) -> float | None:
        if self.first_start is None or self.last_end is None:
            return None
        if not self.share_idle:  # the time these requests were being served: a restriction to some prompts, on
            # one basis whether or not the run served others (its own span would add its idle gaps, which the
            # run of the other mode, restricted to the same prompts, does not count: 0.67x for equal speeds)
            return _shared_s(self.intervals, self.others or [])
        if not self.others:  # the filter left none of the run's requests out: the run's own span
            return (self.last_end - self.first_start).total_seconds()
        shared = _shared_s(self.intervals, self.others)
        # a domain: the run's span (its requests in view, the others included), shared: its busy time by who
        # was in flight, its idle time in the same proportion, so the domains add up to the run's span
        every = self.intervals + self.others
        busy = _union_s(every)
        span = (max(e for _, e in every) - min(s for s, _ in every)).total_seconds()
        return shared * (span / busy) if busy > 0 else None


def _shared_s(mine: list[tuple[datetime, datetime]], others: list[tuple[datetime, datetime]]) -> float:
    """Seconds of the run's serving time that belong to the requests `mine`: while n requests are in flight, k of
    them mine, k / n of each second (processor sharing). Over a run's requests the shares add up to the union of
    all their intervals; with no `others` it is the union of `mine`."""
    events = sorted([(s, 1, 1) for s, _ in mine] + [(e, -1, -1) for _, e in mine]
                    + [(s, 1, 0) for s, _ in others] + [(e, -1, 0) for _, e in others])  # fmt: skip
    total, n, k, prev = 0.0, 0, 0, None
    for t, dn, dk in events:
        if n > 0:
            total += (t - prev).total_seconds() * k / n
        n, k, prev = n + dn, k + dk, t
    return total


def _merged(intervals: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    """The union of the intervals as disjoint intervals, in order (touching ones merged)."""
    out: list[tuple[datetime, datetime]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _union_s(intervals: list[tuple[datetime, datetime]]) -> float:
    """Seconds covered by at least one of the intervals."""
    return sum((end - start).total_seconds() for start, end in _merged(intervals))


def _aggregate(sums: dict, latency: dict[str, float], wall_s: float | None, estimated: bool) -> Aggregate:
    """The figures from a run's or group's `sums` (_SUM_KEYS), `latency` (`_latency`; {}: none read) and wall
    seconds."""
    n_ok, tokens = int(sums["n_ok"] or 0), int(sums["tokens"] or 0)
    drafts, drafted, accepted = (int(sums[k] or 0) for k in ("drafts", "drafted", "accepted"))
    n_energy = int(sums["n_energy"] or 0)
    energy = float(sums["energy_j"]) if n_energy else None
    return Aggregate(
        num_requests_ok=n_ok,
        num_requests_failed=int(sums["n_failed"] or 0),
        num_requests_cancelled=int(sums["n_cancelled"] or 0),
        output_tokens=tokens,
        wall_s=wall_s,
        tokens_per_s=_ratio(tokens, wall_s) if tokens else None,
        num_drafts=drafts,
        num_draft_tokens=drafted,
        num_accepted_tokens=accepted,
        acceptance_rate=_ratio(accepted, drafted),
        mean_acceptance_length=_acceptance_length(drafts, accepted),
        ttft_p50_ms=latency.get("ttft_p50_ms"),
        ttft_p95_ms=latency.get("ttft_p95_ms"),
        tpot_p50_ms=latency.get("tpot_p50_ms"),
        tpot_p95_ms=latency.get("tpot_p95_ms"),
        energy_j=energy,
        energy_complete=n_ok > 0 and n_energy == n_ok,
        j_per_token=_ratio(energy, int(sums["energy_tokens"] or 0)),
        energy_estimated=estimated,
    )


_SUM_KEYS = (
    "n_ok",
    "n_failed",
    "n_cancelled",
    "tokens",
    "drafts",
    "drafted",
    "accepted",
    "energy_j",
    "n_energy",
    "energy_tokens",
)


def _sum_columns() -> list:
    ok = Request.status == "ok"

    def ok_sum(col):
        return func.sum(case((ok, col), else_=0))

    return [
        func.sum(case((ok, 1), else_=0)).label("n_ok"),
        func.sum(case((ok, 0), else_=1)).label("n_failed"),
        func.sum(case((Request.status == "cancelled", 1), else_=0)).label("n_cancelled"),
        ok_sum(Request.output_tokens).label("tokens"),
        ok_sum(Request.num_drafts).label("drafts"),
        ok_sum(Request.num_draft_tokens).label("drafted"),
        ok_sum(Request.num_accepted_tokens).label("accepted"),
        func.sum(case((ok, Request.energy_j), else_=None)).label("energy_j"),
        func.count(case((ok, Request.energy_j), else_=None)).label("n_energy"),
        func.sum(case((ok & Request.energy_j.is_not(None), Request.output_tokens), else_=0)).label(
            "energy_tokens"
        ),
    ]


_COLLECTED: ContextVar[dict | None] = ContextVar("specfinops_collected", default=None)


@contextmanager
def reuse_collections() -> Iterator[None]:
    """Within the block, the run, mode, configuration and speedup summaries of one store and filter read
    the store once per kind of figure (the per-run sums and wall times; the percentiles per run, per mode, per
    configuration). A dashboard page or a report asks for several of them over the same filter; each used to
    read every request again (four passes for the Overview). Use it around one unit of work (a page render, a
    command), not around a long-lived process: what is read inside is not refreshed."""
    if _COLLECTED.get() is not None:  # already inside one: share it
        yield
        return
    token = _COLLECTED.set({})
    try:
        yield
    finally:
        _COLLECTED.reset(token)


def _reused(read: Callable, engine: Engine, filters: Filters, *args):
    """read(engine, filters, *args); inside `reuse_collections`, a second call with the same arguments returns
    the first one's result (callers only read it)."""
    memo = _COLLECTED.get()
    if memo is None:
        return read(engine, filters, *args)
    key = (read, id(engine), filters, args)
    if key not in memo:
        memo[key] = (engine, read(engine, filters, *args))  # the engine is kept so its id is not reused
    return memo[key][1]


def _remember(read: Callable, engine: Engine, filters: Filters, value, *args) -> None:
    """Inside `reuse_collections`: `value` is what read(engine, filters, *args) returns (`_reused`)."""
    memo = _COLLECTED.get()
    if memo is not None:
        memo.setdefault((read, id(engine), filters, args), (engine, value))


def _collect(engine: Engine, filters: Filters) -> list[tuple[Run, dict, float | None]]:
    """Per run in view, oldest first: the run, its sums (one GROUP BY query) and its wall seconds. A run's wall
    time is its requests' span in SQL (`_span_bounds`), except under a domain or prompt filter: then it is the selected
    requests' share of its serving time (`_shared_spans`). The latency values are read apart (`_latency_values`):
    not every caller needs them."""
    sums_q = (
        select(Run.id, *_sum_columns()).join(Request, Request.run_id == Run.id).where(*filters.where())
        .group_by(Run.id)
    )
    shared = filters.domain is not None or filters.prompt_ids is not None
    with read_snapshot(engine) as c:  # totals, spans and statuses of one moment (`read_snapshot`)
        sums = {row.id: dict(row._mapping) for row in c.execute(sums_q)}
        if not sums:
            return []
        if shared:
            spans = _shared_spans(c, filters, list(sums))
        else:
            bounds = _span_bounds(c, engine, filters)
            spans = {run_id: (last - first).total_seconds() for run_id, (first, last) in bounds.items()}
            _remember(_read_span_bounds, engine, filters, _utc_bounds(bounds))  # span_bounds: read once
        with Session(bind=c) as s:
            run_rows = list(s.scalars(select(Run).where(Run.id.in_(sums)).order_by(Run.started_at, Run.id)))
            s.expunge_all()
    narrowed = shared or filters.since is not None or filters.until is not None
    return [(r, sums[r.id], _run_wall_s(r, spans.get(r.id), narrowed)) for r in run_rows]


def _shared_spans(c, filters: Filters, run_ids: list[int]) -> dict[int, float | None]:
    """Under a domain or prompt filter: per run in view, the selected requests' share of its serving time
    (`_Share`), from the times of all its requests in the same time window, the ones the filter leaves out
    included. Read into Python: the sharing walks each run's requests in time order."""
    everyone = replace(filters, domain=None, prompt_ids=None)
    prompts = set(filters.prompt_ids) if filters.prompt_ids is not None else None
    q = (select(Request.run_id, Request.domain, Request.external_id, Request.started_at, Request.e2e_ms)
         .join(Run, Request.run_id == Run.id).where(*everyone.where(), Run.id.in_(run_ids), Request.e2e_ms.is_not(None)))
    shares: dict[int, _Share] = defaultdict(lambda: _Share(share_idle=filters.domain is not None))
    for run_id, domain, prompt_id, started, e2e in c.execute(q):
        kept = ((filters.domain is None or domain == filters.domain)
                and (prompts is None or prompt_id in prompts))  # fmt: skip
        if kept:
            shares[run_id].add(started, e2e)
        else:
            shares[run_id].add_other(started, e2e)
    return {run_id: share.span_s() for run_id, share in shares.items()}


def _run_wall_s(run: Run, span: float | None, narrowed: bool) -> float | None:
    """The run's wall seconds: its requests' `span` where known and positive; else, unless a filter narrows the
    run to some of its requests (`narrowed`: a domain, prompts, a time window), its own start to end."""
    if span is not None and span > 0:
        return span
    if narrowed:
        return None  # the run's own start and end would count its other requests' time, or other periods
    if run.ended_at is not None and run.started_at is not None:
        wall = (run.ended_at - run.started_at).total_seconds()
        return wall if wall > 0 else None
    return None


def run_exists(engine: Engine, run_id: int) -> bool:
    with Session(engine) as session:
        return session.get(Run, run_id) is not None


def _estimated(run: Run, sums: dict) -> bool:
    """Whether the run puts estimated energy into a figure: its power source is the estimate and some request of it
    has energy (a run whose requests have none adds nothing, so it makes no pooled figure an estimate)."""
    return run.power_source == "estimate" and bool(sums["n_energy"])


def run_summaries(engine: Engine, filters: Filters | None = None, *, latency: bool = True) -> list[RunSummary]:
    """One summary per run with at least one request matching `filters`, oldest first. With `latency=False`
    the TTFT and TPOT percentiles are None: they put every request's values in order, a cost a caller that reads
    only counts and wall times (`costs`, `speedups`) need not pay."""
    filters = filters or Filters()
    items = _reused(_collect, engine, filters)
    values = _reused(_latency_values, engine, filters) if items and latency else {}
    out = []
    for run, sums, wall_s in items:
        stats = _aggregate(sums, _latency(*values.get(run.id, ((), ()))) if latency else {}, wall_s,
                           _estimated(run, sums))
        out.append(
            RunSummary(
                run_id=run.id,
                mode=run.mode,
                kind=run.kind,
                node_id=run.node_id,
                device=run.device,
                backend=run.backend,
                target=run.target,
                drafter=run.drafter,
                k_policy=run.k_policy,
                dtype=run.dtype,
                workload=run.workload,
                concurrency=run.concurrency,
                temperature=run.temperature,
                power_source=run.power_source,
                price_snapshot=run.price_snapshot,
                started_at=run.started_at,
                ended_at=run.ended_at,
                status=shown_status(run.status, run.pid, run.process_key, run.started_at),  # 'stale': its process is gone
                stats=stats,
                top_p=run.top_p,
                top_k=run.top_k,
                seed=run.seed,
                max_new_tokens=run.max_new_tokens,
                invocation_id=run.invocation_id,
            )
        )
    return out


def _pool(items: list[tuple[Run, dict, float | None]], values: dict[int, tuple[array, array]]) -> Aggregate:
    """Several runs' figures as one: counts summed, wall seconds summed over the runs that produced tokens
    (each run's own span, so the gaps between them are not counted), percentiles over all of their requests
    (`values`: `_latency_values`). A run without output tokens (a turn stopped before its first token) adds no
    wall time, as it adds none to the mode's cost per 1M tokens (`costing`) or to a speedup (`speedups`): one
    pooled tokens/s for the capacity, the cost and the speedup of the same runs."""
    sums = {k: sum((s[k] or 0) for _, s, _ in items) for k in _SUM_KEYS}
    timed = [(s, w) for _, s, w in items if s["tokens"]] or [(s, w) for _, s, w in items]  # none with tokens: all
    known = [w for _, w in timed if w is not None]
    ttft, tpot = array("d"), array("d")
    for run, _, _ in items:
        mine = values.get(run.id, ((), ()))
        ttft.extend(mine[0])
        tpot.extend(mine[1])
    latency = _latency(ttft, tpot)
    return _aggregate(sums, latency, sum(known) if known else None, any(_estimated(r, s) for r, s, _ in items))


def _pooled(engine: Engine, filters: Filters | None,
            fields: tuple[str, ...]) -> dict[tuple, tuple[list[Run], Aggregate]]:
    """The runs in view grouped by `key_of(run, fields)`, each group in the order it was first measured: its runs
    (oldest first) and their figures pooled (`_pool`), the percentiles over all the group's requests."""
    filters = filters or Filters()
    groups: dict[tuple, list[tuple[Run, dict, float | None]]] = defaultdict(list)
    for item in _reused(_collect, engine, filters):
        groups[key_of(item[0], fields)].append(item)
    values = _reused(_latency_values, engine, filters) if groups else {}
    return {key: ([r for r, _, _ in items], _pool(items, values)) for key, items in groups.items()}


def mode_summaries(engine: Engine, filters: Filters | None = None) -> list[ModeSummary]:
    """The run figures pooled per mode: counts summed, wall seconds summed over runs, percentiles over all
    the mode's requests. Spec first, then AR; a mode without runs is absent."""
    pooled = _pooled(engine, filters, ("mode",))
    out = []
    for mode in MODES:
        if (mode,) in pooled:
            runs, stats = pooled[(mode,)]
            out.append(ModeSummary(mode=mode, num_runs=len(runs), run_ids=tuple(r.id for r in runs),
                                   devices=tuple(sorted({r.device for r in runs})), stats=stats))
    return out


CONFIG_FIELDS = ("mode", "workload", "target", "device", "backend", "dtype", "concurrency", "temperature",
                 "drafter", "k_policy", "kind", "top_p", "top_k", "max_new_tokens")
# What spec and AR must share to be compared (ConfigSummary fields): the same traffic (workload), sampling
# (temperature: at 0 verification is greedy, at 0.8 a draft is accepted far less; top_p and top_k cut the
# distribution a draft must match, so acceptance and speedup change with them too), answer length cap
# (max_new_tokens: per-token latency grows with the sequence and acceptance rises along an answer, so runs capped
# at 64 and at 256 new tokens are two measurements), measurement (run kind: a bench times the engine, a load test its HTTP clients), model and hardware.
# Concurrency, drafter and K policy are what a projection chooses between (each mode's fastest configuration
# meeting the SLA) and a sweep varies. Read both by name (dict(zip(...))), never by position. A sampling figure
# recorded as None (runs before migration 0008, a server's runs) groups with None only.
COMPARED_FIELDS = ("workload", "temperature", "kind", "target", "device", "backend", "dtype", "top_p", "top_k",
                   "max_new_tokens")


def effective_cutoffs(temperature: float | None, top_p: float | None, top_k: int | None) -> tuple:
    """(top_p, top_k) as they act on decoding: at temperature 0 every token is the target's argmax, so no
    cut-off changes one and they compare as off (1.0, 0), whatever was recorded (a greedy run recorded before
    top_k was, NULL, is the same measurement as one recorded with top_k 0)."""
    if temperature == 0:
        return 1.0, 0
    return top_p, top_k


def key_of(item, fields: tuple[str, ...]) -> tuple:
    """`item`'s values of `fields` (CONFIG_FIELDS, COMPARED_FIELDS) as a grouping key, top_p and top_k as they
    act on decoding (`effective_cutoffs`)."""
    values = {f: getattr(item, f) for f in fields}
    if "temperature" in values:
        top_p, top_k = effective_cutoffs(values["temperature"], item.top_p, item.top_k)
        values.update({k: v for k, v in (("top_p", top_p), ("top_k", top_k)) if k in values})
    return tuple(values[f] for f in fields)


def varying_fields(groups: list[dict]) -> list[str]:
    """The COMPARED_FIELDS in which `groups` (field -> value) differ; top_p and top_k compared among the sampled
    groups only (at temperature 0 they change nothing, `effective_cutoffs`); the answer length cap among all
    (a greedy answer's length changes its per-token latency too)."""
    def matters(group: dict, field: str) -> bool:
        return field not in ("top_p", "top_k") or group["temperature"] != 0

    return [f for f in COMPARED_FIELDS if len({g[f] for g in groups if matters(g, f)}) > 1]


@dataclass(frozen=True, slots=True)
class ConfigSummary:
    """One measured configuration: the runs that share every field of CONFIG_FIELDS, pooled as one
    measurement. A `bench --mode both` that alternates the modes in turns records each turn as a run; the
    turns of one configuration are one measurement of it, and so are repeated runs of the same command."""

    mode: str
    workload: str
    target: str
    device: str
    backend: str
    dtype: str
    concurrency: int
    temperature: float | None  # None: server runs (each request chose its own)
    drafter: str | None
    k_policy: str
    kind: str  # bench | serve | loadtest: a load test's client-side times are not a bench's engine times
    top_p: float | None  # None: unknown (runs recorded before it was, server runs)
    top_k: int | None  # 0 = off; None: unknown
    max_new_tokens: int | None  # the answer length cap; None: unknown (runs recorded before it was, server runs)
    run_ids: tuple[int, ...]
    stats: Aggregate


def config_summaries(engine: Engine, filters: Filters | None = None) -> list[ConfigSummary]:
    """The runs in view pooled per configuration (CONFIG_FIELDS), in the order each configuration was
    first measured. Capacity at an SLA is read from these, not from single runs: the fastest of a
    configuration's short turns is its luckiest slice, not its throughput."""
    return [
        ConfigSummary(**dict(zip(CONFIG_FIELDS, key, strict=True)), run_ids=tuple(r.id for r in runs), stats=stats)
        for key, (runs, stats) in _pooled(engine, filters, CONFIG_FIELDS).items()
    ]


def step_rejected(steps=Step.__table__.c):
    """SQL: the step ended in a rejection: it accepted fewer than it drafted and a correction token followed.
    A step cut by an EOS or a stop string inside its accepted drafts emitted no more than it accepted: no
    rejection (telemetry.calibration.alpha_k)."""
    return and_(steps.accepted < steps.k, steps.num_emitted > steps.accepted)


def synthetic_runs(engine: Engine, filters: Filters | None = None) -> int:
    """How many runs with requests in view the synthetic data generator made (workload SYNTHETIC_WORKLOAD or host
    SYNTHETIC_HOSTNAME): their figures are not measurements."""
    f = filters or Filters()
    q = (select(func.count(func.distinct(Run.id))).join(Request, Request.run_id == Run.id)
         .where(*f.where(), or_(Run.workload == SYNTHETIC_WORKLOAD, Run.hostname == SYNTHETIC_HOSTNAME)))  # fmt: skip
    with engine.connect() as c:
        return int(c.execute(q).scalar() or 0)


def acceptance_by_domain(engine: Engine, filters: Filters | None = None) -> list[DomainAcceptance]:
    """Acceptance per request domain over the ok requests of speculative runs, sorted by domain: the
    acceptance rate from the requests' counts, alpha (accepted / tested) from their steps."""
    where = (Run.mode == "spec", Request.status == "ok", *(filters or Filters()).where())
    q = (
        select(
            Request.domain,
            func.count(Request.id),
            func.sum(Request.num_drafts),
            func.sum(Request.num_draft_tokens),
            func.sum(Request.num_accepted_tokens),
        )
        .join(Run, Request.run_id == Run.id)
        .where(*where)
        .group_by(Request.domain)
        .order_by(Request.domain)
    )
    tested_q = (
        select(Request.domain, func.sum(Step.accepted), func.sum(case((step_rejected(), 1), else_=0)))
        .select_from(Step)
        .join(Request, Request.id == Step.request_id)
        .join(Run, Run.id == Request.run_id)
        .where(*where, Step.k > 0)
        .group_by(Request.domain)
    )
    with engine.connect() as c:
        rows = c.execute(q).all()
        tested = {d: (int(acc or 0), int(acc or 0) + int(rej or 0)) for d, acc, rej in c.execute(tested_q)}
    out = []
    for domain, n, drafts, drafted, accepted in rows:
        # None: no request of the domain knows its counts (a load test against a server that sends none)
        drafts, drafted, accepted = (None if v is None else int(v) for v in (drafts, drafted, accepted))
        step_accepted, n_tested = tested.get(domain, (None, None))
        out.append(
            DomainAcceptance(
                domain=domain,
                num_requests=int(n),
                num_drafts=drafts,
                num_draft_tokens=drafted,
                num_accepted_tokens=accepted,
                acceptance_rate=_ratio(accepted, drafted),
                mean_acceptance_length=_acceptance_length(drafts, accepted),
                num_tested_tokens=n_tested,
                alpha=_ratio(step_accepted, n_tested),
            )
        )
    return out


def _prompt_ids(engine: Engine, filters: Filters | None) -> dict[int, set[str | None]]:
    """Per run in view (bench and load-test runs only: a server records API request ids, not prompt ids): the
    prompt ids (requests.external_id) of its ok requests; None among them where a request recorded none."""
    where = (*(filters or Filters()).where(), Request.status == "ok", Run.kind != "serve")
    q = select(Request.run_id, Request.external_id).join(Run, Request.run_id == Run.id).where(*where).distinct()
    out: dict[int, set[str | None]] = defaultdict(set)
    with engine.connect() as c:
        for run_id, prompt_id in c.execute(q):
            out[run_id].add(prompt_id)
    return out


class _SpeedupBase(NamedTuple):
    """What a spec configuration and its AR baseline share in `speedups`."""

    workload: str
    target: str
    device: str
    dtype: str
    concurrency: int
    temperature: float | None
    top_p: float | None
    top_k: int | None
    max_new_tokens: int | None
    kind: str


def speedups(engine: Engine, filters: Filters | None = None) -> list[Speedup]:
    """spec tokens/s / AR tokens/s per (workload, target, device, precision, concurrency, sampling, answer length
    cap, run kind) and spec configuration (drafter, k policy). Tokens/s of several runs = their tokens / their summed
    wall seconds. The precision is part of the key: on a CPU without bf16 instructions the same model decodes
    1.5x apart in bf16 and float32, so pooling them would price neither. So are the sampling: the temperature
    (greedy verification at 0 accepts far more than sampling at 0.8: 2.4x against 0.6x on one store, 1.0x
    pooled), top_p and top_k (they cut the distribution the draft must match; None, unknown, only with None),
    the answer length cap (max_new_tokens: acceptance rises along an answer and per-token latency with its
    length; None, unknown, only with None) and the run kind (a load test's client-side HTTP times are not a bench's engine times).

    Prompts: where both modes' runs recorded prompt ids (bench, load test) and ran the same set, the speedup is
    over all their requests; where a load test's differ, over all their requests too (PROMPTS_LOADTEST: it
    measures throughput over a fixed time, not the same work); where a bench's differ, both modes are
    restricted to the prompts both ran (each
    run's wall time then is those requests' share of its serving time, as under a domain filter); where no
    prompt is shared, or the runs recorded none (a server's runs), it is over all requests and `prompts` says
    the prompts were not matched.

    Paired figures (`invocation_speedups`): the same ratio within each command invocation that recorded both
    the spec configuration and its AR baseline (runs.invocation_id), with the same prompt rule within it. One
    `bench --mode both` interleaves the modes so both see the same machine conditions; the pooled figure also
    mixes invocations made under different ones (an AR-only bench on a loaded machine pooled with an idle
    one's spec runs read 2.36x where every paired invocation measured about 1.9x)."""
    filters = filters or Filters()
    runs = run_summaries(engine, filters, latency=False)
    totals: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
    drafts: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])  # drafts, accepted tokens (spec keys)
    ids: dict[tuple, list[int]] = defaultdict(list)
    runs_of: dict[tuple, list[RunSummary]] = defaultdict(list)
    first_start: dict[str, datetime] = {}  # invocation -> its first run's start (runs come oldest first)
    for r in runs:
        if r.invocation_id is not None:
            first_start.setdefault(r.invocation_id, r.started_at)
        if r.stats.wall_s is None or not r.stats.output_tokens:
            continue
        base = _SpeedupBase(r.workload, r.target, r.device, r.dtype, r.concurrency, r.temperature,
                            *effective_cutoffs(r.temperature, r.top_p, r.top_k), r.max_new_tokens, r.kind)
        key = (base, "spec", r.drafter, r.k_policy) if r.mode == "spec" else (base, "ar")
        totals[key][0] += r.stats.output_tokens
        totals[key][1] += r.stats.wall_s
        drafts[key][0] += r.stats.num_drafts
        drafts[key][1] += r.stats.num_accepted_tokens
        ids[key].append(r.run_id)
        runs_of[key].append(r)

    def order(k: tuple) -> tuple:  # numbers by number (1, 2, 16, not 1, 16, 2), None first; the rest by name
        b = k[0]
        return (str(b.workload), str(b.target), str(b.device), str(b.dtype), b.concurrency or 0,
                *(-1 if x is None else x for x in (b.temperature, b.top_p, b.top_k, b.max_new_tokens)), str(b.kind),
                *(str(x) for x in k[1:]))

    prompt_ids = _prompt_ids(engine, filters) if any(k[1] == "spec" for k in totals) else {}
    paired = _paired(engine, filters, runs_of, prompt_ids, first_start)
    out = []
    for key in sorted((k for k in totals if k[1] == "spec"), key=order):
        base = key[0]
        ar_key = (base, "ar")
        spec_ids, ar_ids = ids[key], ids.get(ar_key, [])
        spec_tps = _ratio(*totals[key])
        ar_tps = _ratio(*totals[ar_key]) if ar_key in totals else None
        mal = _acceptance_length(*drafts[key])
        prompts, n_prompts = _compare_prompts(prompt_ids, spec_ids, ar_ids, base.kind)
        if prompts.startswith(PROMPTS_MATCHED):  # both modes over the prompts both ran only
            common = set.intersection(*({p for i in side for p in prompt_ids[i]} for side in (spec_ids, ar_ids)))
            sub = replace(filters, run_ids=tuple(spec_ids + ar_ids), prompt_ids=tuple(common))
            part: dict[str, list[float]] = {"spec": [0.0, 0.0], "ar": [0.0, 0.0]}
            spec_drafts = [0, 0]  # the spec runs' drafts and accepted tokens over those prompts
            for r in run_summaries(engine, sub, latency=False):
                if r.stats.wall_s is not None and r.stats.output_tokens:
                    part[r.mode][0] += r.stats.output_tokens
                    part[r.mode][1] += r.stats.wall_s
                    if r.mode == "spec":
                        spec_drafts[0] += r.stats.num_drafts
                        spec_drafts[1] += r.stats.num_accepted_tokens
            spec_tps, ar_tps = _ratio(*part["spec"]), _ratio(*part["ar"])
            mal = _acceptance_length(*spec_drafts)
        out.append(
            Speedup(
                workload=base.workload,
                target=base.target,
                device=base.device,
                dtype=base.dtype,
                concurrency=base.concurrency,
                drafter=key[2],
                k_policy=key[3],
                spec_tokens_per_s=spec_tps,
                ar_tokens_per_s=ar_tps,
                speedup=_ratio(spec_tps, ar_tps),
                spec_run_ids=tuple(spec_ids),
                ar_run_ids=tuple(ar_ids),
                temperature=base.temperature,
                kind=base.kind,
                prompts=prompts,
                num_prompts=n_prompts,
                top_p=base.top_p,
                top_k=base.top_k,
                max_new_tokens=base.max_new_tokens,
                invocation_speedups=tuple(x for _, x, _ in paired.get(key, ())),
                invocation_ids=tuple(i for i, _, _ in paired.get(key, ())),
                mean_acceptance_length=mal,
                invocation_acceptance_lengths=tuple(m for _, _, m in paired.get(key, ())),
            )
        )
    return out


def _acceptance_length(drafts: int | None, accepted: int | None) -> float | None:
    """1 + accepted / drafts (the bonus token included); None where nothing was drafted."""
    return 1 + accepted / drafts if drafts else None


def _paired(engine: Engine, filters: Filters, runs_of: dict[tuple, list[RunSummary]],
            prompt_ids: dict[int, set[str | None]],
            first_start: dict[str, datetime]) -> dict[tuple, list[tuple[str, float, float | None]]]:
    """Per spec key of `speedups` (its runs in `runs_of`, the AR baseline's under (base, 'ar')): (invocation,
    spec tokens/s / AR tokens/s, its spec runs' mean acceptance length over the same requests) for each invocation
    that recorded runs of both, by its first run's start. From the run summaries already read; where an
    invocation's two modes ran different prompts, both are restricted to the prompts both ran, read for every such
    invocation with one SELECT (`_over_prompts`)."""
    def tps(parts: list[tuple[int, float | None, int, int]]) -> float | None:
        parts = [(n, w) for n, w, *_ in parts if w is not None and n]
        return _ratio(sum(n for n, _ in parts), sum(w for _, w in parts))

    def mal(parts: list[tuple[int, float | None, int, int]]) -> float | None:  # of the runs tps counts
        kept = [(d, a) for n, w, d, a in parts if w is not None and n]
        return _acceptance_length(sum(d for d, _ in kept), sum(a for _, a in kept))

    def whole(r: RunSummary) -> tuple[int, float | None, int, int]:
        return r.stats.output_tokens, r.stats.wall_s, r.stats.num_drafts, r.stats.num_accepted_tokens

    pairs: dict[tuple, list[tuple[str, list[RunSummary], list[RunSummary]]]] = {}
    restrict: dict[tuple[tuple, str], frozenset[str]] = {}  # (key, invocation) -> the prompts both modes ran
    for key, spec_runs in runs_of.items():
        if key[1] != "spec":
            continue
        sides: dict[str, tuple[list[RunSummary], list[RunSummary]]] = defaultdict(lambda: ([], []))
        for side, rs in enumerate((spec_runs, runs_of.get((key[0], "ar"), []))):
            for r in rs:
                if r.invocation_id is not None:
                    sides[r.invocation_id][side].append(r)
        both = sorted(((inv, sp, ar) for inv, (sp, ar) in sides.items() if sp and ar),
                      key=lambda p: (first_start[p[0]], p[0]))
        pairs[key] = both
        for inv, sp, ar in both:
            spec_ids, ar_ids = [r.run_id for r in sp], [r.run_id for r in ar]
            if _compare_prompts(prompt_ids, spec_ids, ar_ids, key[0].kind)[0].startswith(PROMPTS_MATCHED):
                restrict[(key, inv)] = frozenset.intersection(
                    *(frozenset(p for i in side for p in prompt_ids[i]) for side in (spec_ids, ar_ids)))
    wanted = {(r.run_id, restrict[(key, inv)]) for key, both in pairs.items() for inv, sp, ar in both
              if (key, inv) in restrict for r in (*sp, *ar)}
    over = _over_prompts(engine, filters, wanted) if wanted else {}
    out: dict[tuple, list[tuple[str, float, float | None]]] = {}
    for key, both in pairs.items():
        figures = []
        for inv, sp, ar in both:
            common = restrict.get((key, inv))
            spec_parts, ar_parts = ([whole(r) if common is None else over[(r.run_id, common)] for r in side]
                                    for side in (sp, ar))
            ratio = _ratio(tps(spec_parts), tps(ar_parts))
            if ratio is not None:
                figures.append((inv, ratio, mal(spec_parts)))
        out[key] = figures
    return out


def _over_prompts(engine: Engine, filters: Filters, wanted: set[tuple[int, frozenset[str]]]
                  ) -> dict[tuple[int, frozenset[str]], tuple[int, float | None, int, int]]:
    """Per (run id, prompt ids): the output tokens of the run's ok requests of those prompts, those requests'
    share of the run's serving time in seconds, and their drafts and accepted tokens, as `run_summaries` gives them
    under a prompt_ids filter, for many runs and prompt sets from one SELECT of the runs' requests."""
    sub = replace(filters, run_ids=tuple(sorted({run_id for run_id, _ in wanted})), prompt_ids=None)
    q = (select(Request.run_id, Request.external_id, Request.status, Request.started_at, Request.e2e_ms,
                Request.output_tokens, Request.num_drafts, Request.num_accepted_tokens)
         .join(Run, Request.run_id == Run.id).where(*sub.where()))
    rows: dict[int, list] = defaultdict(list)
    with engine.connect() as c:
        for row in c.execute(q):
            rows[row[0]].append(row)
    out = {}
    for run_id, prompts in wanted:
        share, tokens, drafts, accepted = _Share(), 0, 0, 0
        for _, prompt_id, status, started, e2e, n, d, a in rows[run_id]:
            if prompt_id in prompts:
                share.add(started, e2e)
                if status == "ok":
                    tokens, drafts, accepted = tokens + (n or 0), drafts + (d or 0), accepted + (a or 0)
            else:  # the run's other requests share its time (`_Share`)
                share.add_other(started, e2e)
        span = share.span_s()
        out[(run_id, prompts)] = (tokens, span if span is not None and span > 0 else None, drafts, accepted)
    return out


PROMPTS_SAME = "the same"  # "the same 4 prompts"
PROMPTS_MATCHED = "restricted to the"  # "restricted to the 4 prompts both modes ran (spec ran 2 more)"
PROMPTS_NONE_SHARED = "different prompts (none shared): not matched"
PROMPTS_UNKNOWN = "prompts not matched (the runs recorded no prompt ids)"
PROMPTS_SERVER = "prompts not matched (server runs record request ids, not prompt ids)"
PROMPTS_NO_AR = "no AR runs"
# a load test sends its prompts round-robin for a fixed time, so the faster mode gets further round the list:
# restricting both to the prompts both reached would drop the slower mode's long tail and misread throughput
PROMPTS_LOADTEST = "all requests (a load test's modes send the prompts round-robin for a fixed time: not matched)"


def _compare_prompts(prompt_ids: dict[int, set[str | None]], spec_ids: list[int], ar_ids: list[int],
                     kind: str) -> tuple[str, int | None]:
    """How the two modes' prompts compare, in words, and how many prompts the speedup is over (None: unknown)."""
    if not ar_ids:
        return PROMPTS_NO_AR, None
    if kind == "serve":
        return PROMPTS_SERVER, None
    spec = set().union(*(prompt_ids.get(i, {None}) for i in spec_ids))
    ar = set().union(*(prompt_ids.get(i, {None}) for i in ar_ids))
    if None in spec or None in ar:
        return PROMPTS_UNKNOWN, None
    if spec == ar:
        return f"{PROMPTS_SAME} {len(spec)} prompt{'s' if len(spec) != 1 else ''}", len(spec)
    if kind == "loadtest":
        return PROMPTS_LOADTEST, None
    common = spec & ar
    if not common:
        return PROMPTS_NONE_SHARED, None
    extra = [f"{mode} ran {len(side - common)} more" for mode, side in (("spec", spec), ("AR", ar)) if side - common]
    return (f"{PROMPTS_MATCHED} {len(common)} prompt{'s' if len(common) != 1 else ''} both modes ran "
            f"({', '.join(extra)}: left out)", len(common))
