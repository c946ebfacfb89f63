"""`--help` says what an option does when it is not given: every option with a default states it, and a
command's usage line shows the options it cannot run without as required."""

from __future__ import annotations

import argparse

import pytest

from app.cli import build_parser, main
from app.commands._common import default_text


def _commands(parser: argparse.ArgumentParser, prefix: str = "specfinops"):
    """(name, parser) of every sub-command, nested ones (`db upgrade`, `models path`) included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, p in action.choices.items():
                yield f"{prefix} {name}", p
                yield from _commands(p, f"{prefix} {name}")


def _help_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The lines --help prints for one option, as one line."""
    return " ".join(parser._get_formatter()._format_action(action).split())


COMMANDS = list(_commands(build_parser()))


def test_the_walk_finds_the_commands():
    names = {n for n, _ in COMMANDS}
    assert {"specfinops bench", "specfinops serve", "specfinops loadtest", "specfinops project",
            "specfinops models path", "specfinops db upgrade"} <= names


@pytest.mark.parametrize(("name", "parser"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_option_with_a_default_says_it(name, parser):
    missing = []
    for action in parser._actions:
        shown = default_text(action.default)
        if shown is None or action.help is argparse.SUPPRESS:
            continue
        text = _help_of(parser, action)
        if "default" not in text.lower() or not (shown in text or str(action.default) in text):
            missing.append(f"{'/'.join(action.option_strings) or action.dest} (default {action.default!r}): {text}")
    assert not missing, f"{name}: options whose --help does not state their default:\n" + "\n".join(missing)


@pytest.mark.parametrize(("argv", "says"), [
    (["bench"], ["--workload WORKLOAD builtin name (code, chat, rewrite, mixed) or a .jsonl path (or .txt: a prompt "
                 "a line; format below) (default: code)",
                 "(default: both)", "(default: 128)", "(default: 2048)", "(default: auto)", "(default: 1)"]),
    (["serve"], ["(default: 8000)", "(default: 8)", "(default: 1024)", "(default: 30)", "default 127.0.0.1"]),
    (["loadtest"], ["(default: http://127.0.0.1:8000)", "(default: 1,2,4,8)", "(default: 30)", "(default: both)",
                    "(default: 64)", "(default: mixed)"]),
])
def test_help_states_the_defaults(argv, says, capsys):
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in out and "(default: False)" not in out
    for text in says:
        assert text in out


@pytest.mark.parametrize("command", ["bench", "calibrate", "loadtest"])
def test_every_command_reading_a_workload_says_what_a_workload_file_holds(command, capsys):
    """--help said only "a .jsonl path": the fields of a line were in a docstring of serving/workloads."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for said in ("workload files (--workload PATH):", 'exactly one of "prompt" (a user prompt) or "messages"',
                 'optionally "id" (default: the file\'s name and line, prompts.jsonl:3) and "domain" (default: custom)',
                 '{"prompt": "Write a haiku about tea."}', "PATH.txt one prompt a line",
                 "A file is recorded by its absolute path"):
        assert said in out, (command, said)


def test_a_help_that_states_its_default_is_not_given_a_second(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "torch: the built-in engine (default); vllm:" in out and "(default: torch)" not in out
    assert "0 = greedy (default) --top-p" in out.replace("\n", " ")
    assert out.count("(default: 4)") == 1  # --interleave says it once


def test_project_usage_shows_the_traffic_profile_as_required(capsys):
    with pytest.raises(SystemExit):
        main(["project", "--help"])
    out = capsys.readouterr().out
    usage = " ".join(out.split("\n\n")[0].split())
    assert "--daily-tokens N --peak-factor F --p95-tpot-sla-ms X" in usage
    for flag in ("--daily-tokens", "--peak-factor", "--p95-tpot-sla-ms"):
        assert f"[{flag}" not in usage
    assert "required options" in out


def test_project_missing_the_traffic_profile_is_still_one_line(empty_store, capsys):
    assert main(["project", "--db", empty_store, "--peak-factor", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["specfinops project: error: missing --daily-tokens, --p95-tpot-sla-ms"]


def test_version_prints_the_installed_version(capsys):
    """`specfinops --version` / `-V` (a wheel's user had only pip to ask): the installed distribution's version."""
    from importlib.metadata import version

    from app.cli import main

    for flag in ("--version", "-V"):
        with pytest.raises(SystemExit) as stop:
            main([flag])
        assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"specfinops {version('specfinops')}"


@pytest.mark.parametrize(("argv", "dest"), [
    (["report", "--period", "daily", "--out", "r"], "sla_ms"),
    (["scheduler"], "sla_ms"),
    (["project"], "p95_tpot_sla_ms"),
])
@pytest.mark.parametrize("name", ["--sla-ms", "--p95-tpot-sla-ms"])
def test_the_sla_takes_either_name_on_each_command(argv, dest, name):
    """project named it --p95-tpot-sla-ms, report and scheduler --sla-ms: each takes both, into one option."""
    args = build_parser().parse_args([*argv, name, "40"])
    assert getattr(args, dest) == "40"


@pytest.mark.parametrize(("command", "dest"), [("calibrate", "draft"), ("bench", "draft_model"),
                                               ("serve", "draft_model")])
@pytest.mark.parametrize("name", ["--draft", "--draft-model"])
def test_the_draft_model_takes_either_name_on_each_command(command, dest, name):
    """bench and serve named it --draft-model, calibrate --draft: each takes both, into one option."""
    args = build_parser().parse_args([command, name, "/models/d"])
    assert getattr(args, dest) == "/models/d"


@pytest.mark.parametrize(("command", "says"), [
    ("report", "--sla-ms, --p95-tpot-sla-ms X p95 TPOT SLA"),
    ("scheduler", "--sla-ms, --p95-tpot-sla-ms X p95 TPOT SLA"),
    ("project", "--p95-tpot-sla-ms, --sla-ms X p95 time per output token"),
    ("calibrate", "--draft, --draft-model DRAFT draft model directory"),
    ("bench", "--draft-model, --draft DRAFT_MODEL draft model directory"),
    ("serve", "--draft-model, --draft DRAFT_MODEL draft model directory"),
])
def test_help_names_an_alias_beside_its_option_and_the_value_once(command, says, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert says in out


def test_report_and_scheduler_take_the_prices_project_takes():
    """`report --gpu H100` was 'unrecognized arguments': report and scheduler take project's pricing options."""
    parser = build_parser()
    project = {a.dest for a in parser.parse_args(["project"]).command_parser._actions}
    pricing = {"gpu", "gpus_per_node", "node_hourly_usd", "usd_per_kwh", "pue"}
    assert pricing <= project
    for argv in (["report", "--period", "daily", "--out", "r"], ["scheduler"]):
        args = parser.parse_args([*argv, "--gpu", "H100", "--gpus-per-node", "8", "--usd-per-kwh", "0.1",
                                  "--pue", "1.3"])
        assert (args.gpu, args.gpus_per_node, args.usd_per_kwh, args.pue) == ("H100", "8", "0.1", "1.3")
        assert parser.parse_args([*argv, "--node-hourly-usd", "44"]).node_hourly_usd == "44"


def _readme_command_lines() -> list[str]:
    """Every `specfinops ...` line of the README's bash blocks, a comment and a pipe cut off."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", readme, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" | ")[0].strip()
            if line.startswith("specfinops "):
                lines.append(line)
    return lines


@pytest.mark.parametrize("line", _readme_command_lines())
def test_every_readme_command_parses(line):
    """A README line a user copies must at least be a command line specfinops takes (options, choices and
    values of the right kind): run as written, a renamed or misspelt option would stop them at once."""
    import shlex

    from app.cli import build_parser

    argv = [a for a in shlex.split(line, comments=True)[1:] if a != "..."]
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:
        raise AssertionError(f"README: {line!r} does not parse") from e


def test_the_readme_decision_block_prices_the_measured_machine_as_its_own():
    """The README's "Does it pay?" block set `prices set my-node 12 --kind node` and projected with `--gpu my-node`:
    an entry not named after the measured device is other hardware, so the projection warned that its node counts
    were not my-node's and left the measured energy out. Its project and report lines price the measured machine
    (--node-hourly-usd), and any --gpu entry they name holds the device's model as step 4 says."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = re.search(r"### Does it pay\?.*?```bash\n(.*?)```", readme, flags=re.S).group(1)
    priced = [line for line in block.splitlines() if line.startswith(("specfinops project", "specfinops report"))]
    assert len(priced) == 2, block
    for line in priced:
        assert "--node-hourly-usd" in line or '--gpu "' in line, line
        assert "my-node" not in line, line


@pytest.mark.parametrize(("name", "parser"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_command_has_a_description(name, parser):
    """`models list --help` and `models path --help` printed a usage line and the options, nothing of what the
    command does."""
    assert parser.description and parser.description.strip(), f"{name}: no description line in its --help"


@pytest.mark.parametrize(("command", "option", "says"), [
    ("bench", "--limit", "default: all prompts"),
    ("bench", "--domain", "default: all domains"),
    ("bench", "--tdp-w", "--power auto's fallback where neither NVML nor RAPL can be read"),
    ("serve", "--tdp-w", "--power auto's fallback where neither NVML nor RAPL can be read"),
])
def test_an_option_whose_default_is_everything_says_so(command, option, says):
    """What --limit and --domain do when not given (every prompt, every domain), and where --tdp-w is used:
    telemetry.power.detect_power_source falls back to the estimate under 'auto' where no meter opens."""
    parser = dict(COMMANDS)[f"specfinops {command}"]
    (action,) = [a for a in parser._actions if option in a.option_strings]
    assert says in _help_of(parser, action)
