"""The price catalog's validation: what `set_price` accepts, and what it says when it refuses."""

from __future__ import annotations

import pytest

from telemetry.prices import check_price, get_price, resolve_node_price, set_price
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
