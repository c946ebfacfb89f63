"""Every column `specfinops export` writes is named in docs/export.md, the page `export --help` points to."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.cli import main
from telemetry.export import COST_HEADER, EXPORT_KINDS, QUERIES, ExportWindow

DOC = Path(__file__).resolve().parents[1] / "docs" / "export.md"


def _header(what: str) -> list[str]:
    """The header an export of `what` writes, read where export_rows takes it from."""
    if what == "cost":
        return list(COST_HEADER)
    return [c.name for c in QUERIES[what](ExportWindow()).selected_columns]


def _section(what: str) -> str:
    text = DOC.read_text()
    match = re.search(rf"^## `--what {what}`.*?(?=^## |\Z)", text, re.S | re.M)
    assert match, f"docs/export.md has no section for --what {what}"
    return match.group(0)


@pytest.mark.parametrize("what", EXPORT_KINDS)
def test_every_exported_column_is_documented_in_its_section(what):
    section = _section(what)
    documented = set(re.findall(r"^- `([a-z_0-9]+)`", section, re.M))
    header = _header(what)
    assert header, what
    missing = [c for c in header if c not in documented]
    assert not missing, f"docs/export.md's --what {what} section does not name {missing}"
    assert not documented - set(header), f"docs/export.md names columns --what {what} does not write"


def test_the_cost_section_names_where_cost_json_keys_differ():
    section = _section("cost")
    for column, key in (("node_usd_per_hour", "node_hourly_usd"), ("note", "reason"), ("device", "measured_on")):
        assert f"| `{column}` | `{key}` |" in section


def test_export_help_points_to_the_column_reference(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    assert "docs/export.md" in capsys.readouterr().out


def test_the_device_and_node_examples_are_what_runs_record(monkeypatch):
    """docs/export.md gave `cpu (2 cores)` as a device (runs record `cpu: MODEL (N threads)`) and left
    SPECFINOPS_NODE_ID out of node_id's precedence (`--node-id`, else SPECFINOPS_NODE_ID, else the host name)."""
    from serving.worker import default_node_id, device_name

    assert re.fullmatch(r"cpu: .+ \(\d+ threads\)", device_name()), device_name()
    device = re.search(r"^- `device` \(text\): (.*?)(?=^- `)", _section("cost"), re.S | re.M).group(1)
    examples = re.findall(r"`(cpu[ :(][^`]*)`", device)
    assert examples and all(re.fullmatch(r"cpu: .+ \(\d+ threads\)", e) for e in examples), examples
    monkeypatch.setenv("SPECFINOPS_NODE_ID", "gpu-node-7")
    assert default_node_id() == "gpu-node-7"
    said = re.search(r"^- `node_id` \(text\): (.*)$", _section("requests"), re.M).group(1)
    order = [said.find(w) for w in ("`--node-id`", "`SPECFINOPS_NODE_ID`", "host name")]
    assert -1 not in order and order == sorted(order), said


@pytest.mark.parametrize("command", ["bench", "serve", "loadtest"])
def test_node_id_help_names_the_environment_variable(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    help_ = " ".join(capsys.readouterr().out.split())
    assert "$SPECFINOPS_NODE_ID, else the host name" in help_, help_


def test_the_readme_says_how_to_open_the_bom_less_utf8_csv_in_excel(sqlite_url, tmp_path):
    """Export CSVs carry no byte-order mark, so Excel's double-click shows non-ASCII text as mojibake: the README's
    export section says so and how to open them (Data > From Text/CSV)."""
    from sqlalchemy.orm import Session
    from synthetic import Req, make_run

    from telemetry.store import open_store

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", workload="café", requests=[Req(8, ttft_ms=10, e2e_ms=80)])
        s.commit()
    engine.dispose()
    out = tmp_path / "r.csv"
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", str(out)]) == 0
    raw = out.read_bytes()
    assert not raw.startswith(b"\xef\xbb\xbf") and "café".encode() in raw  # UTF-8, no BOM: what the note says
    readme = (DOC.parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("is listed in [docs/export.md]"):][:600]
    assert "UTF-8 without a byte-order mark" in section and "Data > From Text/CSV" in section


@pytest.mark.parametrize("doc", ["export.md", "reports.md"])
def test_the_csv_docs_say_how_to_open_the_bom_less_utf8_csv_in_excel(doc):
    """Only the README said how to open the BOM-less UTF-8 CSVs in Excel; the pages on export's and report's
    CSV files, where a reader of those files looks, said nothing."""
    text = " ".join((DOC.parent / doc).read_text(encoding="utf-8").split())
    assert "UTF-8 without a byte-order mark" in text and "Data > From Text/CSV" in text
    assert '"65001: Unicode (UTF-8)"' in text
