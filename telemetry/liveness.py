"""Whether a run left 'running' still has a process behind it: a run whose process is gone reads 'stale'.

A bench, load test or server ends its runs ('completed', 'cancelled', 'failed') as it stops; one killed outright
(SIGKILL, the OOM killer, a crash, the machine going down) never does, and its runs stayed 'running' for good,
told apart from a live one by nothing. Each run records the process that started it (migration 0014): runs.pid
and runs.process_key, which names that process instance (its host, machine and boot, pid and time namespaces
and start time), so a pid the kernel has handed to another process since is not mistaken for it.

The status is derived where the store is read, never written: a reader cannot race the writer ending its run,
nothing needs a write lock (a read-only store reads the same), and a PostgreSQL store shared by several hosts is
read alike by each. A run reads 'stale' only where this process can tell for sure that its process is gone: same
host and boot, same pid namespace (and time namespace: a process's start time in /proc is shifted by the
reader's), and the pid is not there, is a zombie, or is another process (another start time); or same host and
machine id, the machine has booted since, and the run started before that boot (machines cloned from one image
share host name and machine id: a run another one of them started since this one booted may be under way).
Anything else (another host, another container, a run recorded before 0014, Windows, where a process cannot be
probed without signalling it) keeps 'running': it may be under way, and nothing here can say otherwise.
"""
from __future__ import annotations

import functools
import os
import socket
from collections.abc import Iterable
from datetime import UTC, datetime

RUNNING = "running"
STALE = "stale"  # 'running' in the store, its process gone: killed or crashed before it could end the run
_KEY_VERSION = "2"  # '2|host|machine id|boot id|pid namespace|time namespace|start ticks'
_OLD_KEY_VERSION = "1"  # '1|host|machine id|boot id|pid namespace|start ticks': no time namespace (read alike)
_SEP = "|"


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of /proc/<pid>/stat; None where there is no such process."""
    text = _read(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text[text.rfind(")") + 2:].split()  # after the command name, which may hold spaces and ')'
    return (fields[0], fields[19]) if len(fields) > 19 else None  # state (3rd field), starttime (22nd)


def _namespace(kind: str) -> str:
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return ""


@functools.cache
def _machine() -> tuple[str, str, str, str, str]:
    """(host name, machine id, boot id, pid namespace, time namespace) of this process; '' for what the system
    does not tell."""
    return (socket.gethostname(), _read("/etc/machine-id"), _read("/proc/sys/kernel/random/boot_id"),
            _namespace("pid"), _namespace("time"))


def _boot_time() -> float | None:
    """When this machine booted (seconds since the epoch: /proc/stat's btime); None where the system does not
    tell."""
    for line in _read("/proc/stat").splitlines():
        if line.startswith("btime "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def process_key(pid: int | None = None) -> str:
    """The identity of process `pid` (default: this one) as runs.process_key holds it: '2|host|machine id|boot
    id|pid namespace|time namespace|start ticks' (fields the system does not tell are empty)."""
    pid = os.getpid() if pid is None else pid
    stat = _stat(pid)
    return _SEP.join((_KEY_VERSION, *_machine(), stat[1] if stat else ""))


def _parse(key: str) -> tuple[str, str, str, str, str | None, str] | None:
    """(host, machine id, boot id, pid namespace, time namespace, start ticks) of a process key; the time
    namespace None in a key recorded before keys named it (version 1); None for a key this cannot read."""
    parts = key.split(_SEP)
    if parts[0] == _KEY_VERSION and len(parts) == 7:
        host, machine, boot, pid_ns, time_ns, start = parts[1:]
        return host, machine, boot, pid_ns, time_ns, start
    if parts[0] == _OLD_KEY_VERSION and len(parts) == 6:
        host, machine, boot, pid_ns, start = parts[1:]
        return host, machine, boot, pid_ns, None, start
    return None


def _before_this_boot(started_at) -> bool:
    """Whether a run that started at `started_at` (runs.started_at: a datetime, naive in UTC as SQLite keeps it,
    or its ISO text) started before this machine's current boot; False where either is not known."""
    booted = _boot_time()
    if booted is None or started_at is None:
        return False
    try:
        if isinstance(started_at, str):
            started_at = datetime.fromisoformat(started_at)
        if not isinstance(started_at, datetime):
            return False
        if started_at.tzinfo is None:
            started_at = started_at.replace(tzinfo=UTC)
        return started_at.timestamp() < booted
    except (ValueError, TypeError, OverflowError):  # NaT, junk text
        return False


def process_gone(pid: int | None, key: str | None, started_at=None) -> bool:
    """Whether the process that recorded `pid` and `key` (runs.pid, runs.process_key) for a run that started at
    `started_at` (runs.started_at) is known to be gone, as seen from this process: False wherever that cannot be
    told (see the module's docstring)."""
    if pid is None or not key:
        return False
    parsed = _parse(key)
    if parsed is None:
        return False
    host, machine, boot, namespace, time_ns, start = parsed
    my_host, my_machine, my_boot, my_namespace, my_time_ns = _machine()
    if host != my_host:
        return False
    if boot != my_boot:  # the machine booted since, if it is this one: the same host name and machine id, and the
        # run started before this boot (a machine cloned from the same image shares both, and has its own boot id)
        return bool(boot and my_boot and machine and machine == my_machine) and _before_this_boot(started_at)
    if namespace != my_namespace:  # another container: its pids are not this one's to read
        return False
    if time_ns is not None and time_ns != my_time_ns:  # another time namespace: /proc's start times are shifted
        return False
    if not my_boot:  # no /proc (not Linux): whether the pid is there at all, where that can be asked
        return _pid_absent(pid)
    stat = _stat(pid)
    return stat is None or stat[0] in ("Z", "X") or (bool(start) and stat[1] != start)


def _pid_absent(pid: int) -> bool:
    if os.name == "nt":  # signal 0 is CTRL_C_EVENT there: os.kill would send a console Ctrl-C, not probe the pid
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # there, another user's
        return False
    return False


def shown_status(status: str, pid: int | None, key: str | None, started_at=None) -> str:
    """A run's status as it is to be read: 'stale' for a 'running' run whose process is gone, else `status`;
    `started_at` (runs.started_at) tells a run from before the machine's last boot (process_gone)."""
    return STALE if status == RUNNING and process_gone(pid, key, started_at) else status


def stale_ids(rows: Iterable) -> set[int]:
    """The ids of the rows (id, status, pid, process_key[, started_at]) that read 'stale'."""
    return {row[0] for row in rows if shown_status(*row[1:5]) == STALE}
