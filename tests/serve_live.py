"""One live server per test session for the serving tests: the bundled model (bf16, batch 8) behind
uvicorn in a background thread on a free loopback port, an API key, and a SQLite store of its own."""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@dataclass
class Live:
    url: str  # http://127.0.0.1:PORT
    db_url: str
    state: object  # serving.server.ServerState
    server: object  # uvicorn.Server
    thread: threading.Thread

    @property
    def model(self) -> str:
        return self.state.model_id

    def flush(self) -> None:
        assert self.state.telemetry.flush(60), "telemetry did not flush"


_live: Live | None = None


def shared_live(config) -> Live:
    """Start the server on first use; stopped (gracefully, runs ended) when the session ends."""
    global _live
    if _live is None:
        _live = _start()
        config.add_cleanup(_stop)
    return _live


def _start() -> Live:
    from serving.server_setup import ServeOptions
    from serving.worker import EngineSpec

    db_url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='specfinops-serve-')) / 'store.db'}"
    # a fixed K: these tests check what the server records for a speculative request, and the adaptive
    # policy may rightly choose K=0 for a whole short request where bf16 verification is dear (AVX2 CPUs)
    return start_server(ServeOptions(spec=EngineSpec(dtype="bfloat16", k="4", max_batch=8, max_len=1024), db=db_url,
                                     api_key=API_KEY, power="none"))


def start_server(opts) -> Live:
    """The server `opts` (serving.server_setup.ServeOptions) describe, behind uvicorn in a background thread
    on a free loopback port; stop it with `stop_server`."""
    import uvicorn

    from serving import models
    from serving.server import create_app
    from serving.server_setup import build_state

    models.pull(say=lambda m: None, verify=False)
    state = build_state(opts)
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return Live(f"http://127.0.0.1:{port}", opts.db, state, server, thread)


def stop_server(live: Live) -> None:
    live.server.should_exit = True
    live.thread.join(60)


def _stop() -> None:
    global _live
    if _live is not None:
        stop_server(_live)
        _live = None
