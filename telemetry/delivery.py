"""Delivering a report's summary: webhook (HTTP POST of the JSON summary, httpx) and/or e-mail (smtplib).

Each channel is tried up to `attempts` times with exponential backoff (backoff_s, 2 x backoff_s, ...). The outcome
is written to reports.delivery_status ("delivered" | "partially delivered" | "failed") and delivery_error (one
line per failed channel, with the attempts made and the last error): a failed delivery is never silent.

Each webhook POST carries an `Idempotency-Key` header (`idempotency_key`: "specfinops-report-<report id>-<12 random
hex digits>", made when the report is written and stored in its summary), the same on every attempt and every later
re-delivery of that report and different for every other report (another store's included, even where its page has
the same path on another machine): a POST that timed out may have arrived, and its retry then reaches the receiver
twice, which can drop the second by its key.

The webhook URL may come from the environment too (--webhook-env NAME: only the variable's name is stored);
it is printed and logged as scheme and host only (mask_url), since Slack-style URLs carry their secret.
SMTP settings come from the environment (never from the job store, so no password is pickled into the
database):
    SPECFINOPS_SMTP_HOST (required), SPECFINOPS_SMTP_PORT (default 25, or 587 with STARTTLS),
    SPECFINOPS_SMTP_FROM and SPECFINOPS_SMTP_TO (required; TO is a comma-separated list),
    SPECFINOPS_SMTP_USER / SPECFINOPS_SMTP_PASSWORD (optional; login when both are set),
    SPECFINOPS_SMTP_STARTTLS (1/0; default 1 when a user is set, else 0).
"""

from __future__ import annotations

import json
import logging
import os
import smtplib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from urllib.parse import urlsplit

from sqlalchemy import update
from sqlalchemy.engine import Engine

from telemetry.costing import cost_basis_text
from telemetry.db import Report, retry_while_locked
from telemetry.labels import usd_amount

logger = logging.getLogger(__name__)

DELIVERED = "delivered"
PARTIAL = "partially delivered"
FAILED = "failed"
ENV_PREFIX = "SPECFINOPS_SMTP_"
DEFAULT_ATTEMPTS = 3
DEFAULT_BACKOFF_S = 2.0
TIMEOUT_S = 10.0


class DeliveryError(RuntimeError):
    """One delivery attempt failed; the message says how."""


def check_webhook_url(url: str, flag: str = "--webhook") -> str:
    """The URL, or ValueError naming `flag` (the URL itself is not echoed: it may carry a secret).

    Checked here, where it enters, everything a POST to it would otherwise fail on later, at each run: the
    scheme, the host, the port (a number in 1..65535) and anything else httpx cannot parse."""
    import httpx

    text = url or ""
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed [
        raise ValueError(f"{flag} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.netloc and not text.startswith(f"{parts.scheme}://"):
        got = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        raise ValueError(f"{flag} must be an http:// or https:// URL, got {got}")
    if not parts.hostname:  # 'http://' read as a wrong scheme
        raise ValueError(f"{flag} must name a host: http(s)://HOST[:PORT]/...")
    if any(c.isspace() or not c.isprintable() for c in text):
        raise ValueError(f"{flag} must not contain spaces or control characters")
    port_text = parts.netloc.rpartition("@")[2].rpartition("]")[2].partition(":")[2]
    try:
        port = parts.port
    except ValueError:
        port = None
    if port_text and (port is None or not 0 < port < 65536):
        raise ValueError(f"{flag} has a bad port: it must be a number in 1..65535, got {port_text!r}")
    try:
        httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise ValueError(f"{flag} is not a valid URL: {exc}") from None
    return url


def webhook_from_env(name: str, env: Mapping[str, str] | None = None) -> str:
    """The webhook URL kept in the environment variable `name` (--webhook-env): never stored in the job store."""
    env = os.environ if env is None else env
    url = (env.get(name) or "").strip()
    if not url:
        raise ValueError(f"--webhook-env: the environment variable {name} is not set")
    return check_webhook_url(url, f"--webhook-env {name}")


def mask_url(url: str | None) -> str:
    """A webhook URL as it may be printed or logged: scheme and host only (Slack-style URLs carry their secret in
    the path; user info and query are dropped too), e.g. https://hooks.slack.com/***. Never raises: a URL that
    cannot be parsed (a job stored before check_webhook_url checked its port) shows as much as can be read."""
    if not url:
        return ""
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket: nothing after the scheme is shown
        scheme = url.partition("://")[0] if "://" in url else ""
        return f"{scheme}://***" if scheme.isalnum() else "***"
    host = parts.hostname or ""
    if ":" in host:  # IPv6, bracketed as in the URL
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:  # out of range or not a number: its text (never the secret part) as written
        port = parts.netloc.rpartition("@")[2].rpartition("]")[2].partition(":")[2]
        port = "".join(c for c in port if c.isprintable() and not c.isspace()) or None
    if port is not None:
        host = f"{host}:{port}"
    hidden = parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password
    return f"{parts.scheme}://{host}/***" if hidden else f"{parts.scheme}://{host}/"


@dataclass(frozen=True, slots=True)
class SmtpSettings:
    host: str
    port: int
    sender: str
    recipients: tuple[str, ...]
    user: str | None = None
    password: str | None = None
    starttls: bool = False
    timeout_s: float = TIMEOUT_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SmtpSettings:
        """Settings from SPECFINOPS_SMTP_*; ValueError naming every missing or bad variable."""
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name, "").strip()
            return value or None

        missing = [ENV_PREFIX + n for n in ("HOST", "FROM", "TO") if get(n) is None]
        if missing:
            raise ValueError(f"--smtp needs the environment variables {', '.join(missing)}")
        user, password = get("USER"), get("PASSWORD")
        if (user is None) != (password is None):
            raise ValueError(f"set both {ENV_PREFIX}USER and {ENV_PREFIX}PASSWORD, or neither")
        tls_text = get("STARTTLS")
        if tls_text is not None and tls_text.lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise ValueError(f"{ENV_PREFIX}STARTTLS must be 1 or 0, got {tls_text!r}")
        starttls = user is not None if tls_text is None else tls_text.lower() in ("1", "true", "yes")
        port_text = get("PORT")
        try:
            port = int(port_text) if port_text is not None else (587 if starttls else 25)
        except ValueError:
            raise ValueError(f"{ENV_PREFIX}PORT must be a port number, got {port_text!r}") from None
        if not 0 < port < 65536:
            raise ValueError(f"{ENV_PREFIX}PORT must be in 1..65535, got {port_text!r}")
        recipients = tuple(r.strip() for r in (get("TO") or "").split(",") if r.strip())
        return cls(get("HOST") or "", port, get("FROM") or "", recipients, user, password, starttls)


def one_line(text: str) -> str:
    """An error's text on one line (delivery_error holds one line per failed channel)."""
    return " ".join(str(text).split())


IDEMPOTENCY_HEADER = "Idempotency-Key"


def new_idempotency_key(report_id: int) -> str:
    """The key of a report being written (its summary's "idempotency_key"): 'specfinops-report-<report id>-<12
    random hex digits>'. Random, not taken of the report's page's path: report ids are per store, and two stores'
    report #1 of one day have the same path on two machines (/srv/reports on staging and production) or on one
    after a reset, so a receiver dropping a key it has seen dropped the second as a retry of the first."""
    import secrets

    return f"specfinops-report-{report_id}-{secrets.token_hex(6)}"


def idempotency_key(summary: Mapping) -> str | None:
    """The key a receiver de-duplicates a report's POSTs by: the one its summary holds (`new_idempotency_key`,
    made when it was written). The summary is stored and re-sent as it is, so every attempt and re-delivery of a
    report has the same key. A summary stored before it held one: 'specfinops-report-<report id>-<hash of its
    page's path>', the key its earlier deliveries carried. None without a report id."""
    import hashlib

    stored = summary.get("idempotency_key")
    if isinstance(stored, str) and stored:
        return stored
    report_id = summary.get("report_id")
    if report_id is None:
        return None
    where = hashlib.sha256(str(summary.get("html_path") or "").encode()).hexdigest()[:12]
    return f"specfinops-report-{report_id}-{where}"


def post_webhook(url: str, payload: dict, *, timeout_s: float = TIMEOUT_S) -> None:
    """POST the payload as JSON, with its Idempotency-Key (`idempotency_key`); DeliveryError on a connection error
    or a non-2xx answer."""
    import httpx

    headers = {"content-type": "application/json"}
    key = idempotency_key(payload)
    if key is not None:
        headers[IDEMPOTENCY_HEADER] = key
    try:
        response = httpx.post(url, content=json.dumps(payload, default=str), headers=headers, timeout=timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, OSError, ValueError) as exc:
        # InvalidURL and StreamError are not HTTPErrors: a URL httpx cannot parse fails the delivery too
        raise DeliveryError(one_line(f"{type(exc).__name__}: {exc}")) from None
    if not 200 <= response.status_code < 300:
        raise DeliveryError(one_line(f"HTTP {response.status_code}: {scrub_url(response.text, url)[:200]}"))


def scrub_url(text: str, url: str) -> str:
    """`text` with the secret parts of webhook `url` (its path, query and user info: Slack-style URLs carry their
    secret in the path) replaced by ***. A receiver's error page may echo the path ("Cannot POST /services/T0/
    SECRET"), and the answer is kept in the store, the log and `scheduler --list`, which show the URL masked."""
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
        # the user info as it stands in a URL ("user:pw@", "user@"), a password alone where it is not a fragment
        # of ordinary words (4 characters or more); a user name alone is no secret and may be a common word
        secrets = [url, parts.path + ("?" + parts.query if parts.query else ""), parts.path, parts.query,
                   f"{user}:{password}@" if user and password else None, f"{user}@" if user else None,
                   password if password and len(password) >= 4 else None]
    except ValueError:
        secrets = [url]
    for secret in sorted({s for s in secrets if s and len(s) > 1}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def send_email(settings: SmtpSettings, subject: str, body: str) -> None:
    """One plain-text message to every recipient; DeliveryError on any SMTP or connection error."""
    msg = EmailMessage()
    msg["Subject"], msg["From"], msg["To"] = subject, settings.sender, ", ".join(settings.recipients)
    msg.set_content(body)
    try:
        with smtplib.SMTP(settings.host, settings.port, timeout=settings.timeout_s) as smtp:
            if settings.starttls:
                smtp.starttls()
            if settings.user is not None:
                smtp.login(settings.user, settings.password or "")
            smtp.send_message(msg)
    except (smtplib.SMTPException, OSError) as exc:
        raise DeliveryError(one_line(f"{type(exc).__name__}: {exc}")) from None


def with_retries(
    send: Callable[[], None],
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff_s: float = DEFAULT_BACKOFF_S,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, str | None]:
    """Call `send` until it succeeds or `attempts` tries are spent; (attempts made, last error or None)."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts!r}")
    error = None
    for i in range(attempts):
        if i:
            sleep(backoff_s * 2 ** (i - 1))
        try:
            send()
            return i + 1, None
        except DeliveryError as exc:
            error = str(exc)
            logger.warning("delivery attempt %d/%d failed: %s", i + 1, attempts, error)
    return attempts, error


@dataclass(frozen=True, slots=True)
class DeliveryOutcome:
    status: str  # delivered | partially delivered | failed
    error: str | None  # one line per failed channel
    attempts: dict[str, int]


def email_text(summary: dict) -> tuple[str, str]:
    """Subject and plain-text body of the e-mail: the headline figures and where the files are. Each cost per 1M
    tokens says what it holds in the words of the report's tiles (costing.cost_basis_text, from the summary's
    energy_included / energy_source / energy_complete / cost_note): a hardware-only total must not read as the
    full cost, nor a partly estimated one as wholly estimated or measured."""

    modes = summary.get("modes", {})
    # a month by its name ('monthly cost report October 2026'), not by the date of its 1st
    subject = f"specfinops {summary.get('period')} cost report {summary.get('month') or str(summary.get('since'))[:10]}"
    lines = [f"Period: {summary.get('month') + ', ' if summary.get('month') else ''}{summary.get('since')} to "
             f"{summary.get('until')} (UTC)"]
    if summary.get("synthetic"):  # runs of the synthetic data generator: the figures are not measurements
        lines.append(f"Synthetic data: {summary['synthetic']} of the period's runs were made by the benchmark "
                     "generator; they are not measurements.")
    if not summary.get("traffic"):
        lines.append("No traffic in this period.")
    lines.append(f"Output tokens: {summary.get('output_tokens', 0):,}; requests: {summary.get('requests', 0):,}")
    for mode, label in (("spec", "spec"), ("ar", "AR")):
        m = modes.get(mode, {})
        total = m.get("total_usd_per_1m")
        # what the total holds, in the report's words: a hardware-only total must not read as the full cost
        basis = cost_basis_text(total, energy_included=bool(m.get("energy_included")),
                                source=m.get("energy_source"), note=m.get("cost_note"),
                                priced_over=m.get("cost_priced_over"),
                                partial=m.get("energy_complete") is False and m.get("energy_source") is not None)
        value = usd_amount(total)  # as the report and `cost` write money ($12.50, $0.00004), "—" where missing
        lines.append(f"Cost per 1M tokens, {label}: {value}" + (f", {basis}" if basis else ""))
    if summary.get("priced_at"):  # given prices, not the runs' recorded ones
        lines.append(f"Priced at: {summary['priced_at']}")
    proj = summary.get("projection") or {}
    lines.append(f"Projected annual savings: {usd_amount(proj.get('annual_savings_usd'))}")
    bands = summary.get("anomalies", [])
    flagged = [a["metric"] for a in bands if a.get("status") == "anomaly"]
    checked = any(a.get("status") in ("anomaly", "within band") for a in bands)
    unchecked = any(a.get("status") == "not checked" for a in bands)  # report.NOT_CHECKED: a total mid-period
    so_far = " (this period had not ended)" if summary.get("period_complete") is False and checked else ""
    lines.append("Anomalies: " + (", ".join(flagged) + so_far if flagged else
                                  "not checked (this period had not ended)" if unchecked and not checked else
                                  "none" + so_far))
    lines.append(f"Report: {summary.get('html_path')}")
    return subject, "\n".join(lines) + "\n"


def deliver(
    summary: dict,
    *,
    webhook_url: str | None = None,
    smtp: bool = False,
    env: Mapping[str, str] | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff_s: float = DEFAULT_BACKOFF_S,
    sleep: Callable[[float], None] = time.sleep,
    webhook_env: str | None = None,
) -> DeliveryOutcome:
    """Send the summary by each requested channel, with retries. At least one channel must be requested.

    `webhook_env` names an environment variable holding the webhook URL (read now, like the SMTP settings).
    Errors name the webhook by scheme and host only (mask_url): they are stored and logged."""
    if webhook_url is None and webhook_env is None and not smtp:
        raise ValueError("deliver needs a webhook URL, a webhook variable or smtp=True")
    errors: list[str] = []
    tried: dict[str, int] = {}
    if webhook_url is None and webhook_env is not None:
        try:
            webhook_url = webhook_from_env(webhook_env, env)
        except ValueError as exc:
            tried["webhook"] = 0
            errors.append(f"webhook: not attempted: {exc}")
    if webhook_url is not None:
        try:  # a job stored before the URL was checked where it entered: recorded as failed, not raised
            check_webhook_url(webhook_url)
        except ValueError as exc:
            tried["webhook"] = 0
            errors.append(f"webhook {mask_url(webhook_url)}: not attempted: {exc}")
            webhook_url = None
    if webhook_url is not None:
        url = webhook_url
        n, err = with_retries(lambda: post_webhook(url, summary), attempts=attempts,
                              backoff_s=backoff_s, sleep=sleep)  # fmt: skip
        tried["webhook"] = n
        if err:
            errors.append(f"webhook {mask_url(url)}: failed after {n} attempts: {err}")
    if smtp:
        try:
            settings = SmtpSettings.from_env(env)
        except ValueError as exc:
            tried["smtp"] = 0
            errors.append(f"smtp: not attempted: {exc}")
        else:
            subject, body = email_text(summary)
            n, err = with_retries(lambda: send_email(settings, subject, body), attempts=attempts,
                                  backoff_s=backoff_s, sleep=sleep)  # fmt: skip
            tried["smtp"] = n
            if err:
                errors.append(f"smtp {settings.host}:{settings.port}: failed after {n} attempts: {err}")
    status = DELIVERED if not errors else FAILED if len(errors) == len(tried) else PARTIAL
    return DeliveryOutcome(status, "\n".join(errors) or None, tried)


def record_delivery(engine: Engine, report_id: int, outcome: DeliveryOutcome) -> None:
    """Record a delivery's outcome on its report: one UPDATE, waited for while another process holds the store
    locked (the delivery itself is not made again)."""
    def write() -> None:
        with engine.begin() as c:
            c.execute(
                update(Report)
                .where(Report.id == report_id)
                .values(delivery_status=outcome.status, delivery_error=outcome.error)
            )

    retry_while_locked(engine, write)
    if outcome.error:
        logger.error("report %d: delivery %s: %s", report_id, outcome.status, outcome.error)
