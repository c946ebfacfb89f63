"""Energy over a time window from power samples: counter difference first, power integration as fallback.

Per device, a cumulative energy function E(t) is built from the samples, valid between the first and
the last sample: with a hardware energy counter (NVML total energy, RAPL) it interpolates the counter
linearly; without one it integrates the linearly interpolated power exactly (trapezoids). Energy in a
window is the sum over devices of E(end) - E(start), clipped to what the samples cover. Nothing is
extrapolated: a window no sample pair covers is None (unknown), never 0.

Millijoules become joules here and nowhere else.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from telemetry.records import PowerReading

J_PER_MJ = 1e-3


_EPOCH = datetime(2024, 1, 1, tzinfo=UTC)  # a near epoch keeps microseconds exact in a float


def _seconds(t: datetime) -> float:
    """Seconds since _EPOCH; naive datetimes are taken as UTC (as the store keeps them)."""
    return ((t if t.tzinfo is not None else t.replace(tzinfo=UTC)) - _EPOCH) / timedelta(seconds=1)


class _DeviceEnergy:
    """E(t) in joules for one device, from its samples sorted by time."""

    def __init__(self, samples: Sequence[PowerReading]) -> None:
        self.counter = all(s.energy_mj is not None for s in samples)
        # (t seconds, counter mJ or power W) per usable sample, duplicate timestamps dropped
        points: list[tuple[float, float]] = []
        for s in samples:
            value = s.energy_mj if self.counter else s.power_w
            t = _seconds(s.t)
            if value is not None and (not points or t > points[-1][0]):
                points.append((t, float(value)))
        self.ts = [t for t, _ in points]
        self.power_w = [0.0 if self.counter else v for _, v in points]
        self.cum_j = [0.0]
        for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
            if self.counter:
                step_j = max(v1 - v0, 0.0) * J_PER_MJ  # a counter reset (driver reload) adds nothing
            else:
                step_j = (v0 + v1) / 2 * (t1 - t0)
            self.cum_j.append(self.cum_j[-1] + step_j)

    def covers(self, a: float, b: float) -> tuple[float, float] | None:
        if len(self.ts) < 2:
            return None
        lo, hi = max(a, self.ts[0]), min(b, self.ts[-1])
        return (lo, hi) if hi > lo else None

    def at(self, t: float) -> float:
        """E(t) for t within [ts[0], ts[-1]]."""
        i = min(max(bisect.bisect_right(self.ts, t) - 1, 0), len(self.ts) - 2)
        t0, t1 = self.ts[i], self.ts[i + 1]
        x = t - t0
        if self.counter:
            return self.cum_j[i] + (self.cum_j[i + 1] - self.cum_j[i]) * x / (t1 - t0)
        p0, p1 = self.power_w[i], self.power_w[i + 1]
        return self.cum_j[i] + p0 * x + (p1 - p0) * x * x / (2 * (t1 - t0))


def _by_device(readings: Iterable[PowerReading]) -> list[_DeviceEnergy]:
    groups: dict[int, list[PowerReading]] = {}
    for r in readings:
        groups.setdefault(r.device_index, []).append(r)
    return [_DeviceEnergy(sorted(g, key=lambda r: _seconds(r.t))) for g in groups.values()]


def energy_for_window(readings: Iterable[PowerReading], start: datetime, end: datetime) -> float | None:
    """Joules the devices used between `start` and `end`; None when no samples cover any of it."""
    if end < start:
        raise ValueError(f"end ({end}) is before start ({start})")
    a, b = _seconds(start), _seconds(end)
    total, measured = 0.0, False
    for dev in _by_device(readings):
        span = dev.covers(a, b)
        if span is not None:
            total += dev.at(span[1]) - dev.at(span[0])
            measured = True
    return total if measured else None


def attribute_energy(
    readings: Iterable[PowerReading], windows: Sequence[tuple[datetime, datetime]]
) -> list[float | None]:
    """Joules per window when windows overlap (concurrent requests): at every instant the devices' energy
    is shared equally by the windows active then. Idle time belongs to no window. None: not measured."""
    devices = _by_device(readings)
    spans = [(_seconds(s), _seconds(e)) for s, e in windows]
    for (a, b), (s, _) in zip(spans, windows, strict=True):
        if b < a:
            raise ValueError(f"window starting {s} ends before it starts")
    points = sorted({p for span in spans for p in span})
    result: list[float | None] = [None] * len(spans)
    for dev in devices:
        for lo, hi in zip(points, points[1:], strict=False):
            span = dev.covers(lo, hi)
            if span is None:
                continue
            active = [i for i, (a, b) in enumerate(spans) if a <= lo and b >= hi]
            if not active:
                continue
            share = (dev.at(span[1]) - dev.at(span[0])) / len(active)
            for i in active:
                result[i] = (result[i] or 0.0) + share
    return result
