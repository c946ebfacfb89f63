"""Torch work of a serving process stays off the thread that hands over to the engine thread: a second
OpenMP pool oversubscribes the cores, and every parallel op then waits for a sleeping worker
(`serving.kernels.in_passing_thread`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from serving.kernels import in_passing_thread


def test_in_passing_thread_gives_the_result_or_the_exception():
    caller = threading.get_ident()
    assert in_passing_thread(lambda a, b=0: (a + b, threading.get_ident()), 2, b=3)[0] == 5
    assert in_passing_thread(threading.get_ident) != caller

    def fail():
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        in_passing_thread(fail)


@pytest.mark.skipif(not torch.backends.openmp.is_available(), reason="this torch build has no OpenMP")
def test_work_in_a_passing_thread_leaves_no_openmp_workers_behind():
    """In a fresh process (this one has pools already): the OS threads after the work, against before it."""
    script = textwrap.dedent("""
        import os, time, torch
        from serving.kernels import in_passing_thread
        torch.set_num_threads(2)
        count = lambda: len(os.listdir("/proc/self/task"))
        a = torch.randn(256, 256)
        work = lambda: (a @ a).softmax(-1).sum().item()
        before = count()
        in_passing_thread(work)
        deadline = time.monotonic() + 10
        while count() > before and time.monotonic() < deadline:  # the pool's workers exit with their thread
            time.sleep(0.05)
        after_passing = count()
        work()  # the same work on this thread keeps a worker
        print(before, after_passing, count())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    before, after_passing, after_here = map(int, out.stdout.split())
    assert after_passing == before
    assert after_here > before  # what the check would see had the work run on the caller


@pytest.mark.slow
def test_build_state_runs_its_torch_work_off_the_calling_thread(monkeypatch):
    from serving import models, server_setup
    from serving.server import shutdown
    from serving.worker import EngineSpec, Loaded, load

    models.pull(say=lambda m: None, verify=False)
    caller = threading.get_ident()
    seen: dict[str, set[int]] = {"load": set(), "engine": set()}

    def spy_load(spec):
        seen["load"].add(threading.get_ident())
        return load(spec)

    real_engine = Loaded.engine

    def spy_engine(self, *args, **kwargs):
        seen["engine"].add(threading.get_ident())
        return real_engine(self, *args, **kwargs)

    monkeypatch.setattr(server_setup, "load", spy_load)
    monkeypatch.setattr(Loaded, "engine", spy_engine)
    opts = server_setup.ServeOptions(spec=EngineSpec(dtype="float32", drafter="ngram", k="2", max_batch=2, max_len=256),
                                     telemetry=False, power="none")
    state = server_setup.build_state(opts)
    try:
        assert seen["load"] and seen["engine"]  # the model loaded, warmed up (an engine) and the server's engine
        assert caller not in seen["load"] | seen["engine"]
    finally:
        shutdown(state, "completed")


@pytest.mark.parametrize("env, threads, cpus, warned", [
    ({"MKL_NUM_THREADS": "abc"}, 1, 2, True),  # junk: torch falls back to one thread, nothing said
    ({"OMP_NUM_THREADS": "-3"}, 1, 4, True),
    ({}, 1, 2, False),  # torch's own choice (physical cores): no variable to name
    ({"OMP_NUM_THREADS": "4"}, 4, 4, False),  # every usable CPU: nothing to say
])  # fmt: skip
def test_a_thread_variable_that_caps_torch_below_the_cpus_is_warned_of(env, threads, cpus, warned, monkeypatch):
    import serving.worker as worker

    for name in worker.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr(worker, "usable_cpus", lambda: cpus)
    text = worker.thread_cap_warning()
    assert (text is not None) == warned
    if warned:
        (name, value), = env.items()
        assert f"{name}={value!r}" in text and f"{threads} thread" in text and f"the {cpus} CPUs" in text


@pytest.mark.parametrize("command", [["bench", "--limit", "1", "--no-telemetry"], ["serve", "--no-telemetry"]])
def test_bench_and_serve_warn_once_of_capped_threads_before_loading(command, monkeypatch, capsys):
    """Said on stderr before the model loads (the load is stopped here), once per process."""
    import serving.worker as worker
    from app.cli import main

    monkeypatch.setenv("MKL_NUM_THREADS", "abc")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(worker, "usable_cpus", lambda: 2)
    worker.say_thread_cap.cache_clear()

    def stop(*args, **kwargs):
        raise ValueError("stopped before loading")

    monkeypatch.setattr(worker, "load", stop)
    import serving.server_setup

    monkeypatch.setattr(serving.server_setup, "serve", stop)
    monkeypatch.setattr("app.commands.serve.bindable_port", lambda host, port: port)
    try:
        assert main(command) == 2
        assert main(command) == 2
    finally:
        worker.say_thread_cap.cache_clear()
    err = capsys.readouterr().err
    assert err.count("MKL_NUM_THREADS='abc'") == 1, err
    assert err.index("MKL_NUM_THREADS") < err.index("stopped before loading")
