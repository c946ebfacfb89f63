"""A folder that cannot be written, as a read-only mount or another user's folder is, for tests of read-only caches."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path


def read_only(monkeypatch, folder: Path) -> None:
    """Make `folder` and all below it unwritable: chmod a-w, and where that does not stop writes (root, whom file
    modes do not stop: os.access still says writable) os.mkdir, os.open and io.open for writing under it raise
    EROFS, as a read-only file system does. pytest's tmp_path cleanup copes with the modes."""
    for path in [folder, *folder.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    if not os.access(folder, os.W_OK):
        return
    root = os.path.abspath(folder)

    def refuse(path) -> None:
        full = os.path.abspath(os.fsdecode(path))
        if full == root or full.startswith(root + os.sep):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), full)

    mkdir, os_open, io_open = os.mkdir, os.open, io.open

    def ro_mkdir(path, *args, **kwargs):
        refuse(path)
        return mkdir(path, *args, **kwargs)

    def ro_os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse(path)
        return os_open(path, flags, *args, **kwargs)

    def ro_io_open(file, mode="r", *args, **kwargs):
        if isinstance(file, str | bytes | os.PathLike) and set(mode) & set("wax+"):
            refuse(file)
        return io_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", ro_mkdir)
    monkeypatch.setattr(os, "open", ro_os_open)
    monkeypatch.setattr(io, "open", ro_io_open)
