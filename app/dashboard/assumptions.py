"""Traffic and price assumptions for the node projection, shared by the Overview and Cost & capacity pages.

The Cost & capacity page edits them with widgets; the Overview shows the savings they give. They live in
`st.session_state` so a change on one page holds on the other.
"""

from __future__ import annotations

import streamlit as st

KEY = "_specfinops_assumptions"
DEFAULTS: dict = {
    "daily_tokens": 500_000_000.0,  # 500M output tokens/day: a mid-size production service
    "peak_factor": 2.0,  # provision for twice the average load
    "sla_ms": 50.0,  # p95 TPOT SLA
    "gpu": None,  # None: the runs' price snapshot, else the catalog price of the measured device
    "gpus_per_node": 1,
    "node_hourly_usd": None,
    "usd_per_kwh": None,  # None: the catalog's electricity price
    "pue": None,  # None: the catalog's PUE
}


def get() -> dict:
    """The current assumptions (defaults until the Cost & capacity page changes them)."""
    return dict(st.session_state.get(KEY) or DEFAULTS)


def put(values: dict) -> None:
    st.session_state[KEY] = {k: values.get(k, v) for k, v in DEFAULTS.items()}


def describe(a: dict) -> str:
    price = (f"${a['node_hourly_usd']:g}/h per node" if a.get("node_hourly_usd")
             else f"{a['gpu']} x{a['gpus_per_node']}" if a.get("gpu") and a["gpus_per_node"] > 1
             else f"{a['gpu']} per GPU of the measured device" if a.get("gpu") else "the runs' recorded node price")
    return (f"{a['daily_tokens'] / 1e6:,.0f}M tokens/day, peak x{a['peak_factor']:g}, "
            f"p95 TPOT SLA {a['sla_ms']:g} ms, {price}")
