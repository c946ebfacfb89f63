"""The dashboard on small and odd stores (AppTest): answers of one token (no TPOT anywhere), another
application's database, a report's estimated energy, a store of one mode, a failed run beside a good one, and
throughputs under 1 token/s."""

from __future__ import annotations

import sqlite3

import streamlit
from sqlalchemy.orm import Session
from synthetic import Req, make_run, spec_req
from test_dashboard_edge_stores import add_pair, app_for, assert_clean

from telemetry.store import open_store


def _open(url: str, monkeypatch, page: str):
    streamlit.cache_data.clear()
    streamlit.cache_resource.clear()
    return app_for(url, monkeypatch).run().switch_page(page).run()


def _missing_mode_hints(at) -> list[tuple[str, list]]:
    """The Overview's 'no speculative runs' line and the projection's caveat, each with the commands it suggests
    parsed by the CLI's own parser (a command it refuses fails the test: SystemExit)."""
    import shlex

    from app.cli import build_parser

    [info] = [i.value for i in at.info if i.value.startswith("No speculative runs in view")]
    [caveat] = [w.value for w in at.warning if w.value.startswith("Projection: based on")]
    hints = []
    for text in (info, caveat):
        commands = [c for c in text.split("`") if c.startswith("specfinops ")]
        assert commands, text
        hints.append((text, [build_parser().parse_args(shlex.split(c)[1:]) for c in commands]))
    return hints


def test_one_token_answers_leave_the_latency_page_its_ttft(sqlite_url, monkeypatch):
    """No request has a TPOT: the empty TPOT part turned the histogram's columns into objects and the whole
    Latency page into one error line ("loop of ufunc does not support argument 0 ... rint")."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(1, ttft_ms=120, e2e_ms=120), Req(1, ttft_ms=140, e2e_ms=140, start_s=1)])
        make_run(s, "spec", requests=[Req(1, ttft_ms=110, e2e_ms=110)])
        s.commit()
    at = _open(sqlite_url, monkeypatch, "views/latency.py")
    assert_clean(at)
    text = " ".join(str(e.value) for e in [*at.markdown, *at.caption, *at.dataframe] if hasattr(e, "value"))
    assert "TTFT" in text or any("TTFT" in str(m.label) for m in at.metric), text


def test_another_applications_database_is_named_and_left_alone(tmp_path, monkeypatch):
    """Started with `streamlit run` (no launch check), the dashboard gave any database it was pointed at the
    store's tables and said the store had no runs."""
    path = tmp_path / "invoices.db"
    with sqlite3.connect(path) as c:
        c.execute("create table invoices (id integer primary key, total real)")
    at = _open(f"sqlite:///{path}", monkeypatch, "views/overview.py")
    assert not at.exception
    assert any("is not specfinops" in e.value for e in at.error), [e.value for e in at.error]
    with sqlite3.connect(path) as c:
        assert [r[0] for r in c.execute("select name from sqlite_master where type = 'table'")] == ["invoices"]
    missing = tmp_path / "nope" / "x.db"
    at = _open(f"sqlite:///{missing}", monkeypatch, "views/overview.py")
    assert at.error and not (tmp_path / "nope").exists()


def test_the_reports_page_says_where_each_costs_energy_comes_from(sqlite_url, tmp_path, monkeypatch):
    from app.cli import main

    add_pair(sqlite_url, energy=True)  # estimated power
    assert main(["report", "--db", sqlite_url, "--out", str(tmp_path / "out"), "--period", "daily",
                 "--since", "2026-11-02"]) == 0
    at = _open(sqlite_url, monkeypatch, "views/reports.py")
    assert_clean(at)
    (table,) = at.dataframe
    row = table.value.iloc[0]
    assert row["spec energy"] == "estimated" and row["AR energy"] == "estimated", row.to_dict()


def test_one_mode_is_not_blamed_on_the_sla_and_the_compare_skips_a_failed_run(sqlite_url, monkeypatch):
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", power_source="estimate",
                 requests=[Req(33, ttft_ms=100, e2e_ms=900, energy_j=40.0), Req(33, ttft_ms=100, e2e_ms=950)])
        s.commit()
    at = _open(sqlite_url, monkeypatch, "views/cost.py")
    assert_clean(at)
    notes = [c.value for c in at.caption if c.value.startswith("Note: energy")]
    assert notes and all("no speculative runs in view" in n and "meets" not in n.split("speculative")[1][:40]
                         for n in notes), notes
    with Session(engine) as s:  # a good spec run, then a failed one with nothing recorded
        good = make_run(s, "spec", requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500)]).id
        make_run(s, "spec", status="failed", requests=[Req(0, ttft_ms=None, e2e_ms=None, status="error")])
        s.commit()
    at = _open(sqlite_url, monkeypatch, "views/runs.py")
    assert_clean(at)
    assert at.selectbox(key="cmp_a").value == good


def test_a_store_of_ar_runs_only_says_how_to_record_spec_not_too_few(tmp_path, monkeypatch):
    """Only AR runs: the projection warned "based on 0 spec and 1 AR requests: too few ...; measure more (bench
    without --limit)" (more AR would not give spec) and the spec column said only "No speculative runs in view.".
    Both name the bench of both modes into the store viewed (--db, quoted), on the AR runs' workload."""
    import shlex

    folder = tmp_path / "my stores"
    folder.mkdir()
    url = f"sqlite:///{folder / 'store.db'}"
    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", workload="chat", requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    # app_for sets $SPECFINOPS_DB_URL to it, as `specfinops dashboard --db URL` does: named all the same; with the
    # runs' target and precision (make_run's), their sampling and answer length cap being bench's defaults
    record = (f"specfinops bench --workload chat --mode both --target demo/target-tiny --dtype float32 "
              f"--db {shlex.quote(str(folder / 'store.db'))}")
    at = _open(url, monkeypatch, "views/overview.py")
    assert_clean(at)
    [info] = [i.value for i in at.info if i.value.startswith("No speculative runs in view")]
    assert "the store has none" in info and f"`{record}`" in info, info
    for page in ("views/overview.py", "views/cost.py"):
        at.switch_page(page).run()
        assert_clean(at)
        [caveat] = [w.value for w in at.warning if w.value.startswith("Projection: based on")]
        assert caveat.startswith("Projection: based on 0 spec and 1 AR requests: the spec runs are missing"), caveat
        assert f"`{record}`" in caveat and "too few" not in caveat and "bench without --limit" not in caveat


def test_the_bench_that_records_the_missing_mode_keeps_the_runs_settings(sqlite_url, monkeypatch):
    """AR runs sampled at temperature 0.7, top_p 0.9, top_k 40, capped at 64 new tokens: the bench the Overview and
    the projection's warning suggested for the missing spec runs was `--workload code --mode both --db ...`, whose
    runs (greedy, 128 new tokens) would not compare with them. It carries their settings, in bench's own options."""
    import shlex

    from app.cli import build_parser

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", temperature=0.7, top_p=0.9, top_k=40, max_new_tokens=64,
                 requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    record = (f"specfinops bench --workload code --mode both --target demo/target-tiny --dtype float32 "
              f"--temperature 0.7 --top-p 0.9 --top-k 40 --max-new-tokens 64 "
              f"--db {shlex.quote(sqlite_url.removeprefix('sqlite:///'))}")
    at = _open(sqlite_url, monkeypatch, "views/overview.py")
    assert_clean(at)
    [info] = [i.value for i in at.info if i.value.startswith("No speculative runs in view")]
    assert f"`{record}`" in info, info
    [caveat] = [w.value for w in at.warning if w.value.startswith("Projection: based on")]
    assert f"`{record}`" in caveat, caveat
    args = build_parser().parse_args(shlex.split(record)[1:])  # what bench reads of it: the runs' settings
    assert (args.temperature, args.top_p, args.top_k, args.max_new_tokens, args.target, args.dtype) == \
        (0.7, 0.9, 40, 64, "demo/target-tiny", "float32")


def test_the_missing_mode_hint_claims_the_runs_settings_only_where_it_carries_them(sqlite_url, monkeypatch):
    """AR runs of two comparable groups (two temperatures) on a device no price is known for (no projection to
    pick a group): the Overview's bench carries no settings, but said "with the runs' target and settings"."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for temperature in (0.0, 0.7):
            make_run(s, "ar", device="mystery accelerator", temperature=temperature,
                     requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    at = _open(sqlite_url, monkeypatch, "views/overview.py")
    assert_clean(at)
    [info] = [i.value for i in at.info if i.value.startswith("No speculative runs in view")]
    assert "`specfinops bench --workload code --mode both --db " in info, info  # no settings carried
    assert "target and settings" not in info, info


def test_bench_settings_leaves_out_what_bench_does_by_default():
    """queries.BENCH_DEFAULTS are bench's own: a greedy run of the default cap names only its target and
    precision (and top_p / top_k of a greedy run change nothing)."""
    from types import SimpleNamespace

    from app.cli import build_parser
    from telemetry.queries import BENCH_DEFAULTS, bench_settings

    args = build_parser().parse_args(["bench"])
    assert {k: getattr(args, k) for k in BENCH_DEFAULTS} == BENCH_DEFAULTS
    greedy = SimpleNamespace(target="t", backend="torch", dtype="bfloat16", temperature=0.0, top_p=0.5, top_k=9,
                             max_new_tokens=128)
    assert bench_settings(greedy) == [("--target", "t"), ("--dtype", "bfloat16")]


def test_bench_settings_names_only_what_bench_takes():
    """A run of a server without specfinops' card extras records backend and precision 'unknown' and the served
    model's name as its target: bench refused `--backend unknown`. Only a bench's runs (kind 'bench') have
    settings a bench reproduces: a load test's or a server's carry none."""
    from types import SimpleNamespace

    from app.cli import build_parser
    from telemetry.queries import BENCH_DTYPES, bench_settings

    run = dict(kind="bench", target="t", backend="unknown", dtype="unknown", temperature=0.0, top_p=1.0, top_k=0,
               max_new_tokens=128)
    assert bench_settings(SimpleNamespace(**run)) == [("--target", "t")]
    assert bench_settings(SimpleNamespace(**run | {"backend": "vllm", "dtype": "float32"})) == \
        [("--backend", "vllm"), ("--target", "t"), ("--dtype", "float32")]
    for kind in ("loadtest", "serve"):
        assert bench_settings(SimpleNamespace(**run | {"kind": kind, "temperature": 0.7, "max_new_tokens": 64})) == []
    # the precisions named are those bench's --dtype takes (besides auto)
    for dtype in BENCH_DTYPES:
        build_parser().parse_args(["bench", "--dtype", dtype])
    from serving.kernels import DTYPE_CHOICES

    assert set(BENCH_DTYPES) == set(DTYPE_CHOICES) - {"auto"}


def test_bench_settings_keep_a_runs_sampling_exactly():
    """Runs are grouped by their temperature and top_p compared exactly: 0.1234567891 was suggested as 0.123457
    (six significant digits), whose runs landed in another group. bench reads back the very values."""
    import shlex
    from types import SimpleNamespace

    from app.cli import build_parser
    from telemetry.queries import bench_command, bench_settings

    run = SimpleNamespace(kind="bench", target="t", backend="torch", dtype="float32", temperature=0.1234567891,
                          top_p=0.987654321012, top_k=7, max_new_tokens=100)
    args = build_parser().parse_args(shlex.split(bench_command(options=bench_settings(run)))[1:])
    assert (args.temperature, args.top_p, args.top_k, args.max_new_tokens) == (0.1234567891, 0.987654321012, 7, 100)


def test_a_load_tests_missing_mode_is_recorded_by_a_command_that_runs(sqlite_url, monkeypatch):
    """AR load-test runs against a server without specfinops' card extras (backend and precision 'unknown', the
    target the served model's name): the Overview and the projection suggested `specfinops bench ... --backend
    unknown --target served-model`, which bench refuses, and said it had the runs' settings. Now a load test of both
    modes against the same server at the runs' sampling and answer length cap, which the CLI's own parser accepts."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", kind="loadtest", backend="unknown", dtype="unknown", target="served-model",
                 drafter=None, temperature=0.5, max_new_tokens=32, requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    at = _open(sqlite_url, monkeypatch, "views/overview.py")
    assert_clean(at)
    for text, parsed in _missing_mode_hints(at):
        for args in parsed:
            assert args.command == "loadtest" and args.mode == "both", text
            assert (args.temperature, args.max_tokens, args.workload) == (0.5, 32, "code"), text
        assert "--backend" not in text and "served-model" not in text and "target and settings" not in text, text


def test_the_tokens_tile_keeps_three_significant_digits(sqlite_url, monkeypatch):
    """1.0297 and 0.4714 tokens/s read "1.0" and "0.5" beside a +118% delta."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:  # AR 33 tokens in 70 s, spec 33 in 32 s
        make_run(s, "ar", requests=[Req(33, ttft_ms=2000, e2e_ms=70_000)])
        make_run(s, "spec", requests=[spec_req(33, 4, 20, ttft_ms=2000, e2e_ms=32_000)])
        s.commit()
    at = _open(sqlite_url, monkeypatch, "views/overview.py")
    assert_clean(at)
    shown = [m.value for m in at.metric if m.label == "Tokens/s"]
    assert sorted(shown) == ["0.471", "1.03"], shown
    at.switch_page("views/runs.py").run()  # the two runs side by side read the same figures
    assert_clean(at)
    (compare,) = [d.value for d in at.dataframe if "figure" in d.value.columns and len(d.value.columns) == 3]
    assert sorted(compare.set_index("figure").loc["tokens/s"]) == ["0.471", "1.03"], compare


def test_the_missing_mode_is_recorded_on_a_workload_bench_takes(sqlite_url, monkeypatch):
    """A store of a server's AR runs only (workload 'serve'), of the generator's only ('synthetic'), of a workload
    file no longer there: the Overview and the projection suggested `bench --workload serve` (or synthetic, or the
    gone file), which bench refuses. They name a workload bench takes: mixed (queries.bench_workload)."""
    from serving.workloads import load_workload

    for kind, workload in (("serve", "serve"), ("bench", "synthetic"), ("bench", "/no/such/dir/gone.jsonl")):
        url = f"{sqlite_url.removesuffix('.db')}-{kind}-{len(workload)}.db"
        engine = open_store(url)
        with Session(engine) as s:
            make_run(s, "ar", kind=kind, workload=workload, requests=[Req(33, ttft_ms=100, e2e_ms=900)])
            s.commit()
        at = _open(url, monkeypatch, "views/overview.py")
        assert_clean(at)
        for text, parsed in _missing_mode_hints(at):
            for args in parsed:
                assert args.workload == "mixed", text
                assert load_workload(args.workload), text  # bench reads it


def test_bench_workload_knows_the_workloads_bench_takes(tmp_path):
    """queries.BUILTIN_WORKLOADS and WORKLOAD_FILE_SUFFIXES are serving.workloads' own (telemetry does not import
    serving): a builtin name or an existing file is kept, anything else is mixed."""
    from serving import workloads
    from telemetry.queries import BUILTIN_WORKLOADS, WORKLOAD_FILE_SUFFIXES, bench_workload

    assert BUILTIN_WORKLOADS == workloads.BUILTIN_WORKLOADS
    assert WORKLOAD_FILE_SUFFIXES == workloads.FILE_SUFFIXES
    for name in BUILTIN_WORKLOADS:
        assert bench_workload(name) == name
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"prompt": "hi"}\n')
    assert bench_workload(str(mine)) == str(mine)
    (tmp_path / "dir.jsonl").mkdir()
    for name in ("serve", "synthetic", str(tmp_path / "gone.jsonl"), str(tmp_path / "dir.jsonl"), None, ""):
        assert bench_workload(name) == "mixed"


def test_a_load_tests_hint_claims_only_the_settings_its_runs_recorded():
    """Load-test runs that recorded no temperature and no answer length cap: the hint said the load test ran "with
    the runs' sampling and answer length cap" all the same. It names what the runs recorded, and says which
    server the command asks (loadtest's default URL), the command itself parsing as loadtest takes it."""
    import shlex
    from types import SimpleNamespace

    from app.cli import build_parser
    from telemetry.queries import LOADTEST_URL, record_both

    assert build_parser().parse_args(["loadtest"]).url == LOADTEST_URL
    run = dict(kind="loadtest", target="served-model", backend="unknown", dtype="unknown", top_p=None, top_k=None)
    for temperature, cap, said in ((None, None, None), (0.5, None, "sampling"), (None, 32, "answer length cap"),
                                   (0.0, 64, "sampling and answer length cap")):
        command, text = record_both(None, SimpleNamespace(**run, temperature=temperature, max_new_tokens=cap),
                                    "chat", words="AR ")
        assert f"`{command}`" in text and f"default {LOADTEST_URL}: add --url URL for another" in text, text
        assert (said is None) == ("runs'" not in text), text
        if said is not None:
            assert f"with the AR runs' {said} (" in text, text
        args = build_parser().parse_args(shlex.split(command)[1:])
        assert (args.command, args.mode, args.workload, args.url) == ("loadtest", "both", "chat", LOADTEST_URL)
        assert (args.temperature, args.max_tokens) == (temperature or 0.0, cap or 64), command


def test_load_tests_of_several_groups_are_recorded_by_a_load_test(sqlite_url, monkeypatch):
    """AR load-test runs of two comparable groups (two temperatures) on a device no price is known for (no
    projection to pick a group): the Overview suggested a bench, whose runs never compare with a load test's."""
    import shlex

    from app.cli import build_parser

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for temperature in (0.0, 0.7):
            make_run(s, "ar", kind="loadtest", device="mystery accelerator", temperature=temperature,
                     max_new_tokens=64, requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    at = _open(sqlite_url, monkeypatch, "views/overview.py")
    assert_clean(at)
    [info] = [i.value for i in at.info if i.value.startswith("No speculative runs in view")]
    [command] = [c for c in info.split("`") if c.startswith("specfinops ")]
    args = build_parser().parse_args(shlex.split(command)[1:])
    assert (args.command, args.mode) == ("loadtest", "both"), info
    assert "runs' sampling" not in info, info  # of two groups: none carried
