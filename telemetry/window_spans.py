"""How far a time window's priced spans reach outside the window (a caveat; the arithmetic is queries').

Under a time window a run is priced over the span of its requests that started inside it: first start to last
end (queries' wall_s). Requests still in flight at the window's end carry that span past it, and the next window
prices its own requests from their first start on, so two adjacent windows price the same node-seconds twice,
by up to how far the earlier one's span runs past the cut. `window_spills` measures that per run, on both sides:
past the window's end, and into its start from the run's requests that started before it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy.engine import Engine

from telemetry.queries import Filters, longest_e2e_ms, span_bounds


@dataclass(frozen=True, slots=True)
class WindowSpill:
    past_end_s: float  # the run's priced span (its requests started in the window) runs this far past the end
    into_start_s: float  # its requests started before the window ran this far into it


def window_spills(engine: Engine, filters: Filters, run_ids: list[int]) -> dict[int, WindowSpill]:
    """Per run of `run_ids` (runs in view under `filters`) whose priced span reaches outside the window
    [since, until), by how many seconds; {} where no time window is set or no span reaches out. Past the end:
    from the span bounds the runs' wall times were read from (`span_bounds`, read once inside
    `reuse_collections`). Into the start: from the runs' requests that started before it, no further back than
    their longest e2e time (a long server run is not read whole)."""
    if filters.since is None and filters.until is None or not run_ids:
        return {}
    ids = set(run_ids) & set(filters.run_ids) if filters.run_ids is not None else set(run_ids)
    past: dict[int, float] = {}
    if filters.until is not None:  # a run's bounds do not depend on the other runs in view
        inside = span_bounds(engine, filters)
        past = {r: (last - filters.until).total_seconds() for r, (_, last) in inside.items()
                if r in ids and last > filters.until}
    into: dict[int, float] = {}
    longest = longest_e2e_ms(engine, sorted(ids), before=filters.since) if filters.since is not None else None
    if longest is not None:  # the same runs' requests that started before the window (same selectors)
        # a request that started further back ended before the window's start (1 ms: the e2e's rounding)
        reach = filters.since - timedelta(milliseconds=longest + 1)
        before = span_bounds(engine, replace(filters, since=reach, until=filters.since, run_ids=tuple(sorted(ids))))
        into = {r: (last - filters.since).total_seconds() for r, (_, last) in before.items() if last > filters.since}
    return {r: WindowSpill(past.get(r, 0.0), into.get(r, 0.0)) for r in sorted(set(past) | set(into))}


def _when(d: datetime) -> str:
    return f"{d:%Y-%m-%d %H:%M:%S} UTC"


def spill_note(spill: WindowSpill, since: datetime | None, until: datetime | None) -> str:
    """One run's caveat (a cost row's note)."""
    parts = []
    if spill.past_end_s > 0 and until is not None:
        parts.append(f"priced span runs {spill.past_end_s:.2f} s past the window's end ({_when(until)}): requests "
                     "in flight there; a window starting at that end prices up to that much of the same node time "
                     "again (adjacent windows' costs overlap by up to that)")
    if spill.into_start_s > 0 and since is not None:
        parts.append(f"requests started before the window's start ({_when(since)}) ran {spill.into_start_s:.2f} s "
                     "into it: a window ending at that start prices up to that much of this window's node time too")
    return "; ".join(parts)


def spills_text(spills: dict[int, WindowSpill], since: datetime | None, until: datetime | None) -> str | None:
    """The window's caveat over its runs (`cost`'s note, a report's notice): None where no priced span reaches
    outside it."""
    from telemetry.costing import ids_text

    parts = []
    past = {r: s.past_end_s for r, s in spills.items() if s.past_end_s > 0}
    if past and until is not None:
        each = ", ".join(f"run {r} {s:.2f} s" for r, s in sorted(past.items())[:5]) + (", ..." if len(past) > 5 else "")
        parts.append(f"{ids_text(list(past), shown=5)}: the priced span (wall_s: first request start to last end) "
                     f"runs up to {max(past.values()):.2f} s past the window's end ({_when(until)}; {each}), requests "
                     "in flight there; a window starting at that end prices up to that much of the same node time "
                     "again, so adjacent windows' costs overlap by up to that")
    into = {r: s.into_start_s for r, s in spills.items() if s.into_start_s > 0}
    if into and since is not None:
        each = ", ".join(f"run {r} {s:.2f} s" for r, s in sorted(into.items())[:5]) + (", ..." if len(into) > 5 else "")
        parts.append(f"{ids_text(list(into), shown=5)}: requests started before the window's start "
                     f"({_when(since)}) ran up to {max(into.values()):.2f} s into it ({each}); a window ending at "
                     "that start prices up to that much of this window's node time too")
    return "; ".join(parts) or None
