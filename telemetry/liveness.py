"""Whether a run left 'running' still has a process behind it: a run whose process is gone reads 'stale'.

A bench, load test or server ends its runs ('completed', 'cancelled', 'failed') as it stops; one killed outright
(SIGKILL, the OOM killer, a crash, the machine going down) never does, and its runs stayed 'running' for good,
told apart from a live one by nothing. Each run records the process that started it (migration 0014): runs.pid
and runs.process_key, which names that process instance (its host, machine and boot, pid namespace and start
time), so a pid the kernel has handed to another process since is not mistaken for it.

The status is derived where the store is read, never written: a reader cannot race the writer ending its run,
nothing needs a write lock (a read-only store reads the same), and a PostgreSQL store shared by several hosts is
read alike by each. A run reads 'stale' only where this process can tell for sure that its process is gone: same
host and boot, same pid namespace, and the pid is not there, is a zombie, or is another process (another start
time); or same host and machine id, and the machine has booted since. Anything else (another host, another
container, a run recorded before 0014) keeps 'running': it may be under way, and nothing here can say otherwise.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Iterable

RUNNING = "running"
STALE = "stale"  # 'running' in the store, its process gone: killed or crashed before it could end the run
_KEY_VERSION = "1"
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


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


@functools.cache
def _machine() -> tuple[str, str, str, str]:
    """(host name, machine id, boot id, pid namespace) of this process; '' for what the system does not tell."""
    return (socket.gethostname(), _read("/etc/machine-id"), _read("/proc/sys/kernel/random/boot_id"),
            _pid_namespace())


def process_key(pid: int | None = None) -> str:
    """The identity of process `pid` (default: this one) as runs.process_key holds it: '1|host|machine id|boot
    id|pid namespace|start ticks' (fields the system does not tell are empty)."""
    pid = os.getpid() if pid is None else pid
    stat = _stat(pid)
    return _SEP.join((_KEY_VERSION, *_machine(), stat[1] if stat else ""))


def process_gone(pid: int | None, key: str | None) -> bool:
    """Whether the process that recorded `pid` and `key` (runs.pid, runs.process_key) is known to be gone, as
    seen from this process: False wherever that cannot be told (see the module's docstring)."""
    if pid is None or not key:
        return False
    parts = key.split(_SEP)
    if len(parts) != 6 or parts[0] != _KEY_VERSION:
        return False
    host, machine, boot, namespace, start = parts[1:]
    my_host, my_machine, my_boot, my_namespace = _machine()
    if host != my_host:
        return False
    if boot != my_boot:  # the machine booted since, if it is this one: the same host name and machine id
        return bool(boot and my_boot and machine and machine == my_machine)
    if namespace != my_namespace:  # another container: its pids are not this one's to read
        return False
    if not my_boot:  # no /proc (not Linux): whether the pid is there at all
        return _pid_absent(pid)
    stat = _stat(pid)
    return stat is None or stat[0] in ("Z", "X") or (bool(start) and stat[1] != start)


def _pid_absent(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # there, another user's
        return False
    return False


def shown_status(status: str, pid: int | None, key: str | None) -> str:
    """A run's status as it is to be read: 'stale' for a 'running' run whose process is gone, else `status`."""
    return STALE if status == RUNNING and process_gone(pid, key) else status


def stale_ids(rows: Iterable) -> set[int]:
    """The ids of the rows (id, status, pid, process_key) that read 'stale'."""
    return {row[0] for row in rows if shown_status(row[1], row[2], row[3]) == STALE}
