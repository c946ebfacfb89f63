"""Reading the price catalog writes nothing: a read-only store can be listed and priced.

list_prices and get_price used to INSERT the default prices first, so `specfinops prices` on a read-only
store failed ('cannot execute INSERT in a read-only transaction' on PostgreSQL, 'attempt to write a readonly
database' on a 0444 SQLite file), and so did `project --gpu H100` and the dashboard's price table.
"""

from __future__ import annotations

from sqlalchemy import create_engine, func, insert, select

from app.cli import main as cli_main
from telemetry.db import Price, make_engine
from telemetry.prices import default_entries, get_price, list_prices, set_price
from telemetry.store import open_store

READ_ONLY = "?options=-c%20default_transaction_read_only%3Don"  # every transaction of the session read-only


def _stored_names(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return sorted(c.scalars(select(Price.name)))
    finally:
        engine.dispose()


def test_prices_on_a_read_only_postgresql_connection(pg_url, capsys):
    engine = open_store(pg_url)
    with engine.begin() as c:  # one stored entry, as a store written by hand holds; the others are defaults
        c.execute(insert(Price).values(name="L4", kind="gpu", value=0.91, unit="usd_per_hour", source="our quote",
                                       as_of="2026-12-01"))
    engine.dispose()
    ro = open_store(pg_url + READ_ONLY, must_exist=True)
    try:
        with ro.connect() as c:
            assert c.exec_driver_sql("SHOW transaction_read_only").scalar() == "on"
        entries = {e.name: e for e in list_prices(ro)}
        assert {e.name for e in default_entries()} <= set(entries)
        assert entries["L4"].value == 0.91 and entries["L4"].source == "our quote"
        assert get_price(ro, "h100").name == "H100" and get_price(ro, "l4").value == 0.91
    finally:
        ro.dispose()
    assert cli_main(["prices", "--db", pg_url + READ_ONLY]) == 0
    out = capsys.readouterr().out
    assert "our quote" in out and "H100" in out
    assert _stored_names(pg_url) == ["L4"]  # nothing was written by the reads


def test_prices_on_a_sqlite_store_opened_read_only(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    set_price(engine, "h100", 9.99, source="our quote")  # a default's name: stored in the default's spelling
    engine.dispose()
    path = sqlite_url.removeprefix("sqlite:///")
    ro_url = f"sqlite:///file:{path}?mode=ro&uri=true"
    ro = make_engine(ro_url)
    try:
        assert get_price(ro, "H100").value == 9.99 and get_price(ro, "electricity").value > 0
        assert len(list_prices(ro)) == len(default_entries())
    finally:
        ro.dispose()
    assert cli_main(["prices", "--db", ro_url]) == 0
    out, err = capsys.readouterr()
    assert "9.99" in out and "our quote" in out and "no store" not in err  # this store's catalog, not defaults
    assert _stored_names(sqlite_url) == ["H100"]


def test_reading_prices_leaves_the_table_as_it_was(empty_store):
    engine = open_store(empty_store)
    list_prices(engine)
    get_price(engine, "pue")
    with engine.connect() as c:
        assert c.scalar(select(func.count()).select_from(Price)) == 0
    engine.dispose()
