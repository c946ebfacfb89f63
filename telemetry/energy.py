"""Energy over a time window from power samples: counter difference first, power integration as fallback.

Per device, a cumulative energy function E(t) is built from the samples, valid between the first and
the last sample: with a hardware energy counter (NVML total energy, RAPL) it interpolates the counter
linearly; without one it integrates the linearly interpolated power exactly (trapezoids). Energy in a
window is the sum over devices of E(end) - E(start). Nothing is extrapolated: a window the samples of
every device do not cover from its start to its end (samples dropped, a device that stopped reporting, a
window before the first or after the last sample) is None (unknown), never 0 and never the covered part
counted as the whole.

Millijoules become joules here and nowhere else.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from telemetry.records import PowerReading

J_PER_MJ = 1e-3
# How far a window's edge may lie outside the samples and still count as covered: timestamps are whole
# microseconds, and a window's end is its wall-clock start plus a perf_counter duration, so an end sampled
# right after it can land a few microseconds before it. The uncovered sliver is not counted.
EDGE_TOLERANCE_S = 1e-3


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
        """The part of [a, b] the samples cover; None where they cover none of it."""
        if len(self.ts) < 2:
            return None
        lo, hi = max(a, self.ts[0]), min(b, self.ts[-1])
        return (lo, hi) if hi > lo else None

    def covers_all(self, a: float, b: float) -> bool:
        """Whether the samples cover all of [a, b] (up to EDGE_TOLERANCE_S at either edge)."""
        span = self.covers(a, b)
        return span is not None and span[0] <= a + EDGE_TOLERANCE_S and span[1] >= b - EDGE_TOLERANCE_S

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
    """Joules the devices used between `start` and `end`; None (unknown) unless the samples of every device
    cover all of it."""
    if end < start:
        raise ValueError(f"end ({end}) is before start ({start})")
    a, b = _seconds(start), _seconds(end)
    devices = _by_device(readings)
    if not devices or not all(dev.covers_all(a, b) for dev in devices):
        return None
    total = 0.0
    for dev in devices:
        lo, hi = dev.covers(a, b)  # type: ignore[misc]  # not None: covers_all
        total += dev.at(hi) - dev.at(lo)
    return total


def attribute_energy(
    readings: Iterable[PowerReading], windows: Sequence[tuple[datetime, datetime]]
) -> list[float | None]:
    """Joules per window when windows overlap (concurrent requests): at every instant the devices' energy
    is shared equally by the windows active then. Idle time belongs to no window. None: not measured, or not
    all of the window on every device (as `energy_for_window`); a window only partly covered still takes its
    part of the time it shares with the others, so theirs are not overstated."""
    devices = _by_device(readings)
    spans = [(_seconds(s), _seconds(e)) for s, e in windows]
    for (a, b), (s, _) in zip(spans, windows, strict=True):
        if b < a:
            raise ValueError(f"window starting {s} ends before it starts")
    points = sorted({p for span in spans for p in span})
    result: list[float | None] = [None] * len(spans)
    covered = [bool(devices) and all(dev.covers_all(a, b) for dev in devices) for a, b in spans]
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
                if covered[i]:
                    result[i] = (result[i] or 0.0) + share
    return result
