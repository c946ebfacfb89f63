"""Price names are unique in any case, and `prices set` of a name another writer creates at that moment updates
it instead of failing.

Two `prices set` of one new name at once failed 4 of 8 tries with a raw 'UNIQUE constraint failed: prices.name'
(PostgreSQL: 'duplicate key value violates unique constraint "uq_prices_name"'); mynode3 and MyNode3 at once
left two rows differing only in case, and a look-up then picked either.
"""

from __future__ import annotations

import logging

import pytest
from alembic import command
from racing import race
from sqlalchemy import create_engine, insert, inspect, text
from sqlalchemy.exc import IntegrityError

from telemetry.db import Price
from telemetry.prices import get_price, set_price
from telemetry.store import alembic_config, open_store

SPELLINGS = ["mynode{n}", "MyNode{n}", "MYNODE{n}", "mynode{n}"]


def _rows(url: str, key: str) -> list[tuple[str, float, str]]:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return c.execute(text("SELECT name, value, source FROM prices WHERE lower(name) = :k ORDER BY id"),
                             {"k": key}).all()
    finally:
        engine.dispose()


def test_concurrent_sets_of_one_new_name_in_any_case_make_one_row(db_url, tmp_path):
    open_store(db_url).dispose()
    url = db_url.replace("postgres@", "postgres:s3cr3t@")
    for n in range(3):
        commands = [["prices", "set", spelling.format(n=n), str(i + 1), "--kind", "node", "--source", f"writer {i}",
                     "--db", url] for i, spelling in enumerate(SPELLINGS)]  # fmt: skip
        for r in race(tmp_path / str(n), commands):
            assert r.returncode == 0, f"{r.args}: {r.stderr}"
            assert "s3cr3t" not in r.stdout + r.stderr
        rows = _rows(db_url, f"mynode{n}")
        assert len(rows) == 1, rows
        name, value, source = rows[0]
        assert (name.lower(), source) == (f"mynode{n}", f"writer {int(value) - 1}")  # one writer's whole entry


def test_a_lost_insert_is_retried_as_an_update(empty_store, monkeypatch):
    """Deterministically: another writer commits MyNode between this call's look-up and its insert."""
    import telemetry.prices as prices

    engine = open_store(empty_store)
    real_find = prices._find
    calls = []

    def find_then_another_writer(s, name):
        row = real_find(s, name)
        if not calls:
            calls.append(name)
            with engine.begin() as c:
                c.execute(insert(Price).values(name="MyNode", kind="node", value=1.0, unit="usd_per_hour",
                                               source="other", as_of="2026-12-01"))
        return row

    monkeypatch.setattr(prices, "_find", find_then_another_writer)
    entry = set_price(engine, "mynode", 2.5, source="mine", kind="node")
    assert (entry.name, entry.value, entry.source) == ("MyNode", 2.5, "mine")
    assert _rows(empty_store, "mynode") == [("MyNode", 2.5, "mine")]
    with pytest.raises(ValueError, match="kind of 'MyNode' is 'node', cannot change it to 'gpu'"):
        set_price(engine, "MYNODE", 3.0, source="x", kind="gpu")
    assert get_price(engine, "MYNODE").value == 2.5
    engine.dispose()


def _store_at_0006_with_case_duplicates(db_url: str):
    """A store at 0006 whose prices hold names that differ only in case (0007 merges them): its config, engine."""
    cfg = alembic_config(db_url)
    command.upgrade(cfg, "0006")
    engine = create_engine(db_url)
    rows = [("mynode3", 1.0, "2026-12-01 10:00:00"), ("MyNode3", 2.0, "2026-12-03 10:00:00"),
            ("MYNODE3", 3.0, "2026-12-02 10:00:00"), ("other", 4.0, "2026-12-01 10:00:00"),
            ("h100", 5.0, "2026-12-01 10:00:00"), ("H100", 6.0, "2026-12-01 10:00:00")]  # fmt: skip
    with engine.begin() as c:
        for name, value, updated in rows:
            c.execute(text("INSERT INTO prices (name, kind, value, unit, source, as_of, updated_at) VALUES "
                           "(:n, 'node', :v, 'usd_per_hour', 's', '2026-12-01', :u)"), {"n": name, "v": value, "u": updated})
    return cfg, engine


def test_migration_0007_merges_names_that_differ_only_in_case(db_url, caplog):
    """A store that got such duplicates keeps, per name, the row set last (latest updated_at, then highest
    id) and says which it removed; then the database refuses another one. Downgrade drops the index only."""
    cfg, engine = _store_at_0006_with_case_duplicates(db_url)
    with caplog.at_level(logging.WARNING):
        command.upgrade(cfg, "0007")
    with engine.connect() as c:
        left = c.execute(text("SELECT name, value FROM prices ORDER BY name")).all()
    assert left == [("H100", 6.0), ("MyNode3", 2.0), ("other", 4.0)]  # set at the same time: the higher id
    said = caplog.text
    assert "kept 'MyNode3' = 2.0 (set last), removed 'MYNODE3' = 3.0, 'mynode3' = 1.0" in said, said
    with pytest.raises(IntegrityError), engine.begin() as c:
        c.execute(text("INSERT INTO prices (name, kind, value, unit, source, as_of, updated_at) VALUES "
                       "('OTHER', 'node', 1, 'usd_per_hour', 's', '', '2026-12-04 10:00:00')"))
    command.downgrade(cfg, "0006")
    assert "uq_prices_name_lower" not in {ix["name"] for ix in inspect(engine).get_indexes("prices")}
    with engine.begin() as c:
        c.execute(text("INSERT INTO prices (name, kind, value, unit, source, as_of, updated_at) VALUES "
                       "('OTHER', 'node', 1, 'usd_per_hour', 's', '', '2026-12-04 10:00:00')"))
    engine.dispose()
    command.upgrade(cfg, "head")  # and merges again
    assert [r[0] for r in _rows(db_url, "other")] == ["OTHER"]


def test_migration_0007_offline_emits_the_merge(db_url):
    """`alembic upgrade --sql` (offline: no database to read) crashed in 0007: 'NoneType' object has no attribute
    'scalars'. It emits the merge as one DELETE, which keeps what the online merge keeps."""
    import io

    cfg, engine = _store_at_0006_with_case_duplicates(db_url)
    offline = alembic_config(db_url)
    offline.output_buffer = io.StringIO()
    command.upgrade(offline, "0006:0007", sql=True)
    script = offline.output_buffer.getvalue()
    merge = [line.rstrip(";") for line in script.splitlines() if line.startswith("DELETE FROM prices")]
    assert len(merge) == 1 and "CREATE UNIQUE INDEX uq_prices_name_lower" in script, script
    with engine.begin() as c:
        c.execute(text(merge[0]))
        left = c.execute(text("SELECT name, value FROM prices ORDER BY name")).all()
    engine.dispose()
    assert left == [("H100", 6.0), ("MyNode3", 2.0), ("other", 4.0)]  # as the online merge keeps
