"""Initial schema: runs, requests, steps, token_events, power_samples, prices, reports.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
DOWNGRADE_DROPS: dict = {"tables": ("runs", "requests", "steps", "token_events", "power_samples", "reports",
                                    "prices")}


def upgrade() -> None:
    op.create_table(
        "prices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("unit", sa.String(length=16), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("as_of", sa.String(length=32), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prices")),
        sa.UniqueConstraint("name", name=op.f("uq_prices_name")),
    )
    op.create_table(
        "reports",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("period", sa.String(length=16), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("html_path", sa.Text(), nullable=False),
        sa.Column("csv_dir", sa.Text(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.Column("delivery_status", sa.String(length=32), nullable=True),
        sa.Column("delivery_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reports")),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("mode", sa.String(length=8), nullable=False),
        sa.Column("node_id", sa.String(length=128), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("device", sa.String(length=128), nullable=False),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=512), nullable=False),
        sa.Column("drafter", sa.String(length=512), nullable=True),
        sa.Column("k_policy", sa.String(length=32), nullable=False),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("top_p", sa.Float(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("workload", sa.String(length=255), nullable=False),
        sa.Column("power_source", sa.String(length=16), nullable=False),
        sa.Column("software_version", sa.String(length=64), nullable=False),
        sa.Column("price_snapshot", sa.JSON(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("dropped_records", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_index("ix_runs_node_id", "runs", ["node_id"], unique=False)
    op.create_index("ix_runs_started_at", "runs", ["started_at"], unique=False)
    op.create_table(
        "power_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("t", sa.DateTime(timezone=True), nullable=False),
        sa.Column("device_index", sa.Integer(), nullable=False),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("energy_mj", sa.Float(), nullable=True),
        sa.Column("utilization_pct", sa.Float(), nullable=True),
        sa.Column("source", sa.String(length=12), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_power_samples_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_power_samples")),
    )
    op.create_index("ix_power_samples_run_id_t", "power_samples", ["run_id", "t"], unique=False)
    op.create_table(
        "requests",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("external_id", sa.String(length=128), nullable=True),
        sa.Column("domain", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("num_drafts", sa.Integer(), nullable=False),
        sa.Column("num_draft_tokens", sa.Integer(), nullable=False),
        sa.Column("num_accepted_tokens", sa.Integer(), nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("e2e_ms", sa.Float(), nullable=True),
        sa.Column("energy_j", sa.Float(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_requests_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_requests")),
    )
    op.create_index("ix_requests_domain", "requests", ["domain"], unique=False)
    op.create_index("ix_requests_run_id", "requests", ["run_id"], unique=False)
    op.create_index("ix_requests_started_at", "requests", ["started_at"], unique=False)
    op.create_table(
        "steps",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("request_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("k", sa.Integer(), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("num_emitted", sa.Integer(), nullable=False),
        sa.Column("draft_ms", sa.Float(), nullable=False),
        sa.Column("verify_ms", sa.Float(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("k_reason", sa.String(length=32), nullable=True),
        sa.Column("t_offset_ms", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["request_id"], ["requests.id"], name=op.f("fk_steps_request_id_requests"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_steps")),
    )
    op.create_index("ix_steps_request_id", "steps", ["request_id"], unique=False)
    op.create_table(
        "token_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("request_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("emit_offset_ms", sa.Float(), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=12), nullable=False),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["requests.id"],
            name=op.f("fk_token_events_request_id_requests"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_token_events")),
    )
    op.create_index("ix_token_events_request_id", "token_events", ["request_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_token_events_request_id", table_name="token_events")
    op.drop_table("token_events")
    op.drop_index("ix_steps_request_id", table_name="steps")
    op.drop_table("steps")
    op.drop_index("ix_requests_started_at", table_name="requests")
    op.drop_index("ix_requests_run_id", table_name="requests")
    op.drop_index("ix_requests_domain", table_name="requests")
    op.drop_table("requests")
    op.drop_index("ix_power_samples_run_id_t", table_name="power_samples")
    op.drop_table("power_samples")
    op.drop_index("ix_runs_started_at", table_name="runs")
    op.drop_index("ix_runs_node_id", table_name="runs")
    op.drop_table("runs")
    op.drop_table("reports")
    op.drop_table("prices")
