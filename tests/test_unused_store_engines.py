"""A bench or calibrate refused or stopped before its first run removes the store file it created (store_opened_for,
remove_unused_store), which a connection still open keeps (in use): an engine left undisposed inside the block (the
one `--spec-max-batch auto` read the store with, the recorder's where the power meter could not be opened, the
exception's traceback holding it alive) kept new.db, -wal and -shm behind. Tiny random models."""

from __future__ import annotations

import pytest

import telemetry.power as power
from app.cli import main
from tests.test_bench_loadtest_edges import _tiny_bench, no_kernel_races, target  # noqa: F401 (fixtures)
from tests.test_calibrate_record import _calibrate, pair, workload  # noqa: F401 (fixtures)


def _left(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_spec_max_batch_auto_without_a_sweep_leaves_no_store_behind(target, tmp_path, capsys):  # noqa: F811
    db = tmp_path / "sub" / "new.db"
    assert main(_tiny_bench(target, "--db", str(db), "--limit", "1", "--spec-max-batch", "auto")) == 2
    assert "no concurrency sweep recorded" in capsys.readouterr().err
    assert _left(tmp_path / "sub") == [], "left behind"
    assert not (tmp_path / "sub").exists()


def test_a_power_meter_that_cannot_be_read_leaves_no_store_behind(target, tmp_path, monkeypatch,  # noqa: F811
                                                                  capsys):
    def no_meter(kind, **_kw):
        raise ValueError(f"--power {kind}: no meter here")

    monkeypatch.setattr(power, "detect_power_source", no_meter)
    db = tmp_path / "sub" / "new.db"
    assert main(_tiny_bench(target, "--db", str(db), "--limit", "1", "--power", "nvml")) == 2
    capsys.readouterr()
    assert _left(tmp_path / "sub") == [], "left behind"


def test_calibrate_stopped_while_its_meter_opens_leaves_no_store_behind(pair, workload,  # noqa: F811
                                                                        tmp_path, monkeypatch, capsys):
    def stopped(kind, **_kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(power, "detect_power_source", stopped)
    db = tmp_path / "sub" / "new.db"
    assert _calibrate(pair, workload, "--db", f"sqlite:///{db}") == 130
    capsys.readouterr()
    assert _left(tmp_path / "sub") == [], "left behind"


def test_an_engine_the_block_left_open_does_not_keep_the_store_it_made(tmp_path):
    """Whatever path in the block leaves an engine on the new store open (here: opened and dropped, the exception's
    traceback holding it), store_opened_for disposes of it before the store is checked and removed."""
    from sqlalchemy import text

    from app.commands._common import store_opened_for
    from telemetry.store import open_store

    db = tmp_path / "sub" / "new.db"
    with pytest.raises(RuntimeError, match="refused"):
        with store_opened_for(str(db), no_telemetry=False):
            store = open_store(str(db), must_exist=True)
            with store.connect() as conn:
                conn.execute(text("select count(*) from runs")).scalar_one()
            raise RuntimeError("refused")
    assert _left(tmp_path / "sub") == [], "left behind"
    assert store is not None  # held to the end, as the traceback held it


def test_a_store_that_holds_a_run_stays_with_its_engines_disposed(tmp_path):
    """Disposing of the block's engines removes nothing of what the removal rule keeps: a store with a row."""
    from sqlalchemy import text

    from app.commands._common import store_opened_for
    from telemetry.store import open_store

    db = tmp_path / "sub" / "new.db"
    with pytest.raises(RuntimeError):
        with store_opened_for(str(db), no_telemetry=False):
            store = open_store(str(db))
            with store.begin() as conn:
                conn.execute(text("insert into prices (name, kind, value, unit, source, as_of, updated_at) "
                                  "values ('x', 'node', 1, 'usd_per_hour', '', '', '2026-01-01')"))
            raise RuntimeError("failed")
    assert db.exists()
    store.dispose()
