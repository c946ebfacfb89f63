"""Concurrency sweeps: where speculation stops paying as batches grow.

Throughput per (level, mode) comes from the runs' SQL summaries (`telemetry.queries`), so the
crossover agrees with every other figure of the product.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from telemetry.db import Sweep, retry_while_locked
from telemetry.queries import COMPARED_FIELDS, Filters, config_summaries, field_text, key_of, varying_fields


@dataclass(frozen=True, slots=True)
class SweepPoint:
    concurrency: int
    ar_tokens_per_s: float | None
    spec_tokens_per_s: float | None
    ar_tpot_p95_ms: float | None
    spec_tpot_p95_ms: float | None
    spec_mean_acceptance_length: float | None = None  # what the speedup cannot exceed (None: nothing drafted)

    @property
    def speedup(self) -> float | None:
        if not self.ar_tokens_per_s or self.spec_tokens_per_s is None:
            return None
        return self.spec_tokens_per_s / self.ar_tokens_per_s


def crossover(points: list[SweepPoint]) -> int | None:
    """Smallest measured concurrency whose speculative tokens/s does not beat AR; None if it always does.
    Levels where either mode has no measurement are skipped."""
    for p in sorted(points, key=lambda p: p.concurrency):
        if p.speedup is not None and p.speedup <= 1.0:
            return p.concurrency
    return None


def _by_value(key: tuple) -> tuple:
    """A group key's sort order: numbers by number (64 before 256), text by text, None (unknown) last."""
    return tuple((v is None, v if isinstance(v, int | float) else str(v)) for v in key)


def sweep_points(engine: Engine, run_ids: list[int]) -> list[SweepPoint]:
    """One point per concurrency level; a mode measured as several runs at a level (a benchmark that
    alternated AR and spec in turns) is pooled: its tokens over their summed wall time, percentiles over
    all of their requests (`queries.config_summaries`: a sweep's runs differ only in mode and level).
    ValueError where they do not: runs of several temperatures, top_k, answer length caps, run kinds, workloads,
    ... (queries.COMPARED_FIELDS), or two spec configurations at one level."""
    configs = config_summaries(engine, Filters(run_ids=tuple(run_ids)))
    groups = [dict(zip(COMPARED_FIELDS, g, strict=True))
              for g in sorted({key_of(c, COMPARED_FIELDS) for c in configs}, key=_by_value)]
    if len(groups) > 1:  # spec at one temperature against AR at another would be no crossover of either
        varying = varying_fields(groups)
        named = "; ".join(", ".join(field_text(f, g[f]) for f in varying
                                    if f not in ("top_p", "top_k") or g["temperature"] != 0) for g in groups)
        raise ValueError(f"run_ids of a sweep must share workload, sampling (temperature, top_p, top_k), answer "
                         f"length cap (max_new_tokens), run kind, target, device, backend and precision; these runs "
                         f"hold {len(groups)} groups ({named})")
    pooled = {}
    for c in configs:
        if (c.concurrency, c.mode) in pooled:
            raise ValueError(f"run_ids of a sweep hold two {c.mode} configurations at concurrency {c.concurrency} "
                             f"(drafter or K policy differ): a sweep measures one of each per level")
        pooled[(c.concurrency, c.mode)] = c.stats
    points = []
    for level in sorted({lvl for lvl, _ in pooled}):
        ar, spec = pooled.get((level, "ar")), pooled.get((level, "spec"))
        points.append(SweepPoint(
            level,
            ar.tokens_per_s if ar else None, spec.tokens_per_s if spec else None,
            ar.tpot_p95_ms if ar else None, spec.tpot_p95_ms if spec else None,
            spec.mean_acceptance_length if spec else None,
        ))
    return points


def record_sweep(engine: Engine, *, node_id: str, device: str, target: str, drafter: str, k_policy: str,
                 workload: str, dtype: str, run_ids: list[int]) -> tuple[int, int | None, list[SweepPoint]]:
    """Compute the crossover of these runs and store the sweep. Returns (sweep id, crossover, points)."""
    points = sweep_points(engine, run_ids)
    cross = crossover(points)

    def write() -> int:  # one transaction, waited for while another process holds the store locked
        with Session(engine) as s, s.begin():
            row = Sweep(node_id=node_id, device=device, target=target, drafter=drafter, k_policy=k_policy,
                        workload=workload, dtype=dtype, levels=[p.concurrency for p in points],
                        run_ids=list(run_ids), crossover_concurrency=cross)
            s.add(row)
            s.flush()
            return row.id

    return retry_while_locked(engine, write), cross, points


def latest_sweep(engine: Engine, *, target: str | None = None, drafter: str | None = None) -> Sweep | None:
    stmt = select(Sweep).order_by(Sweep.created_at.desc(), Sweep.id.desc()).limit(1)
    if target is not None:
        stmt = stmt.where(Sweep.target == target)
    if drafter is not None:
        stmt = stmt.where(Sweep.drafter == drafter)
    with Session(engine) as s:
        row = s.scalars(stmt).first()
        if row is not None:
            s.expunge(row)
        return row


def list_sweeps(engine: Engine, limit: int | None = 50) -> list[Sweep]:
    """The recorded sweeps, newest first; at most `limit` (None: all: one row per sweep, a small table)."""
    q = select(Sweep).order_by(Sweep.id.desc())
    with Session(engine) as s:
        rows = list(s.scalars(q if limit is None else q.limit(limit)))
        for r in rows:
            s.expunge(r)
        return rows
