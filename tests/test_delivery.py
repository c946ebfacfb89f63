"""Delivery of a report's summary: webhook against a local HTTP server, e-mail against a local SMTP server
(both started by the tests), bounded retries with backoff, and the outcome recorded on the report."""

from __future__ import annotations

import email
import json
import socketserver
import threading
from email import policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy.orm import Session
from synthetic import BASE_TIME

from telemetry.db import Report
from telemetry.delivery import (
    DELIVERED,
    FAILED,
    PARTIAL,
    SmtpSettings,
    check_webhook_url,
    deliver,
    mask_url,
    record_delivery,
    webhook_from_env,
    with_retries,
)
from telemetry.store import open_store

SUMMARY = {
    "report_id": 7, "period": "daily", "since": "2026-11-02T00:00:00+00:00", "until": "2026-11-03T00:00:00+00:00",
    "traffic": True, "output_tokens": 132, "requests": 4,
    "modes": {"spec": {"total_usd_per_1m": 0.5646, "energy_estimated": True, "energy_included": True,
                       "energy_source": "estimated", "energy_complete": True, "cost_note": None},
              "ar": {"total_usd_per_1m": 0.7310, "energy_estimated": True, "energy_included": False,
                     "energy_source": "estimated", "energy_complete": False,
                     "cost_note": "estimated energy for only some requests: hardware only"}},
    "projection": {"annual_savings_usd": 0.0},
    "anomalies": [{"metric": "spec cost per 1M tokens (USD)", "status": "anomaly"}],
    "html_path": "/reports/report-7/report.html",
}  # fmt: skip


# ---- a local webhook receiver ---------------------------------------------------------------------------


class Hook(ThreadingHTTPServer):
    def __init__(self, status: int):
        self.status, self.bodies, self.keys = status, [], []
        super().__init__(("127.0.0.1", 0), HookHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


class HookHandler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["content-length"]))
        self.server.bodies.append((self.headers["content-type"], body))
        self.server.keys.append(self.headers.get("Idempotency-Key"))
        self.send_response(self.server.status)
        self.end_headers()
        # a failure echoes the path, as Express's default "Cannot POST <path>" page does
        self.wfile.write(f"Cannot POST {self.path}".encode() if self.server.status >= 400 else b"ok")

    def log_message(self, *_args):
        pass


@pytest.fixture
def hook_factory():
    servers = []

    def start(status: int = 200) -> Hook:
        srv = Hook(status)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


# ---- a local SMTP server (just enough of RFC 5321) ------------------------------------------------------


class Smtp(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, fail_data: bool = False):
        self.fail_data, self.messages, self.data_attempts, self.rcpts = fail_data, [], 0, []
        super().__init__(("127.0.0.1", 0), SmtpHandler)


class SmtpHandler(socketserver.StreamRequestHandler):
    def reply(self, line: str) -> None:
        self.wfile.write(line.encode() + b"\r\n")

    def handle(self):
        srv = self.server
        self.reply("220 test-smtp ready")
        while line := self.rfile.readline():
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                self.reply("250 test-smtp")
            elif verb == b"RCPT":
                srv.rcpts.append(line.decode().strip())
                self.reply("250 ok")
            elif verb == b"DATA":
                srv.data_attempts += 1
                if srv.fail_data:
                    self.reply("451 try again later")
                    continue
                self.reply("354 end with <CRLF>.<CRLF>")
                lines = []
                while (chunk := self.rfile.readline()) not in (b".\r\n", b""):
                    lines.append(chunk[1:] if chunk.startswith(b"..") else chunk)
                srv.messages.append(b"".join(lines))
                self.reply("250 queued")
            elif verb == b"QUIT":
                self.reply("221 bye")
                return
            else:  # MAIL, RSET, NOOP
                self.reply("250 ok")


@pytest.fixture
def smtp_factory():
    servers = []

    def start(fail_data: bool = False) -> Smtp:
        srv = Smtp(fail_data)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def smtp_env(srv: Smtp, **extra: str) -> dict:
    return {"SPECFINOPS_SMTP_HOST": "127.0.0.1", "SPECFINOPS_SMTP_PORT": str(srv.server_address[1]),
            "SPECFINOPS_SMTP_FROM": "finops@example.test", "SPECFINOPS_SMTP_TO": "cfo@example.test, ops@example.test",
            **extra}  # fmt: skip


# ---- tests ----------------------------------------------------------------------------------------------


def test_webhook_posts_the_json_summary(hook_factory):
    hook = hook_factory(200)
    outcome = deliver(SUMMARY, webhook_url=hook.url, backoff_s=0)
    assert (outcome.status, outcome.error, outcome.attempts) == (DELIVERED, None, {"webhook": 1})
    [(ctype, body)] = hook.bodies
    assert ctype == "application/json" and json.loads(body) == SUMMARY


def test_failing_webhook_is_retried_with_backoff_and_recorded(hook_factory, sqlite_url):
    hook = hook_factory(500)
    waits: list[float] = []
    outcome = deliver(SUMMARY, webhook_url=hook.url, attempts=3, backoff_s=0.5, sleep=waits.append)
    assert len(hook.bodies) == 3 and waits == [0.5, 1.0]
    assert outcome.status == FAILED and "failed after 3 attempts: HTTP 500" in outcome.error
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        s.add(Report(period="daily", since=BASE_TIME, until=BASE_TIME, html_path="x", csv_dir="x",
                     delivery_status="pending"))  # fmt: skip
        s.commit()
    record_delivery(engine, 1, outcome)
    with Session(engine) as s:
        row = s.get(Report, 1)
        assert row.delivery_status == "failed" and "HTTP 500" in row.delivery_error
        # named by scheme and host only: a Slack-style URL carries its secret in the path
        assert hook.url not in row.delivery_error and f"webhook {mask_url(hook.url)}:" in row.delivery_error


def test_every_attempt_of_a_reports_post_carries_its_idempotency_key(hook_factory):
    """A POST that timed out may have arrived: its retry reached the receiver twice with nothing to tell them
    apart by. Each attempt carries the report's key; another report (another store's #7 too) has another."""
    from telemetry.delivery import idempotency_key

    hook = hook_factory(500)
    deliver(SUMMARY, webhook_url=hook.url, attempts=3, backoff_s=0, sleep=lambda _s: None)
    key = idempotency_key(SUMMARY)
    assert key is not None and key.startswith("specfinops-report-7-") and hook.keys == [key] * 3
    hook.status = 200
    deliver(dict(SUMMARY), webhook_url=hook.url, attempts=1)  # re-delivered later: the same key
    assert hook.keys[-1] == key
    other_store = {**SUMMARY, "html_path": "/staging/report-7/report.html"}
    assert idempotency_key(other_store) != key and idempotency_key({**SUMMARY, "report_id": 8}) != key


def test_a_receiver_echoing_the_secret_path_is_recorded_masked(hook_factory, caplog):
    """A receiver's error page that echoes the request path ("Cannot POST /services/T0/SECRET?token=...") was kept
    as it came: the webhook's secret reached the store's delivery_error, the log and `scheduler --list`."""
    hook = hook_factory(404)
    url = hook.url.replace("/hook", "/services/T0/HOOKSECRETPATH?token=QTOKEN").replace("://", "://u:PW@")
    outcome = deliver(SUMMARY, webhook_url=url, attempts=1, backoff_s=0)
    assert outcome.status == FAILED and "HTTP 404: Cannot POST ***" in outcome.error, outcome.error
    said = outcome.error + " ".join(r.getMessage() for r in caplog.records)
    assert not any(secret in said for secret in ("HOOKSECRETPATH", "QTOKEN", "PW@")), said
    from telemetry.delivery import scrub_url

    # a short user name or password is not masked inside ordinary words
    assert scrub_url("some message from me: Cannot POST /hook", "https://me:pw@h.example/hook") \
        == "some message from me: Cannot POST ***"


def test_unreachable_webhook_fails_after_the_bounded_attempts():
    outcome = deliver(SUMMARY, webhook_url="http://127.0.0.1:9/hook", attempts=2, backoff_s=0)
    assert outcome.status == FAILED and outcome.attempts == {"webhook": 2}
    assert "ConnectError" in outcome.error


def test_email_reaches_a_local_smtp_server(smtp_factory):
    srv = smtp_factory()
    outcome = deliver(SUMMARY, smtp=True, env=smtp_env(srv), backoff_s=0)
    assert outcome.status == DELIVERED and outcome.attempts == {"smtp": 1}
    [raw] = srv.messages
    msg = email.message_from_bytes(raw, policy=policy.default)
    assert msg["Subject"] == "specfinops daily cost report 2026-11-02"
    assert msg["From"] == "finops@example.test" and "cfo@example.test" in msg["To"]
    body = msg.get_content()
    assert "Cost per 1M tokens, spec: $0.5646, incl. energy (estimated)" in body
    # a total without energy in it does not read as the full cost (the report's tile words)
    assert "Cost per 1M tokens, AR: $0.731, hardware only (energy for only some requests)" in body
    assert "Anomalies: spec cost per 1M tokens (USD)" in body and SUMMARY["html_path"] in body
    assert len(srv.rcpts) == 2


def test_smtp_refusal_is_retried_and_both_channels_reported(smtp_factory, hook_factory):
    srv, hook = smtp_factory(fail_data=True), hook_factory(204)
    outcome = deliver(SUMMARY, webhook_url=hook.url, smtp=True, env=smtp_env(srv), attempts=3, backoff_s=0)
    assert srv.data_attempts == 3 and not srv.messages
    assert outcome.status == PARTIAL and outcome.attempts == {"webhook": 1, "smtp": 3}
    assert "smtp 127.0.0.1" in outcome.error and "451" in outcome.error and "webhook" not in outcome.error


def test_smtp_settings_from_env():
    base = {"SPECFINOPS_SMTP_HOST": "mail", "SPECFINOPS_SMTP_FROM": "a@x", "SPECFINOPS_SMTP_TO": "b@x,c@x"}
    s = SmtpSettings.from_env(base)
    assert (s.port, s.starttls, s.recipients, s.user) == (25, False, ("b@x", "c@x"), None)
    s = SmtpSettings.from_env({**base, "SPECFINOPS_SMTP_USER": "u", "SPECFINOPS_SMTP_PASSWORD": "p"})
    assert (s.port, s.starttls) == (587, True)  # a login goes over STARTTLS unless told otherwise
    with pytest.raises(ValueError, match="SPECFINOPS_SMTP_HOST, SPECFINOPS_SMTP_TO"):
        SmtpSettings.from_env({"SPECFINOPS_SMTP_FROM": "a@x"})
    with pytest.raises(ValueError, match="PORT must be a port number"):
        SmtpSettings.from_env({**base, "SPECFINOPS_SMTP_PORT": "smtp"})
    with pytest.raises(ValueError, match="both SPECFINOPS_SMTP_USER and SPECFINOPS_SMTP_PASSWORD"):
        SmtpSettings.from_env({**base, "SPECFINOPS_SMTP_USER": "u"})
    outcome = deliver(SUMMARY, smtp=True, env={})  # misconfigured at run time: recorded, not raised
    assert outcome.status == FAILED and outcome.attempts == {"smtp": 0} and "not attempted" in outcome.error


def test_with_retries_stops_at_the_first_success():
    from telemetry.delivery import DeliveryError

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 2:
            raise DeliveryError("boom")

    assert with_retries(flaky, attempts=5, backoff_s=0, sleep=lambda _s: None) == (2, None)
    with pytest.raises(ValueError, match="attempts"):
        with_retries(flaky, attempts=0)
    with pytest.raises(ValueError, match="--webhook must be an http"):
        check_webhook_url("ftp://example.test/hook")


def test_webhook_urls_are_masked_for_printing():
    assert mask_url("https://hooks.slack.com/services/T0/B0/s3cr3t") == "https://hooks.slack.com/***"
    assert mask_url("https://user:pw@hooks.example:8443/x?token=s3cr3t") == "https://hooks.example:8443/***"
    assert mask_url("https://hooks.example") == "https://hooks.example/" and mask_url(None) == ""
    with pytest.raises(ValueError) as exc:
        check_webhook_url("hooks.example/s3cr3t")
    assert "s3cr3t" not in str(exc.value)


def test_webhook_url_from_the_environment(hook_factory):
    hook = hook_factory(200)
    outcome = deliver(SUMMARY, webhook_env="HOOK_URL", env={"HOOK_URL": hook.url}, backoff_s=0)
    assert outcome.status == DELIVERED and len(hook.bodies) == 1
    outcome = deliver(SUMMARY, webhook_env="HOOK_URL", env={}, backoff_s=0)  # unset at run time: recorded
    assert outcome.status == FAILED and outcome.attempts == {"webhook": 0}
    assert "not attempted" in outcome.error and "HOOK_URL is not set" in outcome.error


# ---- a webhook URL with a bad port or host ---------------------------------------------------------------

BAD_URLS = [
    ("http://127.0.0.1:99999/hook", "has a bad port: it must be a number in 1..65535, got '99999'"),
    ("http://h:abc/s3cr3t", "has a bad port: it must be a number in 1..65535, got 'abc'"),
    ("http://h:0/s3cr3t", "has a bad port"),
    ("http://[::1", "is not a valid URL: Invalid IPv6 URL"),
    ("http://:80/s3cr3t", "must name a host"),
    ("http://", "must name a host"),  # was 'must be an http:// or https:// URL, got scheme 'http''
    ("https:///s3cr3t", "must name a host"),
    ("http://a b/s3cr3t", "must not contain spaces"),
]


@pytest.mark.parametrize(("url", "needle"), BAD_URLS)
def test_a_bad_webhook_url_is_refused_naming_the_flag_or_variable(url, needle):
    with pytest.raises(ValueError) as exc:
        check_webhook_url(url)
    assert str(exc.value).startswith("--webhook ") and needle in str(exc.value) and "s3cr3t" not in str(exc.value)
    with pytest.raises(ValueError) as exc:
        webhook_from_env("HOOK_URL", {"HOOK_URL": url})
    assert str(exc.value).startswith("--webhook-env HOOK_URL ") and needle in str(exc.value)
    assert mask_url(url).startswith("http") or mask_url(url) == "***"  # never raises
    assert "s3cr3t" not in mask_url(url)


def test_good_webhook_urls_pass_and_mask():
    for url in ("https://hooks.slack.com/services/T0/B0/x", "http://127.0.0.1:65535/h", "http://[::1]:8080/h"):
        assert check_webhook_url(url) == url
    assert mask_url("http://[::1]:8080/h") == "http://[::1]:8080/***"
    assert mask_url("http://127.0.0.1:99999/hook") == "http://127.0.0.1:99999/***"
    assert mask_url("http://[::1") == "http://***"


@pytest.mark.parametrize(("url", "needle"), BAD_URLS)
def test_a_stored_bad_webhook_url_is_recorded_as_failed_not_raised(url, needle):
    """A job stored before the URL was checked where it entered: its delivery fails, on one line, never raises."""
    outcome = deliver(SUMMARY, webhook_url=url, attempts=2, backoff_s=0)
    assert outcome.status == FAILED and outcome.attempts == {"webhook": 0}
    assert len(outcome.error.splitlines()) == 1 and "not attempted" in outcome.error and needle in outcome.error
    outcome = deliver(SUMMARY, webhook_env="HOOK_URL", env={"HOOK_URL": url}, attempts=2, backoff_s=0)
    assert outcome.status == FAILED and "--webhook-env HOOK_URL" in outcome.error


def test_a_url_httpx_cannot_parse_fails_the_post_as_a_delivery_error():
    from telemetry.delivery import DeliveryError, post_webhook

    with pytest.raises(DeliveryError, match="InvalidURL"):
        post_webhook("http://h:abc/", SUMMARY)


def test_the_email_writes_money_as_the_report_does():
    """The e-mail had its own formats: $4e-05 for a tiny cost, $1.235e+04 for a large one, "$-17,492" for a loss
    and "$—" for no projection; it writes money as the report and `cost` do (labels.usd_amount)."""
    from telemetry.delivery import email_text

    def body(spec, ar, savings) -> str:
        modes = {"spec": {"total_usd_per_1m": spec, "energy_included": True, "energy_source": "measured"},
                 "ar": {"total_usd_per_1m": ar, "energy_included": True, "energy_source": "measured"}}
        return email_text({**SUMMARY, "modes": modes, "projection": {"annual_savings_usd": savings}})[1]

    text = body(4e-05, 12345.6, -17492.4)
    assert "Cost per 1M tokens, spec: $0.00004" in text and "Cost per 1M tokens, AR: $12,346" in text
    assert "Projected annual savings: -$17,492" in text
    text = body(0.5, None, None)
    assert "Cost per 1M tokens, spec: $0.50" in text and "Cost per 1M tokens, AR: —" in text
    assert "Projected annual savings: —" in text

