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
