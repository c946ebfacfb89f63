"""The caveats of `specfinops cost` and `project`: a mode's pooled cost spanning several configurations, server
runs priced over their requests' span, figures from too few requests, and capacity priced as other hardware than
it was measured on. Each fires where it should and is absent where it should not."""

from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy.orm import Session
from synthetic import BASE_TIME, Req, make_run, spec_req

from app.cli import main
from telemetry.costing import MIN_STABLE_REQUESTS
from telemetry.store import open_store


def _ar(n: int) -> list[Req]:
    """n AR requests, one a second: TPOT 25 ms."""
    return [Req(33, ttft_ms=100, e2e_ms=900, start_s=float(i)) for i in range(n)]


def _spec(n: int) -> list[Req]:
    """n spec requests, one a second: TPOT 12.5 ms."""
    return [spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500, start_s=float(i)) for i in range(n)]


def _project(url: str, *extra: str) -> list[str]:
    return ["project", "--db", url, "--daily-tokens", "8.64e6", "--peak-factor", "1.5", "--p95-tpot-sla-ms", "50",
            *extra]


def _cost_json(url: str, capsys, *extra: str) -> dict:
    assert main(["cost", "--db", url, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _text(argv: list[str], capsys) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


# ---- a mode's pooled cost over several configurations ----------------------------------------------------


def test_cost_mode_line_says_it_pools_configurations_and_what_differs(db_url, capsys):
    """Spec: a server run and load-test runs at concurrency 1 and 2 (three configurations); AR: one bench run."""
    engine = open_store(db_url)
    with Session(engine) as s:
        make_run(s, "spec", kind="serve", temperature=None, top_p=None, top_k=None, requests=_spec(3))
        make_run(s, "spec", kind="loadtest", concurrency=1, requests=_spec(3))
        make_run(s, "spec", kind="loadtest", concurrency=2, requests=_spec(3))
        make_run(s, "ar", requests=_ar(3))
        s.commit()
    modes = {m["mode"]: m for m in _cost_json(db_url, capsys)["modes"]}
    assert modes["spec"]["configurations"] == 3
    assert {"concurrency", "kind", "temperature"} <= set(modes["spec"]["differs_in"])
    assert "workload" not in modes["spec"]["differs_in"]
    assert (modes["ar"]["configurations"], modes["ar"]["differs_in"]) == (1, [])
    assert modes["spec"]["run_ids"] == [1, 2, 3]  # existing fields kept
    lines = _text(["cost", "--db", db_url], capsys).splitlines()
    pooled = [i for i, line in enumerate(lines) if "pools " in line]
    assert len(pooled) == 1  # the spec line only: AR is one configuration
    assert lines[pooled[0] - 1].startswith("spec  runs 1-3:")
    assert "pools 3 configurations that differ in" in lines[pooled[0]]
    assert "concurrency" in lines[pooled[0]] and "run kind" in lines[pooled[0]]
    assert "--run-kind" in lines[pooled[0]] and "--invocation ID" in lines[pooled[0]]


def test_cost_names_answer_length_cap_and_workload_where_they_differ(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "spec", workload="code", max_new_tokens=32, requests=_spec(3))
        make_run(s, "spec", workload="mixed", max_new_tokens=16, requests=_spec(3))
        s.commit()
    (spec,) = _cost_json(sqlite_url, capsys)["modes"]
    assert spec["configurations"] == 2 and set(spec["differs_in"]) == {"workload", "max_new_tokens"}
    out = _text(["cost", "--db", sqlite_url], capsys)
    assert "pools 2 configurations that differ in workload, max new tokens: narrow with --workload, " \
           "--max-new-tokens, --invocation ID or --run ID" in out


def test_cost_advises_only_the_narrowing_options_not_given_yet(db_url, capsys):
    """`cost --invocation ID` on a load test of two concurrency levels: it said "narrow with --invocation ID or
    --run ID", --invocation given already; it names --run only."""
    invocation = "0123456789abcdef0123456789abcdef"
    engine = open_store(db_url)
    with Session(engine) as s:
        for level in (1, 2):
            make_run(s, "spec", kind="loadtest", concurrency=level, requests=_spec(3)).invocation_id = invocation
        s.commit()
    out = _text(["cost", "--db", db_url, "--invocation", invocation[:8]], capsys)
    assert "pools 2 configurations that differ in concurrency: narrow with --run ID" in out, out
    assert "--invocation ID" not in out, out
    out = _text(["cost", "--db", db_url, "--run-kind", "loadtest"], capsys)
    assert "differ in concurrency: narrow with --invocation ID or --run ID" in out, out


def test_cost_still_advises_a_given_filter_whose_field_still_differs(db_url, capsys):
    """`--target target-tiny` keeps every folder of that name, on any node: two target paths are still pooled, so
    --target (its path) still narrows them; it was left out of the hint as given already."""
    engine = open_store(db_url)
    with Session(engine) as s:
        for target in ("/models/a/target-tiny", "/models/b/target-tiny"):
            make_run(s, "spec", target=target, requests=_spec(3))
        s.commit()
    out = _text(["cost", "--db", db_url, "--target", "target-tiny"], capsys)
    assert ("pools 2 configurations that differ in target: narrow with --target PATH (a full folder path narrows "
            "it), --invocation ID or --run ID") in out, out
    # not given: --target as the other filters are advised
    assert "differ in target: narrow with --target, --invocation ID or --run ID" in _text(["cost", "--db", db_url],
                                                                                          capsys)


def test_cost_repeats_of_one_configuration_are_not_called_pooled(db_url, capsys):
    engine = open_store(db_url)
    with Session(engine) as s:
        for _ in range(2):  # two runs of one command: one configuration per mode
            make_run(s, "spec", requests=_spec(3))
            make_run(s, "ar", requests=_ar(3))
        s.commit()
    modes = _cost_json(db_url, capsys)["modes"]
    assert [(m["configurations"], m["differs_in"]) for m in modes] == [(1, []), (1, [])]
    assert "pools " not in _text(["cost", "--db", db_url], capsys)


# ---- server runs: priced over their requests' span ---------------------------------------------------------


def test_cost_says_a_server_run_is_priced_over_its_requests_span(db_url, capsys):
    """A server up for an hour that served two requests over 2.5 s is priced over 2.5 s, and says so."""
    engine = open_store(db_url)
    with Session(engine) as s:
        make_run(s, "spec", kind="serve", temperature=None, top_p=None, top_k=None,
                 ended_at=BASE_TIME + timedelta(hours=1),
                 requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500, start_s=s_) for s_ in (0.0, 2.0)])
        make_run(s, "ar", requests=_ar(2))
        s.commit()
    out = _cost_json(db_url, capsys)
    serve = next(r for r in out["runs"] if r["kind"] == "serve")
    assert serve["wall_s"] == 2.5  # the arithmetic is unchanged: not the server's hour
    assert serve["priced_over"] == "requests' span"
    # only the idle time outside the requests' span is left out: the gap between the two requests is priced
    idle = "idle time before the first and after the last request is not priced; gaps between requests are"
    assert any("run 1 (server)" in n and idle in n for n in out["notes"])
    text = _text(["cost", "--db", db_url], capsys)
    assert "note: run 1 (server): hardware priced over the requests' span" in text and idle in text


def test_cost_without_server_runs_has_no_idle_time_note(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "spec", kind="loadtest", requests=_spec(2))
        s.commit()
    out = _cost_json(sqlite_url, capsys)
    assert not any("idle" in n for n in out["notes"])
    assert "idle" not in _text(["cost", "--db", sqlite_url], capsys)


# ---- too few requests ------------------------------------------------------------------------------------


def _both(url: str, n_spec: int, n_ar: int) -> None:
    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", requests=_ar(n_ar))
        make_run(s, "spec", requests=_spec(n_spec))
        s.commit()


def test_project_from_two_requests_per_mode_says_they_are_too_few(db_url, capsys):
    _both(db_url, 2, 2)
    assert main([*_project(db_url, "--gpu", "cpu-2core"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["annual_savings_usd"] is not None  # the figure is still given, with its caveat
    notes = out["assumptions"]["notes"]
    assert any(n.startswith("based on 2 spec and 2 AR requests: too few for a p95 and a capacity figure")
               and "bench without --limit" in n for n in notes)
    text = _text(_project(db_url, "--gpu", "cpu-2core"), capsys)
    assert "warning: based on 2 spec and 2 AR requests: too few" in text


def test_project_and_cost_from_enough_requests_have_no_small_sample_caveat(db_url, capsys):
    _both(db_url, 30, 30)
    assert main([*_project(db_url, "--gpu", "cpu-2core"), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["assumptions"]["notes"]
    assert not any("too few" in n for n in notes)
    assert "too few" not in _text(_project(db_url, "--gpu", "cpu-2core"), capsys)
    out = _cost_json(db_url, capsys)
    assert [m["small_sample"] for m in out["modes"]] == [False, False]
    assert [m["num_requests_ok"] for m in out["modes"]] == [30, 30]
    assert not any("too few" in n for n in out["notes"])
    assert "too few" not in _text(["cost", "--db", db_url], capsys)


def test_one_mode_short_of_the_threshold_is_enough_for_the_caveat(sqlite_url, capsys):
    _both(sqlite_url, 30, MIN_STABLE_REQUESTS - 1)
    text = _text(_project(sqlite_url, "--gpu", "cpu-2core"), capsys)
    assert f"based on 30 spec and {MIN_STABLE_REQUESTS - 1} AR requests: too few" in text
    out = _cost_json(sqlite_url, capsys)
    assert {m["mode"]: m["small_sample"] for m in out["modes"]} == {"spec": False, "ar": True}
    assert any(n.startswith(f"based on 30 spec and {MIN_STABLE_REQUESTS - 1} AR requests: too few for a "
                            "tokens/s and a cost per 1M tokens") for n in out["notes"])
    assert "warning: based on 30 spec" in _text(["cost", "--db", sqlite_url], capsys)


def test_project_with_one_mode_missing_says_how_to_record_it_not_too_few(tmp_path, capsys):
    """Only AR runs: 0 spec requests are missing runs, not a small sample; `measure more (bench without --limit)`
    would record more AR. The warning names the bench of both modes into this store (quoted for the shell)."""
    import shlex

    folder = tmp_path / "my stores"
    folder.mkdir()
    url = f"sqlite:///{folder / 'store.db'}"
    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", workload="chat", requests=_ar(1))
        s.commit()
    record = (f"`specfinops bench --workload chat --mode both --target demo/target-tiny --dtype float32 "
              f"--db {shlex.quote(str(folder / 'store.db'))}`")  # with the runs' target and precision
    text = _text(_project(url, "--gpu", "cpu-2core"), capsys)
    [warning] = [line for line in text.splitlines() if line.startswith("warning: based on")]
    assert warning.startswith("warning: based on 0 spec and 1 AR requests: the spec runs are missing"), warning
    assert record in warning and "too few" not in warning and "bench without --limit" not in warning
    assert f"take {MIN_STABLE_REQUESTS} or more requests per mode" in warning  # and more than the one AR request
    # no spec run is no spec capacity measured: "not attainable" said no spec run met the SLA
    [nodes] = [line for line in text.splitlines() if line.startswith("nodes needed:")]
    assert nodes.endswith(", spec not measured") and "attainable" not in nodes, nodes
    assert "annual savings: not computed (no spec runs measured)" in text
    assert main([*_project(url, "--gpu", "cpu-2core"), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["assumptions"]["notes"]
    assert f"warning: {notes[notes.index(warning[len('warning: '):])]}" == warning  # the same line in both


# ---- capacity priced as other hardware than measured -------------------------------------------------------


def test_project_priced_as_h100_from_cpu_runs_warns_it_does_not_project_h100(db_url, capsys):
    _both(db_url, 30, 30)
    args = _project(db_url, "--gpu", "H100", "--gpus-per-node", "8")
    assert main([*args, "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["priced_differs_from_measured"] is True
    warning = [n for n in a["notes"] if "measure on it" in n]
    assert warning and "measured on cpu (2 cores)" in warning[0] and "to project H100, measure on it" in warning[0]
    text = _text(args, capsys)
    assert "warning: the capacity is the throughput measured on cpu (2 cores), priced as" in text
    assert "to project H100, measure on it" in text


def test_a_node_entry_of_the_measured_gpus_chip_says_each_node_is_one_measured_device(sqlite_url, capsys):
    """`prices set my-h100-node 55.04 --kind node`, then `project --gpu my-h100-node` on runs of one H100: the
    fleet was sized on one GPU's throughput per "node" at the whole node's $55.04/h (an 8-GPU node's price, 8x the
    cost), with nothing said, and --gpus-per-node is refused for a node entry. The projection now says each node is
    one measured device priced at that entry, and how to price the GPU instead; a GPU entry says nothing."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for mode, reqs in (("ar", _ar(30)), ("spec", _spec(30))):
            make_run(s, mode, device="NVIDIA H100 80GB HBM3", requests=reqs)
        s.commit()
    engine.dispose()
    assert main(["prices", "set", "my-h100-node", "55.04", "--kind", "node", "--source", "8x H100 node",
                 "--db", sqlite_url]) == 0
    capsys.readouterr()
    args = _project(sqlite_url, "--gpu", "my-h100-node")
    assert main([*args, "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["assumptions"]["notes"]
    said = [n for n in notes if n.startswith("each projected node is one measured device")]
    assert said and "my-h100-node's $55.04/h, a node entry" in said[0] and "--gpus-per-node N" in said[0], notes
    assert "warning: each projected node is one measured device" in _text(args, capsys)
    assert main([*_project(sqlite_url, "--gpu", "H100"), "--json"]) == 0  # a GPU entry: nothing to say
    assert not any("each projected node" in n for n in json.loads(capsys.readouterr().out)["assumptions"]["notes"])


def test_project_priced_as_the_measured_device_has_no_device_warning(db_url, capsys):
    _both(db_url, 30, 30)
    for extra in ((), ("--gpu", "cpu-2core")):
        assert main([*_project(db_url, *extra), "--json"]) == 0
        a = json.loads(capsys.readouterr().out)["assumptions"]
        assert a["priced_differs_from_measured"] is False
        assert not any("measure on it" in n for n in a["notes"])
        text = _text(_project(db_url, *extra), capsys)
        assert "measure on it" not in text and "warning:" not in text


def test_the_other_hardware_warning_says_how_to_price_the_measured_device_itself(sqlite_url, capsys):
    """README's `prices set my-node 12 --kind node`, then `project --gpu my-node`, warned that the capacity was
    priced as other hardware ("to project my-node, measure on it") without saying how a user prices the machine
    they measured on. The warning now names the entry that would be the device's own price (named after its
    model), or --node-hourly-usd where the device string names no model; priced so, nothing differs."""
    device = "cpu: AMD EPYC 7763 64-Core Processor (2 threads)"
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for mode, reqs in (("ar", _ar(30)), ("spec", _spec(30))):
            make_run(s, mode, device=device, requests=reqs)
        s.commit()
    engine.dispose()
    assert main(["prices", "set", "my-node", "12", "--kind", "node", "--source", "TCO", "--db", sqlite_url]) == 0
    capsys.readouterr()
    text = _text(_project(sqlite_url, "--gpu", "my-node"), capsys)
    [warning] = [line for line in text.splitlines() if "measure on it" in line]
    assert "to project my-node, measure on it" in warning
    assert ('`specfinops prices set "AMD EPYC 7763 64-Core Processor" X --kind node --source ...`, X the whole '
            'device\'s $/h, and --gpu "AMD EPYC 7763 64-Core Processor"') in warning, warning
    assert "--node-hourly-usd N, N the whole measured device's $/h" in warning, warning
    # the way the warning names: that entry is the measured device's price, its energy kept
    assert main(["prices", "set", "AMD EPYC 7763 64-Core Processor", "12", "--kind", "node", "--source", "TCO",
                 "--db", sqlite_url]) == 0
    capsys.readouterr()
    for extra in (("--gpu", "AMD EPYC 7763 64-Core Processor"), ("--node-hourly-usd", "12")):
        assert main([*_project(sqlite_url, *extra), "--json"]) == 0
        a = json.loads(capsys.readouterr().out)["assumptions"]
        assert a["priced_differs_from_measured"] is False and not any("measure on it" in n for n in a["notes"])


def test_the_other_hardware_warning_on_a_device_naming_no_model_says_node_hourly_usd(sqlite_url, capsys):
    """`cpu: AMD EPYC (2 threads)` holds no model an entry could be named after: the warning says so and names
    --node-hourly-usd, the way to price that machine itself."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for mode, reqs in (("ar", _ar(30)), ("spec", _spec(30))):
            make_run(s, mode, device="cpu: AMD EPYC (2 threads)", requests=reqs)
        s.commit()
    engine.dispose()
    assert main(["prices", "set", "my-node", "12", "--kind", "node", "--source", "TCO", "--db", sqlite_url]) == 0
    capsys.readouterr()
    assert main([*_project(sqlite_url, "--gpu", "my-node"), "--json"]) == 0
    [warning] = [n for n in json.loads(capsys.readouterr().out)["assumptions"]["notes"] if "measure on it" in n]
    assert ("to price the measured 'cpu: AMD EPYC (2 threads)' itself, pass --node-hourly-usd N (N: one measured "
            "device's whole $/h)") in warning
    assert "names no model" in warning and "prices set" not in warning, warning


def _store_on(url: str, device: str) -> None:
    engine = open_store(url)
    with Session(engine) as s:
        for mode, reqs in (("ar", _ar(30)), ("spec", _spec(30))):
            make_run(s, mode, device=device, requests=reqs)
        s.commit()
    engine.dispose()


def test_the_other_hardware_warning_tells_a_gpu_entrys_price_from_the_whole_devices(sqlite_url, capsys):
    """The warning said `prices set ... X --kind gpu` or `--node-hourly-usd X`, one X for two prices: on a device
    of 8 GPUs an entry at 12 prices the node at 96 $/h, --node-hourly-usd 12 at 12. It now says which is which, and
    the figures are as it says."""
    device = "cuda: NVIDIA H100 80GB HBM3 x 8 (tp 8)"
    _store_on(sqlite_url, device)
    assert main(["prices", "set", "my-node", "12", "--kind", "node", "--source", "TCO", "--db", sqlite_url]) == 0
    capsys.readouterr()
    assert main([*_project(sqlite_url, "--gpu", "my-node"), "--json"]) == 0
    [warning] = [n for n in json.loads(capsys.readouterr().out)["assumptions"]["notes"] if "measure on it" in n]
    assert ('`specfinops prices set "NVIDIA H100 80GB HBM3" X --kind gpu --source ...`, X its $/h per GPU, and '
            '--gpu "NVIDIA H100 80GB HBM3"') in warning, warning
    assert "--node-hourly-usd N, N the whole measured device's $/h" in warning, warning
    assert "--node-hourly-usd X" not in warning, warning
    assert main(["prices", "set", "NVIDIA H100 80GB HBM3", "12", "--kind", "gpu", "--source", "TCO",
                 "--db", sqlite_url]) == 0
    capsys.readouterr()
    for extra, node_usd in ((("--gpu", "NVIDIA H100 80GB HBM3"), 96), (("--node-hourly-usd", "12"), 12)):
        assert main([*_project(sqlite_url, *extra), "--json"]) == 0
        a = json.loads(capsys.readouterr().out)["assumptions"]
        assert a["node_hourly_usd"] == node_usd and a["priced_differs_from_measured"] is False, a


def test_the_other_hardware_caveat_on_the_dashboard_names_the_pages_controls(tmp_path):
    """The dashboard shows a projection's caveats in its words (common.in_page_words): how to price the measured
    device itself was left in the CLI's (`--gpu "Apple M2 Max"`, --node-hourly-usd X). It now names the Node price
    box: the entry named after the device's model, or a custom $/h per node; no CLI flag."""
    from app.dashboard.common import in_page_words
    from telemetry.costing import project_from_store

    for i, (device, entry) in enumerate((("mps: Apple M2 Max", '"Apple M2 Max", a gpu entry at its $/h per GPU'),
                                         ("cpu: AMD EPYC (2 threads)", None))):
        url = f"sqlite:///{tmp_path / f'store{i}.db'}"
        _store_on(url, device)
        engine = open_store(url)
        caveats = project_from_store(engine, daily_tokens=5e8, peak_factor=2, sla_ms=1e6, gpu="H100").caveats
        engine.dispose()
        [said] = [in_page_words(c) for c in caveats if "measure on it" in c]
        assert "--" not in said, said  # no CLI flag, nor `prices set`'s
        assert "custom $/h per node (the whole measured device's $/h) as the Node price" in said, said
        assert said.endswith("an entry named otherwise is taken as other hardware"), said
        if entry:
            assert "pick as the Node price the entry named after the device's model" in said, said
            assert entry in said and "`specfinops prices set` records it" in said, said
        else:
            assert "names no model" in said, said


def test_the_notes_on_many_runs_list_a_few_id_ranges_and_count_the_rest(sqlite_url, capsys):
    """Hundreds of interrupted runs made one note thousands of characters long: it lists the first ranges, then
    the count, as the summary lines do."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for i in range(24):  # every other run cancelled: 12 ranges of one id each
            make_run(s, "ar", status="cancelled" if i % 2 else "completed",
                     started_at=BASE_TIME + timedelta(minutes=i), requests=_ar(1))
        s.commit()
    engine.dispose()
    out = _text(["cost", "--db", sqlite_url], capsys)
    line = next(x for x in out.splitlines() if "not every run completed" in x)
    assert "12 runs (2, 4, 6, 8, 10, 12, 14, 16, ...) cancelled" in line and "24" not in line


# ---- server runs sized as capacity; too few requests, said by run kind ---------------------------------------


def _runs_of(url: str, kind: str, n: int) -> None:
    server = {"temperature": None, "top_p": None, "top_k": None} if kind == "serve" else {}
    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", kind=kind, requests=_ar(n), **server)
        make_run(s, "spec", kind=kind, requests=_spec(n), **server)
        s.commit()


SERVE_TRAFFIC = "they measure the traffic the server got, not its capacity"


def test_project_on_server_runs_says_they_measure_traffic_not_capacity(db_url, capsys):
    """`project` sized a fleet on a server's runs (the traffic it happened to be sent, priced over its requests'
    span) as "capacity per node at the SLA", without a word: a mostly idle server reads as a slow node. The figures
    are still given, with the caveat in the CLI, its --json notes, the report and the dashboard's Cost page."""
    from app.dashboard.common import in_page_words
    from telemetry.costing import SERVE_CAPACITY_NOTE
    from telemetry.report import build_report, period_window

    _runs_of(db_url, "serve", MIN_STABLE_REQUESTS)
    assert main([*_project(db_url, "--gpu", "cpu-2core"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nodes_spec"] is not None and out["capacity_tokens_per_s_spec"]  # not dropped
    assert [n for n in out["assumptions"]["notes"] if SERVE_TRAFFIC in n] == [SERVE_CAPACITY_NOTE]
    assert "`specfinops loadtest` against the server" in SERVE_CAPACITY_NOTE
    text = _text(_project(db_url, "--gpu", "cpu-2core"), capsys)
    assert f"warning: {SERVE_CAPACITY_NOTE}" in " ".join(text.split())
    page = in_page_words(SERVE_CAPACITY_NOTE)  # as the Cost page shows it (show_projection_caveats)
    assert SERVE_TRAFFIC in page and "--run-kind" not in page and "Run kind" in page
    data = build_report(open_store(db_url), period_window("custom", since=BASE_TIME - timedelta(days=1),
                                                          until=BASE_TIME + timedelta(days=1)),
                        daily_tokens=8.64e6)
    assert SERVE_CAPACITY_NOTE in data.projection.projection.as_dict()["assumptions"]["notes"]


def test_project_on_bench_or_load_test_runs_has_no_server_traffic_caveat(db_url, capsys):
    _runs_of(db_url, "loadtest", MIN_STABLE_REQUESTS)
    assert main([*_project(db_url, "--gpu", "cpu-2core"), "--json"]) == 0
    assert not any(SERVE_TRAFFIC in n for n in json.loads(capsys.readouterr().out)["assumptions"]["notes"])


def test_too_few_requests_says_how_to_measure_more_for_the_runs_kind(db_url, capsys):
    """"measure more (bench without --limit)" was said of load test runs (no --limit: they send what --duration
    holds) and server runs (the traffic they were sent) too."""
    from telemetry.costing import small_sample_text

    _runs_of(db_url, "loadtest", 2)
    assert main([*_project(db_url, "--gpu", "cpu-2core"), "--json"]) == 0
    small = [n for n in json.loads(capsys.readouterr().out)["assumptions"]["notes"] if "too few" in n]
    assert len(small) == 1 and small[0].endswith("measure longer (loadtest with a longer --duration)"), small
    notes = _cost_json(db_url, capsys)["notes"]
    assert any("too few" in n and n.endswith("loadtest with a longer --duration)") for n in notes), notes
    assert not any("bench without --limit" in n for n in notes)
    served = small_sample_text({"spec": 2, "ar": 2}, kinds=("serve",))
    assert served.endswith("let the server take more traffic (its runs hold the requests it was sent), or measure "
                           "with loadtest")
    both = small_sample_text({"spec": 2, "ar": 2}, kinds=("loadtest", "bench"))
    assert both.endswith("measure more (bench without --limit); measure longer (loadtest with a longer --duration)")
    assert small_sample_text({"spec": 2, "ar": 2}).endswith("measure more (bench without --limit)")


def test_the_reports_small_sample_caveat_says_how_for_its_runs_kind(db_url):
    from telemetry.report import build_report, period_window

    _runs_of(db_url, "serve", 2)
    data = build_report(open_store(db_url), period_window("custom", since=BASE_TIME - timedelta(days=1),
                                                          until=BASE_TIME + timedelta(days=1)))
    said = data.small_sample_text()
    assert "too few" in said and "let the server take more traffic" in said and "bench without" not in said


def test_too_few_requests_says_how_to_measure_more_for_the_small_modes_runs_only(db_url, capsys):
    """The advice named the way to measure more of every run kind in view: AR benched with enough requests and
    spec load-tested with 2 read 'bench without --limit; ... loadtest with a longer --duration', though only the
    load test's mode was short. `cost`, its --json notes and the report say the small mode's kind only."""
    from telemetry.report import build_report, period_window

    engine = open_store(db_url)
    with Session(engine) as s:
        make_run(s, "ar", kind="bench", requests=_ar(MIN_STABLE_REQUESTS))
        make_run(s, "spec", kind="loadtest", requests=_spec(2))
        s.commit()
    loadtest_only = "measure longer (loadtest with a longer --duration)"
    notes = [n for n in _cost_json(db_url, capsys)["notes"] if "too few" in n]
    assert len(notes) == 1 and notes[0].endswith(f"mode); {loadtest_only}"), notes
    out = _text(["cost", "--db", db_url], capsys)
    assert loadtest_only in out and "bench without --limit" not in out, out
    data = build_report(engine, period_window("custom", since=BASE_TIME - timedelta(days=1),
                                              until=BASE_TIME + timedelta(days=1)))
    assert data.small_sample_text().endswith(f"mode); {loadtest_only}"), data.small_sample_text()
