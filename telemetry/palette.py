"""Colours the dashboard and the reports share, so a reader who knows one knows the other: each mode has
one colour everywhere, and the parts of a cost (hardware, energy) have their own, apart from the modes'."""

from __future__ import annotations

MODE_COLOURS = {"spec": "#2563eb", "ar": "#ea580c"}  # speculative blue, the AR baseline orange
HARDWARE_COLOUR = "#334155"  # the hardware part of a cost (node $/h x hours)
ENERGY_COLOUR = "#f59e0b"  # the energy part; hatched where it is an estimate
