"""Dashboard entry file: `streamlit run app/dashboard/main.py` (or `specfinops dashboard --db URL`).

Small on purpose: page setup, the sidebar filters (here, so they hold across pages) and the navigation.
Pages live one per file under `views/`, not `pages/`: Streamlit lists a `pages/` folder beside the entry
file as pages of its own, and a deep link such as /cost then showed those file names in place of this
navigation. Data access in `data.py`, charts in `charts.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `streamlit run` puts only this file's folder on the path
    sys.path.insert(0, str(ROOT))

from app.dashboard import common  # noqa: E402
from telemetry.queries import reuse_collections  # noqa: E402

PAGES = [
    st.Page("views/overview.py", title="Overview", icon=":material/dashboard:", default=True),
    st.Page("views/latency.py", title="Latency", icon=":material/timer:"),
    st.Page("views/speculation.py", title="Speculation", icon=":material/call_split:"),
    st.Page("views/energy.py", title="Energy", icon=":material/bolt:"),
    st.Page("views/cost.py", title="Cost & capacity", icon=":material/payments:"),
    st.Page("views/runs.py", title="Runs", icon=":material/table:"),
    st.Page("views/reports.py", title="Reports", icon=":material/description:"),
]

st.set_page_config(page_title="specfinops", page_icon="⚡", layout="wide")
page = st.navigation(PAGES)
common.prepare()
with reuse_collections():  # the page's summaries over one filter read the requests once
    page.run()
