"""`specfinops dashboard`: run the Streamlit dashboard over a store."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from app.commands._common import add_command, add_db_option, bindable_port
from app.errors import UsageError

EXAMPLES = """  specfinops dashboard
  specfinops dashboard --db sqlite:///var/specfinops.db --port 8502
  specfinops dashboard --db postgresql://user@db-host/specfinops --host 0.0.0.0   # reachable from the network
"""

ENV_DB_URL = "SPECFINOPS_DB_URL"


def register(sub) -> None:
    p = add_command(sub, "dashboard", "Open the FinOps dashboard (Streamlit) over a store.", EXAMPLES, run)
    add_db_option(p)
    p.add_argument("--port", type=int, default=8501, help="HTTP port (default 8501; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")


def main_script() -> Path:
    """The dashboard's entry file, located through the package so it works from any directory."""
    import app.dashboard

    return Path(app.dashboard.__file__).resolve().parent / "main.py"


def streamlit_argv(script: Path, host: str, port: int, headless: bool) -> list[str]:
    """`python -P -m streamlit run ...`: -P keeps the working folder off the import path, where `-m` puts it
    first: started from a project with its own `app/` package (a FastAPI or Flask one), an installed specfinops's
    dashboard imported that `app` and showed a blank page (ModuleNotFoundError: app.dashboard)."""
    return [
        sys.executable, "-P", "-m", "streamlit", "run", str(script),
        "--server.address", host,
        "--server.port", str(port),
        "--server.headless", "true" if headless else "false",
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--browser.gatherUsageStats", "false",
        "--client.toolbarMode", "viewer",
    ]  # fmt: skip


def run(args) -> int:
    from telemetry.db import resolve_db_url
    from telemetry.store import NoStoreError, StoreError, open_store, shown_url

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0..65535, got {args.port}")
    url = resolve_db_url(args.db)
    try:
        open_store(url, must_exist=True).dispose()  # fail here, in one line, rather than inside the browser
    except NoStoreError as exc:
        raise UsageError(str(exc)) from None
    except StoreError as exc:  # a directory, not a SQLite file: its message names the path
        raise UsageError(f"cannot open the store: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any driver error means the URL is unusable
        # the URL as given may hold a password: shown masked, as every other command shows it
        raise UsageError(f"cannot open the store {shown_url(url)}: {str(exc).splitlines()[0]}") from None
    port = bindable_port(args.host, args.port)
    headless = not sys.stdin.isatty()
    shown_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    print(f"Dashboard: http://{shown_host}:{port}", flush=True)
    env = dict(os.environ, **{ENV_DB_URL: url})
    root = str(main_script().parents[2])  # the folder holding this `app` package
    if root != sysconfig.get_paths()["purelib"]:  # a checkout (run from it, or installed editable): on the path
        # of the -P child by name, as the working folder it was run from is not; an install's is there already
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    argv = streamlit_argv(main_script(), args.host, port, headless)
    os.execve(sys.executable, argv, env)  # the dashboard replaces this process: Ctrl-C and kill reach it
    return 0  # not reached
