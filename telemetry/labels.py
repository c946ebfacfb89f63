"""Short labels for long names, shared by the dashboard and the reports: a model directory or a workload file by
its last part, a CPU's brand string without its trademark marks; and where the charts of both put their labels."""

from __future__ import annotations

import html
import math
import re
from decimal import Decimal
from typing import Any


def short_model(name: Any) -> Any:
    """A model as a label: a local directory by its last path component (the cache path of a bundled model
    ran past every box and column it was shown in), a Hugging Face cache snapshot by its hub id (`hub_id`); a
    hub-style id or a name as it is."""
    if not isinstance(name, str) or not name.startswith(("/", "./", "../", "~")):
        return name
    return hub_id(name) or name.rstrip("/").rsplit("/", 1)[-1] or name


def hub_id(path: Any) -> str | None:
    """The hub id ORG/NAME of a directory in a Hugging Face cache (.../models--ORG--NAME/snapshots/<commit>),
    whose last component, the commit hash, named no model; None for any other path."""
    parts = str(path).rstrip("/").split("/")
    if len(parts) < 3 or parts[-2] != "snapshots" or not parts[-3].startswith("models--"):
        return None
    org, sep, model = parts[-3].removeprefix("models--").partition("--")
    return f"{org}/{model}" if sep and org and model else parts[-3].removeprefix("models--") or None


def short_workload(name: Any) -> Any:
    """A workload as a label: a workload file by its file name (runs record its absolute path, which ran past the
    column it was shown in: `cost` showed '/home/me/pro'); a builtin name (code, mixed) as it is."""
    return short_model(name)


_DEVICE_NOISE = re.compile(r"\((?:R|TM|tm|r)\)|\bProcessor\b|\bCPU\b(?=.*@)")


def short_device(name: Any) -> Any:
    """A device as a label: without the (R)/(TM) marks and the word 'Processor' of a CPU's brand string
    ('cpu: Intel(R) Xeon(R) Processor (2 threads)' -> 'cpu: Intel Xeon (2 threads)')."""
    if not isinstance(name, str):
        return name
    return " ".join(_DEVICE_NOISE.sub(" ", name).split()) or name


def chart_text(name: Any) -> str:
    """Store text (a domain, a node id, a configuration) as Plotly may draw it: Plotly renders a subset of HTML in
    tick labels, trace names and text, so a workload's domain `<a href="https://elsewhere">Admin</a>` became a link
    with other visible text in the dashboard and the HTML report. Escaped, it shows as written."""
    return html.escape(str(name), quote=False)


def usd_amount(value: float | None, missing: str = "—") -> str:
    """A dollar figure of any size, written the one way `cost`, the dashboard and the reports all show it:
    whole dollars from $1,000 ("$162,240", not "$1.622e+05"), cents from $1 ("$12.50", not "$12.5"), and below $1
    four significant digits written out, never in e-notation, and never fewer than two decimals, so that a whole
    cent amount reads in cents as above $1 ($0.3412, $0.50 not $0.5, $0.00004123 not $4.123e-05: a cost per
    token is tiny, and read as a number). An exact zero is "$0". The sign goes before the dollar (-$17,492, not
    $-17,492)."""
    if value is None or value != value:
        return missing
    a = abs(value)
    # decided on the rounded figure: 999.999 is "$1,000", not "$1,000.00"; 0.99996 is "$1.00", not "$1"
    text = f"{a:,.0f}" if round(a, 2) >= 1000 else f"{a:,.2f}" if float(f"{a:.4g}") >= 1 else _below_a_dollar(a)
    return ("-" if value < 0 else "") + f"${text}"


def usd_rate(value: float | None, missing: str = "—") -> str:
    """A price per hour or per kWh: from $10 as usd_amount writes it ($98.32/h), below to four significant digits
    as given, written out: cents are not enough ($0.0832/h read "$0.08"), and a price is not an amount to pad to
    the cent ($5/h and $1/kWh, as `cost` and the inputs write them, not "$5.00/h")."""
    if value is None or value != value or abs(value) >= 10:
        return usd_amount(value, missing)
    return ("-" if value < 0 else "") + "$" + format(Decimal(f"{abs(value):.4g}"), "f")


def node_price_text(priced_as: str, usd_per_hour: float, custom: bool) -> str:
    """A node price named once, the one way the dashboard, `cost`, `project` and the reports say it: "H100 x8 at
    $55.04/h", "cpu-2core at $0.0832/h", and a custom price (`--node-hourly-usd`, the Cost page's custom $/h, whose
    name "custom $12/h node" holds its rate already) "custom $12.00/h", not "custom $12/h node ($12.00/h)"."""
    rate = f"{usd_rate(usd_per_hour)}/h"
    return f"custom {rate}" if custom else f"{priced_as} at {rate}"


def _below_a_dollar(a: float) -> str:
    """`a` (0 <= a < 1) to four significant digits in positional notation, at least to the cent ("0.50")."""
    whole, _, decimals = format(Decimal(f"{a:.4g}"), "f").partition(".")  # Decimal: 4e-05 -> 0.00004
    return whole if not decimals and whole == "0" else f"{whole}.{decimals.ljust(2, '0')}"


def j_per_token_text(value: float | None, missing: str = "—") -> str:
    """A J/token figure the one way the reports and the dashboard show it: three significant digits, their
    trailing zeros kept ("1.50" beside "3.12", not "1.5"), written out, never in e-notation ("0.000123", "1,230")."""
    if value is None or value != value:
        return missing
    if value == 0:
        return "0.00"
    rounded = float(f"{value:.3g}")  # decided on the rounded figure: 9.996 is "10.0", not "10.00"
    return f"{rounded:,.{max(2 - math.floor(math.log10(abs(rounded))), 0)}f}"


def go_text(value: float | None, line: float, decimals: int = 3) -> str:
    """A figure the go/no-go `line` judges (alpha against 0.65), with as many decimals as it takes (`decimals` at
    least: 3, as `calibrate` prints alpha) for the shown value to fall on the same side of the line as the value:
    0.646 reads "0.646", never "0.65" beside a line of 0.65 it does not meet. "—" when missing."""
    if value is None or value != value:
        return "—"
    meets = value >= line
    for d in range(decimals, 7):
        text = f"{value:.{d}f}"
        if (float(text) >= line) == meets:
            return text
    # closer to the line than a millionth: cut toward the side of the verdict
    scale = 10**6
    cut = (math.ceil(value * scale) if meets else math.floor(value * scale)) / scale
    return f"{cut:.6f}"


def clear_of_line(values: list[float | None], line: float, band: float = 0.1) -> list[str]:
    """Plotly text positions for markers plotted against a horizontal line (alpha against the go/no-go line), so
    the line never strikes through a label (alpha 0.63 and 0.64 read through the dashes of a line at 0.65): a
    label goes above its marker, but below one that sits just under the line (within `band`, in the axis's
    units), which has the line right above it."""
    return ["bottom right" if v is not None and line - band <= v < line else "top right" for v in values]


def line_in_legend(fig: Any, y: float, name: str, colour: str) -> None:
    """A dashed horizontal line at `y` on a Plotly figure, named in the legend rather than by a label on the plot
    (where it lay on the markers and labels next to the line)."""
    fig.add_hline(y=y, line_dash="dash", line_color=colour)
    fig.add_scatter(x=[None], y=[None], mode="lines", name=name, line={"dash": "dash", "color": colour},
                    hoverinfo="skip")
