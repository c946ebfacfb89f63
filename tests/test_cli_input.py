"""What the CLI refuses before any work starts, found by an audit of its input: names the store keeps that
carry control characters, options that --no-telemetry would silently ignore, a lookahead beyond any draft's
reach. No model loads here: every check runs before one would."""

from __future__ import annotations

import pytest

from app.cli import build_parser, main

NAMED = [  # (argv before the option, the option): each name the store keeps, or a command prints back
    (["bench"], "--node-id"),
    (["serve"], "--node-id"),
    (["loadtest"], "--node-id"),
    (["serve"], "--served-model-name"),
    (["scheduler", "--cron", "0 6 * * *", "--out", "r"], "--job-id"),
    (["scheduler", "--cron", "0 6 * * *", "--out", "r"], "--webhook-env"),
]


@pytest.mark.parametrize("value", ["a\nb", "a\x1b[31mb", "a\tb", "a\x7fb", "a\u200bb", "a\rb"])
@pytest.mark.parametrize(("argv", "option"), NAMED)
def test_a_stored_name_with_a_control_character_is_refused_naming_the_option(argv, option, value, capsys):
    """`cost --node nosuch` listed the store's node ids raw: a newline split its line, an ESC coloured the
    terminal; CSV exports and reports carried them too."""
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*argv, option, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: must not contain control characters" in err, err
    assert value not in err  # shown escaped, never raw


@pytest.mark.parametrize(("argv", "option"), NAMED)
def test_a_stored_name_in_any_script_stays_allowed(argv, option):
    args = build_parser().parse_args([*argv, option, "nœud-東京 3"])
    assert getattr(args, option.removeprefix("--").replace("-", "_")) == "nœud-東京 3"


@pytest.fixture
def no_model(monkeypatch):
    """A model load (bench, calibrate, serve) or a load test's probe of its server fails the test."""
    import serving.loadtest
    import serving.server_setup
    import serving.worker

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded (or a server probed) before the options were checked")

    for module, name in ((serving.worker, "load"), (serving.server_setup, "load"), (serving.server_setup, "serve"),
                         (serving.loadtest, "probe_server")):
        monkeypatch.setattr(module, name, no_load)


def _error(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


UNRECORDED = [  # (command line, the options --no-telemetry would leave unused, as the error names them)
    (["bench", "--db", "x.db"], "--db shapes"),
    (["bench", "--node-id", "n1"], "--node-id shapes"),
    (["bench", "--power", "nvml"], "--power nvml shapes"),
    (["bench", "--power", "estimate", "--tdp-w", "300"], "--power estimate, --tdp-w shape"),
    (["bench", "--tdp-w", "300"], "--tdp-w shapes"),
    (["bench", "--backend", "vllm", "--db", "x.db", "--node-id", "n1"], "--db, --node-id shape"),
    (["calibrate", "--db", "x.db"], "--db shapes"),
    (["serve", "--db", "x.db"], "--db shapes"),
    (["serve", "--node-id", "n1", "--db", "x.db"], "--db, --node-id shape"),
    (["loadtest", "--db", "x.db"], "--db shapes"),
    (["loadtest", "--node-id", "n1"], "--node-id shapes"),
]


@pytest.mark.parametrize(("argv", "named"), UNRECORDED)
def test_no_telemetry_beside_an_option_that_only_shapes_the_record_is_refused(argv, named, no_model, tmp_path,
                                                                             monkeypatch, capsys):
    """A user who gave --db meant to record; with --no-telemetry the run recorded nothing, unsaid."""
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--no-telemetry"]) == 2
    line = _error(capsys)
    assert line.startswith(f"specfinops {argv[0]}: error: ") and named in line, line
    assert "and --no-telemetry records nothing: drop " in line and "or drop --no-telemetry to record" in line, line
    assert list(tmp_path.iterdir()) == []  # no store made


@pytest.mark.parametrize(("argv", "then"), [  # each goes on past the check, to an error of its own further on
    (["bench", "--limit", "0"], "--limit must be >= 1"),
    (["bench", "--power", "none", "--limit", "0"], "--limit must be >= 1"),  # says what --no-telemetry does
    (["bench", "--spec-max-batch", "auto", "--db", "x.db", "--limit", "0"], "--limit must be >= 1"),  # read there
    (["calibrate", "--threshold", "2"], "--threshold must be in (0, 1]"),
    (["serve", "--power", "none", "--max-waiting", "0"], "--max-waiting must be >= 1"),  # its meter feeds /metrics
    (["loadtest", "--duration", "0"], "duration"),
])
def test_no_telemetry_beside_the_environments_store_or_an_option_it_uses_goes_on(argv, then, no_model, tmp_path,
                                                                                  monkeypatch, capsys):
    """SPECFINOPS_DB_URL is no option given: --no-telemetry beside it is no contradiction."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECFINOPS_DB_URL", f"sqlite:///{tmp_path / 'env.db'}")
    assert main([*argv, "--no-telemetry"]) == 2
    line = _error(capsys)
    assert then in line and "--no-telemetry" not in line, line


@pytest.mark.parametrize(("argv", "said"), [
    (["bench", "--k", "1000"], "--k must be at most 64, got 1000: a K beyond any draft's reach only spins"),
    (["bench", "--k", "auto:65"], "--k must be at most 64, got auto:65: a K beyond any draft's reach only spins"),
    (["bench", "--backend", "vllm", "--k", "100"], "--k must be at most 64, got 100"),
    (["serve", "--k", "1000"], "--k must be at most 64, got 1000: a K beyond any draft's reach only spins"),
    (["serve", "--k", "abc"], "--k: unknown k policy 'abc'"),
    (["serve", "--k", "100", "--max-len", "50"], "--k 100: at most --max-len (50) draft tokens"),
    (["calibrate", "--k", "1000"],
     "--k and --k-max must be at most 64, got 1000 and 8: a K beyond any draft's reach only spins"),
])
def test_a_lookahead_beyond_any_drafts_reach_is_refused_before_a_model_loads(argv, said, no_model, capsys):
    """bench --k 1000 was capped at --max-len only and loaded the model; calibrate's cap is shared."""
    assert main([*argv, "--no-telemetry"]) == 2
    line = _error(capsys)
    assert said in line, line


@pytest.mark.parametrize(("extra", "named"), [
    (["--drafter", "draft"], "--drafter draft is"),
    (["--draft-model", "some/draft"], "--draft-model some/draft is"),
    (["--drafter", "early-exit", "--early-exit-layers", "3"], "--drafter early-exit, --early-exit-layers 3 are"),
])
def test_serve_k_0_notes_a_drafter_it_does_not_use_and_serves_ar(extra, named, no_model, monkeypatch, capsys):
    """`serve --k 0` is a plain AR server: a drafter named beside it is taken, as bench takes --drafter and
    --draft-model beside --mode ar (a script comparing K passes them alike), said once as unused, and neither
    checked nor loaded: the server it starts drafts nothing."""
    import serving.server_setup

    started = []
    monkeypatch.setattr(serving.server_setup, "serve", lambda opts, **kw: started.append(opts))
    assert main(["serve", "--k", "0", *extra, "--port", "0", "--no-telemetry"]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "not used" in line]
    assert notes == [f"note: --k 0: a plain AR server; {named} not used"], err
    spec = started[0].spec
    assert serving.server_setup.drafts_nothing(spec) and spec.draft_model is None and spec.drafter != "early-exit"


def test_serve_k_0_beside_tree_says_the_tree_k_conflict_first(no_model, capsys):
    """--tree sets the lookahead itself: `--k 0 --tree` is that conflict, not an AR server to note a drafter for."""
    assert main(["serve", "--k", "0", "--tree", "16:6:4", "--drafter", "draft", "--no-telemetry"]) == 2
    line = _error(capsys)
    assert "--tree sets the lookahead itself (its depth); drop --k 0" in line and "not used" not in line, line


def test_the_largest_lookahead_goes_on(no_model, capsys):
    assert main(["bench", "--k", "64", "--limit", "0", "--no-telemetry"]) == 2
    assert "--limit must be >= 1" in _error(capsys)


# ---- wording: one form for one thing ----------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["prices", "set", "newthing", "5", "--source", "x", "--kind", "bogus"],
                                  ["prices", "list", "--kind", "bogus"]])
def test_prices_names_a_bad_kind_alike_under_its_option(argv, empty_store, capsys):
    """`prices set` said "kind must be one of ['electricity', 'gpu', 'node', 'pue']" (a Python list, the option
    not named), `prices list` "--kind must be one of gpu, node, electricity, pue"."""
    assert main([*argv, "--db", empty_store]) == 2
    assert _error(capsys) == ("specfinops prices: error: --kind must be one of gpu, node, electricity, pue, got "
                              "'bogus'")


@pytest.mark.parametrize("what", ["/nonexistent", "/tmp"])
def test_models_verify_names_itself_alike_in_every_error(what, capsys):
    """A refused name said 'specfinops models: error:', a folder without checksums 'specfinops models verify:'."""
    assert main(["models", "verify", what]) == 2
    assert _error(capsys).startswith(f"specfinops models verify: error: {what}: ")


def test_report_lists_its_periods_in_the_order_its_help_does(capsys):
    from telemetry.report import PERIODS

    (action,) = [a for a in dict(_subparsers())["report"]._actions if "--period" in a.option_strings]
    assert action.metavar == "|".join(PERIODS)
    assert main(["report", "--period", "yearly", "--out", "r"]) == 2
    assert "--period must be one of daily, weekly, monthly, custom, got 'yearly'" in _error(capsys)


def _subparsers():
    import argparse

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices.items()


def test_a_servers_url_is_shown_as_the_user_writes_it_its_password_masked():
    """Hints showed the driver's postgresql+psycopg:// (which no user typed) and `db upgrade --db URL`."""
    from telemetry.db import masked_password_note, resolve_db_url, shown_db_url
    from telemetry.store import NotAStoreError

    url = resolve_db_url("postgresql://ops:s3cret@db.example:5432/finops")
    assert shown_db_url(url) == "postgresql://ops:***@db.example:5432/finops"
    assert masked_password_note(url) == " (*** is its password)"
    assert masked_password_note(resolve_db_url("postgresql://ops@db.example/finops")) == ""
    said = str(NotAStoreError(shown_db_url(url), ["customers"], server=True))
    assert "no store in postgresql://ops:***@db.example:5432/finops" in said
    assert "specfinops db upgrade --db postgresql://ops:***@db.example:5432/finops (*** is its password)" in said
    said = str(NotAStoreError("postgresql://ops@db.example/finops", [], server=True))
    assert "specfinops db upgrade --db postgresql://ops@db.example/finops, or" in said and "***" not in said


@pytest.mark.parametrize("given, shown", [
    ("postgresql+psycopg://u@h/db?password=s3cret", "postgresql://u@h/db?password=***"),
    ("postgresql://u@h/db?sslmode=require&password=s3cret", "postgresql://u@h/db?password=***&sslmode=require"),
    ("postgresql://u@h/db?sslpassword=k3y&application_name=a", "postgresql://u@h/db?application_name=a&sslpassword=***"),
    ("postgresql://u:s3cret@h/db?password=s3cret", "postgresql://u:***@h/db?password=***"),
])
def test_a_password_given_in_the_query_string_is_masked_too(given, shown):
    """libpq takes the password (and a key's, sslpassword) as a query parameter too: it was shown as given."""
    from telemetry.db import masked_password_note, shown_db_url

    assert shown_db_url(given) == shown
    assert "s3cret" not in shown_db_url(given) and "k3y" not in shown_db_url(given)
    assert masked_password_note(given) == " (*** is its password)"
