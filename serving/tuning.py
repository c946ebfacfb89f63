"""Measured choices remembered per machine, so that every run on one machine makes the same choice.

Some of the engine's choices are made by racing kernels (serving/int8.py's draft rows, serving/kernels.py's
linear rows and decode attention). Where the two are close
on a machine, the race can go either way from one process to the next on a shared VM, and where the
choice changes what the draft proposes (int8 weights round differently), two runs of one command on
one machine then record different drafters: on an AVX-512 EPYC, five fresh processes chose int8 for up
to 2, 1, 1, 1 and 0 rows, and the bench runs came out labelled `draft@int8` and `draft` by turns, so
the dashboard and `project` pooled them as two configurations. Remembering the first measurement makes
repeated runs comparable, as autotuning caches do.

The choices live in `<cache>/tuning.json` (serving.models.cache_dir: `SPECFINOPS_CACHE`, else
$XDG_CACHE_HOME/specfinops, else ~/.cache/specfinops), keyed by the machine: the CPU model (with its family and
model numbers), its vector-extension flags, the torch version and the thread count, so a different CPU (a VM
moved to another host class) or another torch build measures afresh.
`SPECFINOPS_TUNING` says what to do:

- `remember` (default): use the remembered value, measure and remember it when there is none;
- `measure`: measure in every process and remember nothing (what the engine did before);
- `refresh`: measure now and replace the remembered value.

A file that cannot be read is measured over; one that cannot be written only loses the memory (a
warning, once per process), never the run. Delete the file to forget every choice.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

ENV = "SPECFINOPS_TUNING"
FILE_NAME = "tuning.json"
# flags that change which kernel wins (matrix and vector units)
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16", "amx_int8",
         "amx_tile", "asimd", "sve", "bf16", "i8mm")


def _mode() -> str:
    value = os.environ.get(ENV, "remember").strip().lower()
    if value not in ("remember", "measure", "refresh"):
        raise ValueError(f"{ENV} must be remember, measure or refresh, got {value!r}")
    return value


def _cpu() -> tuple[str, list[str]]:
    """(model name, the FLAGS this CPU has) from /proc/cpuinfo, or what platform says elsewhere. A virtual
    machine's model name is often only the vendor's ('AMD EPYC'), the same for CPU generations whose kernels
    rank apart (a Zen 5 EPYC's bf16 matmuls paid for every new cache length, an earlier EPYC's did not), so
    the CPU family and model numbers are part of the name where /proc/cpuinfo gives them."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return name, []
    family = model = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and value:
            name = value
        elif key == "cpu family" and family is None:
            family = value
        elif key == "model" and model is None:
            model = value
        elif key in ("flags", "Features"):
            flags.update(value.split())
    if family is not None and model is not None:
        name += f" (family {family} model {model})"
    return name, sorted(f for f in FLAGS if f in flags)


def machine_key() -> str:
    """What a remembered measurement is valid for: CPU model (family and model numbers too) and flags, torch
    version, threads."""
    name, flags = _cpu()
    return f"{name} [{' '.join(flags)}] torch {torch.__version__} threads {torch.get_num_threads()}"


def tuning_file() -> Path:
    from serving.models import cache_dir

    return cache_dir() / FILE_NAME


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("tuning: ignoring %s (%s); measuring again", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


_unwritable: set[Path] = set()  # files a warning has been said of in this process


def _write(path: Path, data: dict) -> None:
    """Whole-file replace (write a temporary file, then rename), so a reader never sees half a file. A file that
    cannot be written is said once per process, with how to avoid it: a bench on a read-only cache said it for
    every choice measured (16 times)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tuning-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        if path not in _unwritable:
            _unwritable.add(path)
            log.warning("tuning: could not remember the measurement in %s (%s); every process measures again: set "
                        "SPECFINOPS_CACHE to a writable folder, or SPECFINOPS_TUNING=measure to not try (said once)",
                        path, exc)


def tuning_mode() -> str:
    """SPECFINOPS_TUNING: remember, measure or refresh (checked)."""
    return _mode()


def _usable(value: object, valid: Callable[[int], bool] | None) -> bool:
    """Whether a stored value is an int (not a bool) that `valid` (where given) accepts."""
    return isinstance(value, int) and not isinstance(value, bool) and (valid is None or valid(value))


def is_remembered(name: str, valid: Callable[[int], bool] | None = None) -> bool:
    """Whether `remembered(name, ..., valid)` would return a remembered value here without measuring."""
    if _mode() != "remember":
        return False
    value = _read(tuning_file()).get(machine_key(), {})
    value = value.get(name) if isinstance(value, dict) else None
    return _usable(value, valid)


def remembered(name: str, measure: Callable[[], int], valid: Callable[[int], bool] | None = None) -> int:
    """The remembered value of the choice `name` on this machine, or `measure()` remembered for next time
    (see the module docstring for SPECFINOPS_TUNING). `valid`: which stored ints the choice can decode; any
    other stored value (a hand edit, another version's encoding) is measured over and replaced."""
    mode = _mode()
    if mode == "measure":
        return measure()
    path, key = tuning_file(), machine_key()
    if mode == "remember":
        entry = _read(path).get(key, {})
        value = entry.get(name) if isinstance(entry, dict) else None
        if _usable(value, valid):
            return value
        if value is not None:
            log.warning("tuning: ignoring %s's remembered value %r in %s; measuring again", name, value, path)
    value = measure()
    data = _read(path)  # again: another process may have written meanwhile
    entry = data.get(key) if isinstance(data.get(key), dict) else {}
    data[key] = {**entry, name: value}
    _write(path, data)
    return value
