"""The price catalog's validation: what `set_price` accepts, and what it says when it refuses."""

from __future__ import annotations

import pytest

from telemetry.prices import (
    check_price,
    energy_prices,
    get_price,
    list_prices,
    load_catalog,
    resolve_node_price,
    set_price,
)
from telemetry.store import open_store


def test_electricity_may_cost_nothing_but_hardware_may_not(empty_store):
    engine = open_store(empty_store)
    assert set_price(engine, "electricity", 0.0, source="own solar").value == 0.0
    assert get_price(engine, "electricity").value == 0.0
    with pytest.raises(ValueError, match="value of a gpu price must be > 0"):
        set_price(engine, "H100", 0.0, source="free?")
    with pytest.raises(ValueError, match="value of a node price must be > 0"):
        set_price(engine, "new-node", 0.0, source="free?", kind="node")
    with pytest.raises(ValueError, match="PUE must be >= 1"):
        set_price(engine, "pue", 0.0, source="x")
    with pytest.raises(ValueError, match="value must be a number >= 0"):
        set_price(engine, "electricity", -0.1, source="x")
    engine.dispose()


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"as_of": "2026-13-45"}, "--as-of must be a date YYYY-MM-DD"),
    ({"kind": "gpu", "value": 0.0}, "value of a gpu price must be > 0"),
    ({"kind": "spaceship"}, "kind must be one of"),
    ({"source": " "}, "source must say where"),
    ({"value": float("nan")}, "value must be a number >= 0"),
    # SQLite folds ASCII letters only: 'ÄBC' and 'äbc' were two entries there, one of them never read
    ({"name": "ÄBC"}, "name must be printable ASCII"),
    ({"name": "a\tb"}, "name must be printable ASCII"),
    # energy is priced at the entries named electricity and pue: another of their kind was never read
    ({"name": "cheap-solar", "kind": "electricity", "value": 0.02}, "'cheap-solar' would never be used"),
    ({"name": "site-pue", "kind": "pue", "value": 1.3}, "'site-pue' would never be used"),
    ({"source": "line one\nline two"}, "source must be one line"),  # it broke `prices`' table into rows
    ({"source": "q" * 501}, "of at most 500 printable characters"),
])
def test_check_price_needs_no_store(kwargs, needle):
    args = {"name": "X", "value": 1.0, "source": "quote"} | kwargs
    with pytest.raises(ValueError, match=needle):
        check_price(args.pop("name"), args.pop("value"), **args)


def test_check_price_normalises_the_date():
    assert check_price("electricity", 0, source="x", kind="electricity", as_of=" 2026-01-05 ") == (0.0, "2026-01-05")


def test_a_gpu_flag_naming_a_non_hourly_entry_reads_well(empty_store):
    engine = open_store(empty_store)
    with pytest.raises(ValueError) as exc:
        resolve_node_price(engine, device="cpu", gpu="electricity")
    assert str(exc.value) == ("--gpu 'electricity' names the electricity price (usd_per_kwh), not an hourly GPU "
                              "or node price")
    engine.dispose()


def _statements(engine) -> list[str]:
    """The SQL statements the engine runs from now on (appended to the returned list)."""
    from sqlalchemy import event

    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, statement, *_: seen.append(statement))
    return seen


def test_a_catalog_read_once_prices_every_run_without_a_query(empty_store):
    """costs() priced each run with ~4 catalog queries (195 statements for 48 runs on PostgreSQL). One
    load_catalog reads the table once; resolve_node_price and energy_prices given it query nothing and
    answer as they do from the table, edits made with set_price included."""
    engine = open_store(empty_store)
    set_price(engine, "h100", 7.5, source="our quote")  # edits an existing default, named in another case
    set_price(engine, "my-node", 12.0, source="colo", kind="node")
    set_price(engine, "electricity", 0.2, source="tariff")
    seen = _statements(engine)
    catalog = load_catalog(engine)
    assert len(seen) == 1  # one SELECT

    cases = [
        {"device": "NVIDIA H100 80GB HBM3"},
        {"device": "cpu (2 cores)"},
        {"device": "NVIDIA A100-SXM4-80GB", "gpu": "my-node"},
        {"device": "NVIDIA L4", "gpu": "H100", "gpus_per_node": 8},
        {"device": "NVIDIA H100 80GB HBM3", "price_snapshot": {"node_hourly_usd": 55.04, "name": "H100 x8"}},
        {"device": "NVIDIA H100 80GB HBM3", "node_hourly_usd": 9.0},
    ]
    for kwargs in cases * 8:  # 48 runs
        seen.clear()
        got = resolve_node_price(engine, **kwargs, catalog=catalog), energy_prices(engine, catalog=catalog)
        assert seen == [], kwargs
        assert got == (resolve_node_price(engine, **kwargs), energy_prices(engine)), kwargs
    assert resolve_node_price(engine, device="NVIDIA H100 80GB HBM3", catalog=catalog).usd_per_hour == 7.5
    assert energy_prices(engine, catalog=catalog)[0] == 0.2
    assert list(catalog.entries) == sorted(list_prices(engine), key=lambda e: (e.kind, e.name))
    # what it cannot price it refuses in the same words
    for name in ("B200", " nosuch "):
        with pytest.raises(ValueError) as from_table:
            get_price(engine, name)
        with pytest.raises(ValueError) as from_catalog:
            catalog.get(name)
        assert str(from_catalog.value) == str(from_table.value)
    with pytest.raises(ValueError, match="no catalog price matches device 'TPU v5e'"):
        resolve_node_price(engine, device="TPU v5e", catalog=catalog)
    engine.dispose()


def test_loading_the_catalog_writes_nothing(empty_store):
    """A store whose prices table is still empty: the catalog holds the defaults (as get_price would insert
    them) and the table stays empty, so commands that only report write nothing."""
    from sqlalchemy import func, select

    from telemetry.db import Price

    engine = open_store(empty_store)
    with engine.connect() as c:
        assert c.scalar(select(func.count()).select_from(Price)) == 0
    catalog = load_catalog(engine)
    with engine.connect() as c:
        assert c.scalar(select(func.count()).select_from(Price)) == 0
    assert catalog.energy_prices() == energy_prices(engine)  # energy_prices loads the defaults into the table
    assert list(catalog.entries) == sorted(list_prices(engine), key=lambda e: (e.kind, e.name))
    engine.dispose()


def test_set_price_returns_what_it_wrote_not_a_concurrent_writers_value(sqlite_url):
    """`prices set` printed the row read back after its commit: with four writers at once, one printed
    another's source. The entry returned is the one this call wrote, whatever commits after it."""
    from sqlalchemy import event, update

    from telemetry.db import Price
    from telemetry.prices import set_price
    from telemetry.store import open_store

    engine = open_store(sqlite_url)
    set_price(engine, "cpu-2core", 0.1, source="first")

    done = []

    def another_writer(session):  # commits between this call's commit and any read-back
        if not done:
            done.append(True)
            with engine.begin() as c:
                c.execute(update(Price).where(Price.name == "cpu-2core").values(source="someone else", value=9.0))

    from sqlalchemy.orm import Session

    event.listen(Session, "after_commit", another_writer)
    try:
        e = set_price(engine, "cpu-2core", 0.2, source="mine")
    finally:
        event.remove(Session, "after_commit", another_writer)
    assert done
    assert (e.value, e.source) == (0.2, "mine")


@pytest.mark.parametrize(("text", "chip"), [
    ("NVIDIA H100 80GB HBM3", "H100"), ("H100-SXM", "H100"), ("my-h100-reserved", "H100"), ("H100", "H100"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("A100-80GB-lambda", "A100"), ("NVIDIA L4", "L4"),
    # several GPUs, however the count is written: not the hardware of the one device a run measured
    ("H100 x8", None), ("H100x8", None), ("8x H100", None), ("p5.48xlarge (8x H100)", None), ("h100-8gpu", None),
    ("H100 x8 reserved", None), ("H100×8", None), ("cuda: NVIDIA H100 80GB HBM3 x 8 (tp 8)", None),
    # other chips, and CPUs (a CPU node's price stands for its own size)
    ("RTX A1000", None), ("NVIDIA L40S", None), ("GH200", None), ("cpu (2 cores)", None), ("cpu-64core", None),
    ("reserved-node-7", None), ("", None),
])
def test_gpu_chip_names_the_one_gpu_of_a_device_or_a_price_entry(text, chip):
    from telemetry.prices import gpu_chip

    assert gpu_chip(text) == chip


def test_hourly_entry_lists_the_hourly_entries_where_the_name_is_unknown(empty_store):
    from telemetry.prices import hourly_entry, load_catalog

    engine = open_store(empty_store)
    catalog = load_catalog(engine)
    assert hourly_entry(catalog, "h100").name == "H100"
    with pytest.raises(ValueError) as exc:
        hourly_entry(catalog, "h10")
    hourly = sorted((e.name for e in catalog.entries if e.unit == "usd_per_hour"), key=str.lower)
    assert str(exc.value) == f"--gpu: unknown price name 'h10'; known: {', '.join(hourly)}"
    assert "electricity" not in str(exc.value) and "pue" not in str(exc.value)
    engine.dispose()
