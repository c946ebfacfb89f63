"""Power sources (NVML, RAPL, a labelled TDP estimate, none) and the sampler thread of a run.

Each source returns `PowerReading`s labelled with where they came from (`source`: nvml | rapl |
estimate). Hardware energy counters are preferred (NVML total energy in mJ, RAPL energy in uJ); polling
power is the fallback. `detect_power_source` says once what it fell back to. Energy per request is
computed by `telemetry.energy` from the readings (counter difference, else power integration).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from telemetry.energy import attribute_energy, energy_for_window
from telemetry.records import PowerReading

__all__ = [
    "EstimatePowerSource",
    "NoPowerSource",
    "NvmlNotSupported",
    "NvmlPowerSource",
    "PowerSampler",
    "PowerSource",
    "PowerSourceError",
    "RaplPowerSource",
    "attribute_energy",
    "detect_power_source",
    "energy_for_window",
]

logger = logging.getLogger(__name__)

PREFERENCES = ("auto", "nvml", "rapl", "estimate", "none")
RAPL_ROOT = Path("/sys/class/powercap")
_said: set[str] = set()  # hardware warnings are said once per process


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        logger.warning(message)


class PowerSourceError(RuntimeError):
    """A power source could not be opened or read; the message says which and why."""


class NvmlNotSupported(PowerSourceError):
    """The device does not support this NVML query."""


class PowerSource(Protocol):
    source: str  # label stored with every sample: nvml | rapl | estimate | none
    description: str  # for people: "NVML: 8 x NVIDIA H100 (energy counter)"

    def read(self) -> list[PowerReading]: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------- NVML


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:
        raise PowerSourceError(
            "NVML power needs nvidia-ml-py: pip install nvidia-ml-py (or 'specfinops[gpu]')"
        ) from exc
    return pynvml


def visible_gpu_indices(gpus: int) -> list[int] | None:
    """NVML indices of the `gpus` GPUs a run's workers take: the first `gpus` of CUDA_VISIBLE_DEVICES (numbers),
    or 0..gpus-1 where it is unset. None where it names GPUs otherwise (UUIDs, MIG slices): NVML then reads
    every GPU it sees, and says so."""
    import os

    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None or not env.strip():
        return list(range(gpus))
    entries = [e.strip() for e in env.split(",") if e.strip()]
    if not all(e.isdigit() for e in entries):
        _say_once(f"CUDA_VISIBLE_DEVICES={env} names GPUs NVML cannot index: reading every GPU NVML sees")
        return None
    return [int(e) for e in entries[:gpus]]


class NvmlPowerSource:
    """NVIDIA GPUs through NVML: the total-energy counter (mJ) when supported, else power usage (mW).

    `nvml` is the pynvml module; tests pass a small fake with the same functions.
    """

    source = "nvml"

    def __init__(self, device_indices: list[int] | None = None, *, nvml: ModuleType | Any | None = None) -> None:
        self._nvml = nvml if nvml is not None else _import_pynvml()
        self._call("nvmlInit")
        try:
            count = self._device_count()
            indices = list(range(count)) if device_indices is None else device_indices
            for i in indices:
                if not 0 <= i < count:
                    raise PowerSourceError(f"GPU index {i} out of range: NVML sees {count} devices")
            self._handles = {i: self._call("nvmlDeviceGetHandleByIndex", i) for i in indices}
            if not self._handles:
                raise PowerSourceError("NVML sees no GPU")
            self._has_counter = {i: self._supports(self.total_energy_mj, h) for i, h in self._handles.items()}
            self._has_power = {i: self._supports(self.power_usage_mw, h) for i, h in self._handles.items()}
            self._has_util = {i: self._supports(self.utilization_pct, h) for i, h in self._handles.items()}
            unmeasured = [i for i in indices if not (self._has_counter[i] or self._has_power[i])]
            if unmeasured:
                raise PowerSourceError(f"GPUs {unmeasured} report neither total energy nor power usage")
            names = {self._call("nvmlDeviceGetName", h) for h in self._handles.values()}
        except BaseException:
            self.close()
            raise
        kind = "energy counter" if all(self._has_counter.values()) else "power polling on some GPUs"
        name = ", ".join(sorted(n.decode() if isinstance(n, bytes) else str(n) for n in names))
        self.description = f"NVML: {len(self._handles)} x {name} ({kind})"
        if not all(self._has_counter.values()):
            _say_once(f"NVML total energy counter not supported on some GPUs: polling power there ({name})")

    def _call(self, fn: str, *args: Any) -> Any:
        """Every NVML call goes through here: NVML errors become PowerSourceError naming the call."""
        try:
            return getattr(self._nvml, fn)(*args)
        except Exception as exc:
            not_supported = getattr(self._nvml, "NVMLError_NotSupported", None)
            if not_supported is not None and isinstance(exc, not_supported):
                raise NvmlNotSupported(f"{fn}: not supported on this device") from exc
            nvml_error = getattr(self._nvml, "NVMLError", None)
            if nvml_error is not None and isinstance(exc, nvml_error):
                raise PowerSourceError(f"NVML {fn} failed: {exc}") from exc
            raise

    @staticmethod
    def _supports(query: Callable[[Any], object], handle: Any) -> bool:
        try:
            query(handle)
        except NvmlNotSupported:
            return False
        return True

    def _device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def total_energy_mj(self, handle: Any) -> int:
        """nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver was loaded (Volta and newer)."""
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption", handle))

    def power_usage_mw(self, handle: Any) -> int:
        """nvmlDeviceGetPowerUsage: current board power in milliwatts."""
        return int(self._call("nvmlDeviceGetPowerUsage", handle))

    def utilization_pct(self, handle: Any) -> float:
        """nvmlDeviceGetUtilizationRates(...).gpu: percent of time a kernel ran over the last period."""
        return float(self._call("nvmlDeviceGetUtilizationRates", handle).gpu)

    def read(self) -> list[PowerReading]:
        now = datetime.now(UTC)
        out = []
        for i, h in self._handles.items():
            energy_mj = self.total_energy_mj(h) if self._has_counter[i] else None
            power_w = self.power_usage_mw(h) / 1000.0 if self._has_power[i] else None
            util = self.utilization_pct(h) if self._has_util[i] else None
            out.append(PowerReading(now, i, power_w, energy_mj, util, self.source))
        return out

    def close(self) -> None:
        try:
            self._call("nvmlShutdown")
        except PowerSourceError:
            pass


# ---------------------------------------------------------------------------------------------- RAPL

_RAPL_PACKAGE = re.compile(r"intel-rapl:\d+$")  # packages only; subzones (intel-rapl:0:0) are inside them


def _is_package(zone: Path) -> bool:
    """A top-level zone is a CPU package unless its `name` says otherwise: on some Intel client machines one is
    'psys' (the whole platform, packages included), which counted beside them would count the CPU twice."""
    try:
        name = (zone / "name").read_text().strip()
    except OSError:
        return True  # no name to read: taken for the package its place says it is
    return name.startswith("package")


class RaplPowerSource:
    """CPU packages through Linux powercap RAPL (energy_uj counters, wraparound at max_energy_range_uj). Every
    package must be readable: some of them is not the CPU's energy (PowerSourceError, as with none)."""

    source = "rapl"

    def __init__(self, root: Path = RAPL_ROOT) -> None:
        zones = sorted(p for p in Path(root).glob("intel-rapl:*")
                       if _RAPL_PACKAGE.fullmatch(p.name) and _is_package(p))
        self._zones: list[tuple[Path, int]] = []
        problems = []
        for z in zones:
            try:
                (z / "energy_uj").read_text()
                self._zones.append((z, int((z / "max_energy_range_uj").read_text())))
            except (OSError, ValueError) as exc:
                problems.append(f"{z.name}: {type(exc).__name__}: {exc}")
        if not self._zones:
            why = "; ".join(problems) if problems else "no intel-rapl package zone"
            raise PowerSourceError(f"RAPL not readable under {root} ({why})")
        if problems:  # the packages read are part of the CPU: their energy, labelled measured, would be short
            raise PowerSourceError(
                f"RAPL reads only {len(self._zones)} of {len(zones)} CPU packages under {root} "
                f"({'; '.join(problems)}): the CPU's energy would be only theirs, so RAPL is not used")
        self._last_uj: list[int | None] = [None] * len(self._zones)
        self._total_uj = [0] * len(self._zones)
        self._last_t: list[datetime | None] = [None] * len(self._zones)
        self.description = f"RAPL: {len(self._zones)} CPU package(s) (energy counter)"

    def energy_uj(self, zone: Path) -> int:
        """The package's energy counter in microjoules (wraps at max_energy_range_uj)."""
        try:
            return int((zone / "energy_uj").read_text())
        except (OSError, ValueError) as exc:
            raise PowerSourceError(f"RAPL {zone / 'energy_uj'}: {exc}") from exc

    def read(self) -> list[PowerReading]:
        now = datetime.now(UTC)
        out = []
        for i, (zone, max_range_uj) in enumerate(self._zones):
            raw = self.energy_uj(zone)
            last, power_w = self._last_uj[i], None
            if last is not None:
                delta = raw - last if raw >= last else raw + max_range_uj - last  # wrapped around
                self._total_uj[i] += delta
                dt = (now - self._last_t[i]).total_seconds()  # type: ignore[operator]
                power_w = delta / 1e6 / dt if dt > 0 else None
            self._last_uj[i], self._last_t[i] = raw, now
            out.append(PowerReading(now, i, power_w, self._total_uj[i] / 1000.0, None, self.source))
        return out

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------ estimate, none


class EstimatePowerSource:
    """A configured TDP, constant or scaled by utilization. Every sample is labelled 'estimate'.

    With `utilization_fn` (returns percent), power = idle + (tdp - idle) x utilization / 100, where
    idle = `idle_fraction` x tdp; without it, power = tdp (an upper-bound estimate).
    """

    source = "estimate"

    def __init__(
        self, tdp_w: float, *, utilization_fn: Callable[[], float] | None = None, idle_fraction: float = 0.3,
        devices: int = 1,
    ) -> None:
        if not tdp_w > 0:
            raise ValueError(f"tdp_w must be > 0 watts, got {tdp_w}")
        if not isinstance(devices, int) or devices < 1:
            raise ValueError(f"devices must be a whole number >= 1, got {devices!r}")
        self.devices = devices  # one reading each: a run over 4 GPUs draws 4 x the TDP of one
        if not 0 <= idle_fraction <= 1:
            raise ValueError(f"idle_fraction must be within [0, 1], got {idle_fraction}")
        self.tdp_w = float(tdp_w)
        self._util = utilization_fn
        self._idle_w = idle_fraction * self.tdp_w
        how = "utilization-scaled" if utilization_fn else "constant"
        each = "" if devices == 1 else f" x {devices} devices"
        self.description = f"estimate: {how} TDP {self.tdp_w:g} W{each} (not measured)"

    def read(self) -> list[PowerReading]:
        now = datetime.now(UTC)
        if self._util is None:
            return [PowerReading(now, i, self.tdp_w, None, None, self.source) for i in range(self.devices)]
        util = min(max(float(self._util()), 0.0), 100.0)
        power_w = self._idle_w + (self.tdp_w - self._idle_w) * util / 100.0
        return [PowerReading(now, i, power_w, None, util, self.source) for i in range(self.devices)]

    def close(self) -> None:
        pass


class NoPowerSource:
    """No power information: no samples, so every energy figure is None (unknown), never 0."""

    source = "none"
    description = "none: energy not measured"

    def read(self) -> list[PowerReading]:
        return []

    def close(self) -> None:
        pass


def detect_power_source(
    preference: str = "auto",
    *,
    tdp_w: float | None = None,
    nvml: ModuleType | Any | None = None,
    rapl_root: Path = RAPL_ROOT,
    gpus: int | None = None,
) -> PowerSource:
    """The power source to use. 'auto' tries NVML, then RAPL, then the TDP estimate (when `tdp_w` is
    given), then none, and says once what it fell back to and why. An explicit choice that cannot be
    opened raises PowerSourceError.

    `gpus`: a run on that many GPUs (vLLM's tensor x pipeline parallel size). NVML then reads those GPUs only
    (the first `gpus` of CUDA_VISIBLE_DEVICES, as the run's workers take them; NVML itself sees every GPU of the
    machine), the estimate is `gpus` x the TDP, and 'auto' never falls back to RAPL (the CPU's energy is not
    the GPUs')."""
    if preference not in PREFERENCES:
        raise ValueError(f"power source preference must be one of {PREFERENCES}, got {preference!r}")

    def nvml_source() -> NvmlPowerSource:
        return NvmlPowerSource(None if gpus is None else visible_gpu_indices(gpus), nvml=nvml)

    if preference == "nvml":
        return nvml_source()
    if preference == "rapl":
        return RaplPowerSource(rapl_root)
    if preference == "estimate":
        if tdp_w is None:
            raise ValueError("power source 'estimate' needs tdp_w (the device's TDP in watts)")
        return EstimatePowerSource(tdp_w, devices=gpus or 1)
    if preference == "none":
        return NoPowerSource()
    reasons = []
    openers = [("NVML", nvml_source)] + ([("RAPL", lambda: RaplPowerSource(rapl_root))] if gpus is None else [])
    for name, opener in openers:
        try:
            return opener()
        except PowerSourceError as exc:
            reasons.append(f"{name}: {exc}")
    chosen: PowerSource = EstimatePowerSource(tdp_w, devices=gpus or 1) if tdp_w is not None else NoPowerSource()
    _say_once(f"power: using {chosen.description}; " + "; ".join(reasons))
    return chosen


# ---------------------------------------------------------------------------------------------- sampler


class PowerSampler:
    """A thread that reads `source` every `interval_s` during a run, keeps the readings (for energy
    attribution) and hands each batch to `sink` (e.g. `lambda rs: recorder.record_power(run_id, rs)`)."""

    def __init__(
        self,
        source: PowerSource,
        sink: Callable[[list[PowerReading]], None] | None = None,
        *,
        interval_s: float = 0.25,
        max_kept: int = 200_000,
    ) -> None:
        if not 0.01 <= interval_s <= 60:
            raise ValueError(f"interval_s must be within [0.01, 60] seconds, got {interval_s}")
        self.source = source
        self._sink = sink
        self._interval_s = interval_s
        self._kept: deque[PowerReading] = deque(maxlen=max_kept)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.num_read_errors = 0

    def start(self) -> PowerSampler:
        if self._thread is None:
            self.sample_now()
            self._thread = threading.Thread(target=self._loop, name="specfinops-power", daemon=True)
            self._thread.start()
        return self

    def sample_now(self) -> list[PowerReading]:
        """Take one sample now (e.g. when a request ends, so its window is covered)."""
        try:
            readings = self.source.read()
        except PowerSourceError as exc:
            self.num_read_errors += 1
            _say_once(f"power: reading {self.source.source} failed ({exc}); samples are missing")
            return []
        if readings:
            with self._lock:
                full = len(self._kept) + len(readings) > (self._kept.maxlen or 0) > 0
                self._kept.extend(readings)
            if full:
                _say_once(f"power: keeping only the last {self._kept.maxlen:,} readings of this run; requests "
                          "attributed energy after their readings are dropped get no energy figure (missing, "
                          "not 0): shorter runs, or fewer devices per run, keep them all")
            if self._sink is not None:
                self._sink(readings)
        return readings

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample_now()

    def readings(self) -> list[PowerReading]:
        with self._lock:
            return list(self._kept)

    def energy_j(self, start: datetime, end: datetime) -> float | None:
        return energy_for_window(self.readings(), start, end)

    def energy_share_j(self, windows: list[tuple[datetime, datetime]]) -> float | None:
        """The first window's share of the devices' energy when `windows` (requests in flight together)
        split it equally at every instant (`attribute_energy`); None where no samples cover it."""
        return attribute_energy(self.readings(), windows)[0]

    def stop(self) -> None:
        """Stop the thread after one last sample. The source stays open (its owner closes it)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample_now()

    def __enter__(self) -> PowerSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
