"""One bench or load test at a time (runs.invocation_id): `specfinops invocations` lists them, `--invocation`
(latest, an id, or its first characters) narrows cost, project and export to one, and the dashboard's sidebar
offers them. `project` pooled every bench's runs into its capacity; an invocation's own runs are its own."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest
from sqlalchemy.orm import Session
from synthetic import BASE_TIME, Req, make_run, spec_req

from app.cli import main
from telemetry.invocations import invocation_text, list_invocations, resolve_invocation
from telemetry.queries import Filters, run_summaries, speedups
from telemetry.store import open_store

HOUR = timedelta(hours=1)
IDLE = "1111aaaa" + "0" * 24  # AR 50 tokens/s, spec 100 tokens/s: 2.0x
LOADED = "2222bbbb" + "0" * 24  # an hour later, a loaded machine: AR 25 tokens/s, spec 37.5 tokens/s: 1.5x
TWIN = "1111aaab" + "0" * 24  # shares IDLE's first 7 characters


def _run(s, invocation, mode, start, e2e_ms, *, n=1, **kw):
    if mode == "ar":
        reqs = [Req(100, ttft_ms=50, e2e_ms=e2e_ms, external_id=f"p{i}", start_s=i * e2e_ms / 1000) for i in range(n)]
    else:
        reqs = [spec_req(100, 4, 60, ttft_ms=50, e2e_ms=e2e_ms, external_id=f"p{i}", start_s=i * e2e_ms / 1000)
                for i in range(n)]
    run = make_run(s, mode, started_at=start, requests=reqs, **kw)
    run.invocation_id = invocation
    s.flush()
    return run


def fill(url: str, *, twin: bool = False) -> None:
    engine = open_store(url)
    with Session(engine) as s:
        _run(s, IDLE, "ar", BASE_TIME, 2000, n=2)
        _run(s, IDLE, "spec", BASE_TIME + timedelta(minutes=1), 1000, n=2)
        _run(s, LOADED, "ar", BASE_TIME + HOUR, 4000)
        _run(s, LOADED, "spec", BASE_TIME + HOUR + timedelta(minutes=1), 4000 / 1.5, workload="code")
        _run(s, None, "spec", BASE_TIME + 2 * HOUR, 500, kind="serve")  # a server's run: no invocation
        if twin:
            _run(s, TWIN, "ar", BASE_TIME - HOUR, 2000, workload="chat")
        s.commit()
    engine.dispose()


def test_list_is_newest_first_with_counts_and_labels_and_a_servers_run_is_in_none(db_url):
    fill(db_url)
    engine = open_store(db_url)
    try:
        found = list_invocations(engine)
        assert [i.invocation_id for i in found] == [LOADED, IDLE]
        loaded, idle = found
        assert (idle.num_runs, idle.num_spec_runs, idle.num_ar_runs, idle.num_requests) == (2, 1, 1, 4)
        assert (loaded.num_runs, loaded.num_requests) == (2, 2)
        assert idle.kinds == ("bench",) and idle.workloads == ("code",) and idle.short_id == "1111aaaa"
        assert [i.invocation_id for i in list_invocations(engine, limit=1)] == [LOADED]
        with pytest.raises(ValueError, match="limit must be >= 1"):
            list_invocations(engine, limit=0)
    finally:
        engine.dispose()


def test_resolve_latest_whole_prefix_dashed_and_upper_case(db_url):
    fill(db_url, twin=True)
    engine = open_store(db_url)
    try:
        assert resolve_invocation(engine, "latest") == LOADED  # the twin started first, though recorded last
        assert resolve_invocation(engine, " LATEST ") == LOADED
        assert resolve_invocation(engine, IDLE) == IDLE
        assert resolve_invocation(engine, "2222") == LOADED
        assert resolve_invocation(engine, "1111AAAA") == IDLE
        dashed = f"{IDLE[:8]}-{IDLE[8:12]}-{IDLE[12:16]}-{IDLE[16:20]}-{IDLE[20:]}"  # str(uuid.UUID(...))
        assert resolve_invocation(engine, dashed) == IDLE
        with pytest.raises(ValueError, match=r"2 invocations start with '1111aaa' \(1111aaaa0.*, 1111aaab0.*\): "
                                             r"give more characters"):
            resolve_invocation(engine, "1111aaa")
        with pytest.raises(ValueError, match=r"no invocation id starts with 'abcd' \(the newest: 2222bbbb, "
                                             r"1111aaaa, 1111aaab;"):
            resolve_invocation(engine, "abcd")
    finally:
        engine.dispose()


@pytest.mark.parametrize(("text", "says"), [
    ("", "must be 'latest' or an invocation id"),
    ("last", "must be 'latest' or an invocation id"),
    ("12 34", "must be 'latest' or an invocation id"),
    ("abc", "give at least 4 characters"),
    ("a" * 33, "has 32 hexadecimal digits, this has 33"),
])
def test_a_text_that_names_no_invocation_is_refused_before_the_store_is_read(text, says):
    with pytest.raises(ValueError, match=says):
        invocation_text(text)


def test_latest_in_a_store_without_invocations_says_why(empty_store):
    engine = open_store(empty_store)
    try:
        with pytest.raises(ValueError, match="the store has no bench or load-test invocations"):
            resolve_invocation(engine, "latest")
        with pytest.raises(ValueError, match=r"no invocation id starts with 'abcd' \(the store has none\)"):
            resolve_invocation(engine, "abcd")
    finally:
        engine.dispose()


def test_the_filter_keeps_one_invocations_runs_and_its_speedup_is_its_own(db_url):
    fill(db_url)
    engine = open_store(db_url)
    try:
        assert {r.invocation_id for r in run_summaries(engine, Filters(invocation_id=LOADED))} == {LOADED}
        (pooled,) = [s for s in speedups(engine) if s.kind == "bench"]
        (loaded,) = speedups(engine, Filters(invocation_id=LOADED))
        (idle,) = speedups(engine, Filters(invocation_id=IDLE))
        assert idle.speedup == pytest.approx(2.0) and loaded.speedup == pytest.approx(1.5)
        assert pooled.invocation_speedups == pytest.approx((2.0, 1.5))
        with pytest.raises(ValueError, match="invocation_id must be"):
            Filters(invocation_id="")
    finally:
        engine.dispose()


def test_invocations_command_text_and_json(db_url, capsys):
    fill(db_url)
    assert main(["invocations", "--db", db_url]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["invocation", "started", "kind"]
    assert lines[2].startswith("2222bbbb") and lines[3].startswith("1111aaaa")  # newest first
    assert lines[2].split()[-1] == "1.50x" and lines[3].split()[-1] == "2.00x"
    assert "1/1" in lines[3] and lines[3].split()[-2] == "4"  # spec/ar runs, requests
    assert main(["invocations", "--db", db_url, "--json", "--limit", "1"]) == 0
    (one,) = json.loads(capsys.readouterr().out)["invocations"]
    assert one["invocation_id"] == LOADED and one["runs"] == 2 and one["kinds"] == ["bench"]
    (sp,) = one["speedups"]
    assert sp["speedup"] == pytest.approx(1.5) and sp["ar_tokens_per_s"] == pytest.approx(25.0)


def test_an_interrupted_or_failed_invocation_is_marked_so(db_url, capsys):
    """A Ctrl-C'd bench ends its run 'cancelled': the list said nothing of it, and read like a whole bench."""
    engine = open_store(db_url)
    with Session(engine) as s:
        _run(s, IDLE, "ar", BASE_TIME, 2000, n=2)
        _run(s, IDLE, "spec", BASE_TIME + timedelta(minutes=1), 1000, status="cancelled")
        _run(s, LOADED, "ar", BASE_TIME + HOUR, 4000, status="failed")
        s.commit()
    engine.dispose()
    assert main(["invocations", "--db", db_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "1/1 (interrupted)" in lines[3] and "0/1 (failed)" in lines[2]
    assert any(x.startswith("(interrupted): stopped by Ctrl-C or SIGTERM") for x in lines)
    assert main(["invocations", "--db", db_url, "--json"]) == 0
    listed = {i["invocation_id"]: i for i in json.loads(capsys.readouterr().out)["invocations"]}
    assert (listed[IDLE]["cancelled_runs"], listed[IDLE]["failed_runs"]) == (1, 0)
    assert (listed[LOADED]["cancelled_runs"], listed[LOADED]["failed_runs"]) == (0, 1)


def test_invocations_command_on_a_store_with_none(empty_store, capsys):
    assert main(["invocations", "--db", empty_store]) == 0
    assert "no bench or load-test invocations in the store" in capsys.readouterr().out
    assert main(["invocations", "--db", empty_store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"invocations": []}


def test_invocations_says_why_a_store_with_runs_lists_none(empty_store, capsys):
    """A store whose runs predate invocations (or a server's) was told to run a bench 'to measure spec and AR runs',
    as if it held none."""
    engine = open_store(empty_store)
    with Session(engine) as s:
        make_run(s, "spec", requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500)])  # no invocation id
        make_run(s, "spec", kind="serve", requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500)])
        s.commit()
    engine.dispose()
    assert main(["invocations", "--db", empty_store]) == 0
    out = capsys.readouterr().out
    assert ("the store's runs: 1 run of a server (a server's runs belong to none); 1 bench or load-test run recorded "
            "before the store kept invocations (store revision 0011)") in out, out
    assert "specfinops bench" not in out


def test_cost_narrows_to_one_invocation_and_refuses_a_bad_one(db_url, capsys):
    fill(db_url)
    assert main(["cost", "--db", db_url, "--invocation", "latest", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert len(runs) == 2 and {r["mode"] for r in runs} == {"spec", "ar"}
    assert main(["cost", "--db", db_url, "--invocation", "1111", "--json"]) == 0
    assert sorted(r["tokens_per_s"] for r in json.loads(capsys.readouterr().out)["runs"]) == pytest.approx([50, 100])
    assert main(["cost", "--db", db_url, "--invocation", "ffff"]) == 2
    err = capsys.readouterr().err
    assert "specfinops cost: error: --invocation ffff: no invocation id starts with 'ffff'" in err
    assert "Traceback" not in err
    assert main(["cost", "--db", db_url, "--invocation", "1111", "--workload", "chat"]) == 2
    assert "no runs with workload 'chat'" in capsys.readouterr().err


def test_a_bad_invocation_is_refused_before_a_missing_store_is_named(tmp_path, capsys):
    assert main(["cost", "--db", f"sqlite:///{tmp_path / 'none.db'}", "--invocation", "x"]) == 2
    assert "--invocation must be 'latest' or an invocation id" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


def test_project_compares_one_invocations_runs(db_url, capsys):
    fill(db_url)
    args = ["project", "--db", db_url, "--daily-tokens", "1e6", "--peak-factor", "1", "--p95-tpot-sla-ms", "1000",
            "--node-hourly-usd", "1", "--json"]
    assert main([*args, "--invocation", "latest"]) == 0
    loaded = json.loads(capsys.readouterr().out)
    assert main([*args, "--invocation", "1111aaaa"]) == 0
    idle = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    pooled = json.loads(capsys.readouterr().out)

    def tokens_per_s(result, mode):
        return result[f"capacity_tokens_per_s_{mode}"]

    assert tokens_per_s(loaded, "ar") == pytest.approx(25.0) and tokens_per_s(idle, "ar") == pytest.approx(50.0)
    assert tokens_per_s(loaded, "spec") == pytest.approx(37.5) and tokens_per_s(idle, "spec") == pytest.approx(100.0)
    assert tokens_per_s(pooled, "ar") not in (pytest.approx(25.0), pytest.approx(50.0))  # both benches pooled


def test_export_selects_one_invocations_rows(sqlite_url, capsys):
    fill(sqlite_url)
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--invocation", "1111", "--out", "-"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 4 and {r["invocation_id"] for r in rows} == {IDLE}
    assert main(["export", "--db", sqlite_url, "--what", "cost", "--invocation", "latest", "--out", "-"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 2 and {r["invocation_id"] for r in rows} == {LOADED}
    out = tmp = sqlite_url.removeprefix("sqlite:///") + ".csv"
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--invocation", "9999", "--out", out]) == 2
    assert "no invocation id starts with '9999'" in capsys.readouterr().err
    import os

    assert not os.path.exists(tmp)  # refused before the file was opened


# ---- the dashboard's sidebar ----------------------------------------------------------------------------


def test_the_sidebar_offers_the_invocations_newest_first_and_one_narrows_every_figure(sqlite_url, monkeypatch):
    from tests.test_dashboard_apptest import PAGES, app_for, assert_clean, metrics, open_page

    fill(sqlite_url)
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    box = at.sidebar.selectbox(key="f_invocation")
    assert box.options[0] == "All"
    assert [o.split(" · ")[0] for o in box.options[1:]] == ["2222bbbb", "1111aaaa"]  # newest first
    assert box.options[1].endswith("bench · code · 2 runs")
    box.set_value(LOADED).run()
    assert_clean(at)
    assert metrics(at)["Speedup"][0].startswith("1.50")
    assert [o.split()[0] for o in at.multiselect(key="f_runs").options] == ["#3", "#4"]
    at.sidebar.selectbox(key="f_invocation").set_value(IDLE).run()
    assert_clean(at)
    assert metrics(at)["Speedup"][0].startswith("2.00")
    for title in PAGES:  # every page renders one invocation
        at.switch_page(PAGES[title]).run()
        assert_clean(at)
    at.switch_page(PAGES["Runs"]).run()
    table = at.dataframe[0].value
    table = getattr(table, "data", table)  # a Styler's frame
    assert list(table["invocation"]) == ["1111aaaa", "1111aaaa"]  # as bench prints it for --invocation


def test_one_invocation_and_no_server_runs_offers_no_filter(sqlite_url, monkeypatch):
    from tests.test_dashboard_apptest import PAGES, app_for, assert_clean, open_page

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        _run(s, IDLE, "ar", BASE_TIME, 2000)
        _run(s, IDLE, "spec", BASE_TIME + timedelta(minutes=1), 1000)
        s.commit()
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    assert not [sb for sb in at.selectbox if sb.key == "f_invocation"]


def test_latest_skips_a_bench_still_running_and_the_list_marks_it(db_url, capsys):
    fill(db_url)
    engine = open_store(db_url)
    with Session(engine) as s:  # a bench under way: one run started, not ended, no request yet
        run = make_run(s, "ar", started_at=BASE_TIME + 3 * HOUR, requests=[])
        run.invocation_id, run.status, run.ended_at = "3333cccc" + "0" * 24, "running", None
        s.commit()
    try:
        assert resolve_invocation(engine, "latest") == LOADED
        assert resolve_invocation(engine, "3333") == "3333cccc" + "0" * 24  # named, it is read as it is
        newest = list_invocations(engine, limit=1)[0]
        assert newest.short_id == "3333cccc" and newest.num_running == 1 and newest.num_requests == 0
    finally:
        engine.dispose()
    assert main(["invocations", "--db", db_url]) == 0
    out = capsys.readouterr().out
    assert "1/0 (running)" not in out and "0/1 (running)" in out and "(running): runs not ended yet" in out
    assert main(["invocations", "--db", db_url, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["invocations"][0]
    assert first["running_runs"] == 1 and first["started_at"].endswith("+00:00")


def test_latest_when_every_invocation_is_running_says_so(sqlite_url):
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        run = make_run(s, "ar", requests=[])
        run.invocation_id, run.status = "4444dddd" + "0" * 24, "running"
        s.commit()
    try:
        with pytest.raises(ValueError, match=r"the store's only invocations are still running \(4444dddd"):
            resolve_invocation(engine, "latest")
    finally:
        engine.dispose()


def test_the_overview_draws_each_invocations_own_speedup_over_time(sqlite_url, monkeypatch):
    import json as _json

    from tests.test_dashboard_apptest import PAGES, app_for, assert_clean, open_page

    fill(sqlite_url)
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    charts = [_json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    (fig,) = [c for c in charts if "Speedup per invocation" in str(c["layout"].get("title"))]
    (line,) = fig["data"]
    assert _values(line["y"]) == pytest.approx([2.0, 1.5])  # oldest first: the idle bench, then the loaded one
    assert list(line["customdata"]) == ["1111aaaa", "2222bbbb"]
    levels = sorted(round(shape["y0"], 4) for shape in fig["layout"]["shapes"])
    assert levels == [1.0, round(pooled_speedup(sqlite_url), 4)]  # break-even and the pooled figure
    # the pooled figure named in the legend, which sits under the chart (it covered the title; labels on the
    # dashed lines of two configurations overlapped)
    assert line["name"].endswith(f"(pooled {pooled_speedup(sqlite_url):.2f}x)")
    assert [a["text"] for a in fig["layout"].get("annotations", [])] == ["break-even"]
    assert fig["layout"]["legend"]["y"] < 0
    at.sidebar.selectbox(key="f_invocation").set_value(IDLE).run()  # one invocation: one point, no chart
    assert_clean(at)
    assert not [c for c in at.get("plotly_chart") if "Speedup per invocation" in c.proto.spec]


def _values(array) -> list[float]:
    """A plotly array as the figure's JSON holds it: a list, or (plotly 6) base64 bytes with their dtype."""
    if isinstance(array, dict):
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def pooled_speedup(url: str) -> float:
    engine = open_store(url)
    try:
        (s,) = [s for s in speedups(engine) if s.kind == "bench"]
        return s.speedup
    finally:
        engine.dispose()


def test_the_span_of_an_invocation_whose_run_never_ended_stops_at_its_last_request(empty_store):
    """A bench killed before it could end its run: its span ran to now (a report of it over a year-long period,
    its traffic per day near zero)."""
    from telemetry.invocations import invocation_span

    engine = open_store(empty_store)
    with Session(engine) as s:
        run = make_run(s, "spec", requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500),
                                            Req(33, ttft_ms=100, e2e_ms=900, start_s=7.4)], status="running")
        run.ended_at, run.invocation_id = None, "c" * 32
        s.commit()
    assert invocation_span(engine, "c" * 32) == (BASE_TIME, BASE_TIME + timedelta(seconds=8))
    with pytest.raises(ValueError, match="no run has invocation id"):
        invocation_span(engine, "d" * 32)


def test_cost_of_an_invocation_with_one_modes_runs_says_so(db_url, capsys):
    """A bench --mode both whose disk filled after its AR run: that run reads 'completed' and the store holds no
    spec run; `cost --invocation` priced it as any other. The note says it holds one mode's runs (an invocation
    with both says nothing)."""
    fill(db_url, twin=True)
    assert main(["cost", "--db", db_url, "--invocation", TWIN[:8]]) == 0
    out = capsys.readouterr().out
    assert f"note: invocation {TWIN[:8]} holds AR runs only, no spec run" in out
    assert main(["cost", "--db", db_url, "--invocation", TWIN[:8], "--json"]) == 0
    assert any("holds AR runs only" in n for n in json.loads(capsys.readouterr().out)["notes"])
    assert main(["cost", "--db", db_url, "--invocation", IDLE[:8]]) == 0
    assert "runs only" not in capsys.readouterr().out


MINE = "3333cccc" + "0" * 24
OTHER = "4444dddd" + "0" * 24
SEC = timedelta(seconds=1)


def test_runs_recorded_on_the_same_node_while_a_bench_ran_are_found_and_no_others(db_url):
    """Two measurements at once on one node slow each other and are each priced at the whole node: a bench now
    names the runs other commands recorded on its node while it ran. Not a run on another node, one that ended
    just before it (in the same second: whole-second spans took it in), nor one killed long ago that never ended,
    nor one that never ended whose requests all came after it."""
    from telemetry.invocations import overlap_text, overlapping_runs

    start = BASE_TIME + SEC / 2
    engine = open_store(db_url)
    with Session(engine) as s:
        _run(s, MINE, "ar", start, 2000)
        mine_spec = _run(s, MINE, "spec", start + 10 * SEC, 1000).id
        during = _run(s, OTHER, "ar", start + 5 * SEC, 8000).id  # another bench on this node, meanwhile
        _run(s, OTHER, "spec", start + 5 * SEC, 2000, node_id="node-b")  # meanwhile, on another node
        _run(s, None, "ar", BASE_TIME - 10 * SEC, 0, ended_at=BASE_TIME + SEC / 5)  # ended before it began
        served = _run(s, None, "spec", start + 8 * SEC, 500, kind="serve").id  # a server on this node
        killed_long_ago = _run(s, None, "ar", BASE_TIME - 24 * HOUR, 1000, status="running")
        killed_long_ago.ended_at = None
        going = make_run(s, "ar", started_at=BASE_TIME - HOUR, status="running", kind="loadtest",
                         requests=[Req(10, ttft_ms=5, e2e_ms=100, start_s=3600 + 3)])  # a request meanwhile
        going.ended_at = None
        later = make_run(s, "ar", started_at=BASE_TIME - HOUR, status="running", kind="serve",
                         requests=[Req(10, ttft_ms=5, e2e_ms=100, start_s=2 * 3600)])  # its requests only after
        later.ended_at = None
        s.commit()
        going_id = going.id
    try:
        found = overlapping_runs(engine, MINE)
        assert [r.id for r in found] == [going_id, during, served]
        text = overlap_text(found)
        assert text.startswith(f"runs {going_id}, {during}, {served} (bench/loadtest/serve) recorded on this node "
                               "(node-a) while this ran") and "priced at the whole node" in text
        assert overlapping_runs(engine, "ffff" * 8) == [] and overlap_text([]) is None
        # the other bench is told of this one's run that overlapped it, and of the server; the loadtest's request
        # came before it began
        assert [r.id for r in overlapping_runs(engine, OTHER)] == [served, mine_spec]
    finally:
        engine.dispose()


def test_the_bench_table_says_which_runs_overlapped(capsys):
    from app.commands.bench import print_table

    report = {"runs": [], "speedup_by_concurrency": {}, "overlap_warning": "runs 7 (bench) recorded on this node"}
    print_table(report, recorded=False)
    assert "warning: runs 7 (bench) recorded on this node" in capsys.readouterr().out


FAILED_EARLY = "5555eeee" + "0" * 24  # the newest bench: its only run failed before any request completed
RUNNING = "3333cccc" + "0" * 24


def _failed_early(status: str = "error") -> Req:
    """What a bench that fails (or is stopped) during its first request leaves: that request, recorded with
    its status, no token, no TTFT (serving.worker.abandoned)."""
    return Req(0, ttft_ms=None, e2e_ms=1200, status=status)


@pytest.mark.parametrize(("run_status", "requests"), [
    ("failed", []),  # failed before its first request began
    ("failed", [_failed_early("error")]),  # failed during it: the request is recorded 'error', 0 tokens
    ("cancelled", [_failed_early("cancelled")]),  # stopped (Ctrl-C) during it
])
def test_latest_skips_a_bench_that_recorded_no_request(db_url, capsys, tmp_path, run_status, requests):
    """A bench whose only run failed before its first request was 'latest': `cost --invocation latest` refused
    it ('have no requests') and `report --period custom --invocation latest` wrote an empty report. 'latest' is
    the newest finished invocation that completed a request (status ok, tokens > 0: what cost counts); where
    none did, it says so. A bench that failed or was stopped during its first request recorded that request
    ('error'/'cancelled', no token): it has no figures either."""
    fill(db_url)
    engine = open_store(db_url)
    with Session(engine) as s:
        run = make_run(s, "ar", started_at=BASE_TIME + 3 * HOUR, requests=requests, status=run_status)
        run.invocation_id = FAILED_EARLY
        s.commit()
    try:
        assert list_invocations(engine, limit=1)[0].invocation_id == FAILED_EARLY  # newest, listed as it is
        assert resolve_invocation(engine, "latest") == LOADED
        assert resolve_invocation(engine, "5555") == FAILED_EARLY  # named, it is read as it is
    finally:
        engine.dispose()
    assert main(["cost", "--db", db_url, "--invocation", "latest", "--json"]) == 0
    assert {r["run_id"] for r in json.loads(capsys.readouterr().out)["runs"]} == {3, 4}  # LOADED's runs
    out = tmp_path / "reports"
    assert main(["report", "--db", db_url, "--period", "custom", "--invocation", "latest", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "(invocation 2222bbbb only)" in said, said
    (runs_csv,) = out.rglob("runs_cost.csv")
    with open(runs_csv, encoding="utf-8") as fh:
        assert len(list(csv.DictReader(fh))) == 2, said  # LOADED's two runs: not an empty report


def _latest_refused(engine) -> str:
    """What `--invocation latest` says where it picks nothing (the store's engine is disposed after)."""
    try:
        with pytest.raises(ValueError) as said:
            resolve_invocation(engine, "latest")
    finally:
        engine.dispose()
    return str(said.value)


@pytest.mark.parametrize("requests", [
    [Req(40, status="error"), Req(40, status="error", start_s=1)],  # every request came back an error
    [Req(0, ttft_ms=None, e2e_ms=300), Req(0, ttft_ms=None, e2e_ms=300, start_s=1)],  # ok, with no token
])
def test_latest_says_why_a_completed_load_test_completed_no_request(sqlite_url, requests):
    """A load test that ran to its end ('completed') whose requests all came back an error, or ok with no token:
    the error said its runs "failed or were stopped before their first request ended", which they were not."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        run = make_run(s, "ar", kind="loadtest", requests=requests, status="completed")
        run.invocation_id = FAILED_EARLY
        s.commit()
    text = _latest_refused(engine)
    assert "5555eeee, completed no request: none ended ok with output tokens)" in text, text
    assert "failed or were stopped" not in text, text


@pytest.mark.parametrize("command", ["cost", "project", "export", "report"])
def test_the_help_says_what_latest_picks(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "whose runs have all ended and that completed a request" in " ".join(capsys.readouterr().out.split())


def test_latest_where_no_finished_invocation_recorded_a_request_says_so(sqlite_url):
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        run = make_run(s, "ar", requests=[_failed_early()], status="failed")
        run.invocation_id = FAILED_EARLY
        s.commit()
    assert _latest_refused(engine).startswith(
        "--invocation latest: no finished bench or load test in the store completed a request (the newest finished, "
        "5555eeee, completed no request: none ended ok with output tokens)")


def test_latest_where_only_a_running_invocation_completed_a_request_names_it(sqlite_url):
    """No finished invocation completed a request, a running one did: the error names the newest finished one as
    such (not 'the newest': the running one is newer) and tells the user to give the running one's id."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        failed = make_run(s, "ar", requests=[_failed_early()], status="failed")
        failed.invocation_id = FAILED_EARLY
        busy = make_run(s, "ar", started_at=BASE_TIME + HOUR, requests=[Req(40)], status="running")
        busy.invocation_id, busy.ended_at = RUNNING, None
        s.commit()
    text = _latest_refused(engine)
    assert "(the newest finished, 5555eeee, completed no request: none ended ok with output tokens)" in text, text
    assert "3333cccc is still running" in text and "give its id to read what it recorded so far" in text, text
