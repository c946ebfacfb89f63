"""Power sources through fakes (an NVML energy counter that counts up, a RAPL directory), the labelled
estimate, detection with fallback said once, and energy attribution checked by hand."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

import telemetry.power as power
from telemetry.power import (
    EstimatePowerSource,
    NoPowerSource,
    NvmlPowerSource,
    PowerSampler,
    PowerSourceError,
    RaplPowerSource,
    attribute_energy,
    detect_power_source,
    energy_for_window,
)
from telemetry.records import PowerReading

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


# ------------------------------------------------------------------------------- a fake pynvml module


class FakeGpu:
    """An energy counter that counts up by `power_w` x 0.1 s per query (1 query = 100 ms of work)."""

    def __init__(self, power_w: float, has_counter: bool = True, has_power: bool = True) -> None:
        self.power_w, self.has_counter, self.has_power = power_w, has_counter, has_power
        self.energy_mj = 1_000_000


class FakeNvml:
    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
        pass

    def __init__(self, gpus: list[FakeGpu], init_error: str | None = None) -> None:
        self.gpus, self.init_error, self.shutdowns = gpus, init_error, 0

    def nvmlInit(self):  # noqa: N802 - pynvml's names below
        if self.init_error:
            raise self.NVMLError(self.init_error)

    def nvmlShutdown(self):  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return self.gpus[i]

    def nvmlDeviceGetName(self, gpu):  # noqa: N802
        return b"Fake H100"

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu):  # noqa: N802
        if not gpu.has_counter:
            raise self.NVMLError_NotSupported("Not Supported")
        gpu.energy_mj += int(gpu.power_w * 100)  # 0.1 s at power_w, in mJ
        return gpu.energy_mj

    def nvmlDeviceGetPowerUsage(self, gpu):  # noqa: N802
        if not gpu.has_power:
            raise self.NVMLError_NotSupported("Not Supported")
        return int(gpu.power_w * 1000)

    def nvmlDeviceGetUtilizationRates(self, gpu):  # noqa: N802
        return SimpleNamespace(gpu=87, memory=40)


def test_nvml_reads_the_energy_counter_in_mj_and_power_in_w():
    nvml = FakeNvml([FakeGpu(300.0), FakeGpu(250.0)])
    src = NvmlPowerSource(nvml=nvml)
    first, second = src.read(), src.read()
    assert [r.device_index for r in first] == [0, 1]
    assert all(r.source == "nvml" for r in first + second)
    assert second[0].energy_mj - first[0].energy_mj == 30_000  # 300 W x 0.1 s = 30 J
    assert second[1].energy_mj - first[1].energy_mj == 25_000
    assert (first[0].power_w, first[0].utilization_pct) == (300.0, 87.0)
    assert "2 x Fake H100 (energy counter)" in src.description
    src.close()
    assert nvml.shutdowns == 1


def test_nvml_falls_back_to_power_when_the_counter_is_not_supported():
    src = NvmlPowerSource(nvml=FakeNvml([FakeGpu(70.0, has_counter=False)]))
    (reading,) = src.read()
    assert (reading.energy_mj, reading.power_w, reading.source) == (None, 70.0, "nvml")
    assert "power polling" in src.description


def test_nvml_errors_become_power_source_errors_naming_the_call():
    with pytest.raises(PowerSourceError, match="NVML nvmlInit failed: Driver Not Loaded"):
        NvmlPowerSource(nvml=FakeNvml([], init_error="Driver Not Loaded"))
    nvml = FakeNvml([FakeGpu(1.0, has_counter=False, has_power=False)])
    with pytest.raises(PowerSourceError, match=r"GPUs \[0\] report neither total energy nor power usage"):
        NvmlPowerSource(nvml=nvml)
    assert nvml.shutdowns == 1  # closed again after the failed open
    with pytest.raises(PowerSourceError, match="GPU index 3 out of range: NVML sees 1 devices"):
        NvmlPowerSource([3], nvml=FakeNvml([FakeGpu(1.0)]))


def test_nvml_without_nvidia_ml_py_says_what_to_install():
    try:
        import pynvml  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("nvidia-ml-py is installed here")
    with pytest.raises(PowerSourceError, match="pip install nvidia-ml-py"):
        NvmlPowerSource()


def test_energy_from_fake_nvml_samples_is_the_counter_difference():
    nvml = FakeNvml([FakeGpu(200.0)])
    src = NvmlPowerSource(nvml=nvml)
    readings = []
    for i in range(5):  # each read advances the counter by 20 J; stamp them 1 s apart
        (r,) = src.read()
        readings.append(PowerReading(at(i), r.device_index, r.power_w, r.energy_mj, None, r.source))
    assert energy_for_window(readings, at(0), at(4)) == pytest.approx(80.0)
    assert energy_for_window(readings, at(1.5), at(2.5)) == pytest.approx(20.0)


# ---------------------------------------------------------------------------------------------- RAPL


def test_a_psys_zone_beside_the_packages_is_not_counted_as_one(tmp_path):
    """Some Intel client machines list the platform ('psys', packages included) as intel-rapl:1: counted as a
    package it counted the CPU twice, and unreadable it refused RAPL."""
    for zone, name in (("intel-rapl:0", "package-0"), ("intel-rapl:1", "psys")):
        (_rapl_zone(tmp_path, zone, 10) / "name").write_text(f"{name}\n")
    (tmp_path / "intel-rapl:1" / "energy_uj").unlink()
    source = RaplPowerSource(root=tmp_path)
    assert source.description == "RAPL: 1 CPU package(s) (energy counter)" and len(source.read()) == 1


def _rapl_zone(root, name: str, energy_uj: int, max_uj: int = 1_000_000):
    zone = root / name
    zone.mkdir()
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return zone


def test_rapl_counts_across_the_wraparound(tmp_path):
    zone = _rapl_zone(tmp_path, "intel-rapl:0", 999_000)
    _rapl_zone(tmp_path, "intel-rapl:0:0", 5)  # a subzone: inside the package, not counted again
    src = RaplPowerSource(tmp_path)
    (first,) = src.read()
    (zone / "energy_uj").write_text("1000\n")  # wrapped at 1,000,000 uJ
    (second,) = src.read()
    assert (first.source, first.energy_mj, first.power_w) == ("rapl", 0.0, None)
    assert second.energy_mj == pytest.approx(2.0)  # 1000 uJ to the wrap + 1000 uJ after = 2 mJ
    assert second.power_w is not None and second.power_w > 0


def test_rapl_without_readable_zone_says_why(tmp_path):
    with pytest.raises(PowerSourceError, match="RAPL not readable under .*no intel-rapl package zone"):
        RaplPowerSource(tmp_path)


def test_rapl_with_an_unreadable_package_is_refused_not_half_the_cpu(tmp_path, monkeypatch, caplog):
    """Two packages, one energy_uj unreadable: 'RAPL: 1 CPU package(s)', nothing said, and half the CPU's energy
    stored as measured. Refused, saying why; 'auto' falls back (to the estimate here) and says so."""
    _rapl_zone(tmp_path, "intel-rapl:0", 10)
    (_rapl_zone(tmp_path, "intel-rapl:1", 10) / "energy_uj").unlink()  # as unreadable: an OSError on read
    with pytest.raises(PowerSourceError, match=r"RAPL reads only 1 of 2 CPU packages .*intel-rapl:1: "
                                               r"FileNotFoundError.* so RAPL is not used"):
        RaplPowerSource(tmp_path)
    monkeypatch.setattr(power, "_said", set())
    broken = FakeNvml([], init_error="Driver Not Loaded")
    with caplog.at_level(logging.WARNING, logger="telemetry.power"):
        src = detect_power_source(tdp_w=65.0, nvml=broken, rapl_root=tmp_path)
    assert isinstance(src, EstimatePowerSource)
    assert any("RAPL reads only 1 of 2 CPU packages" in r.getMessage() for r in caplog.records)
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("10\n")
    assert RaplPowerSource(tmp_path).description == "RAPL: 2 CPU package(s) (energy counter)"


# ------------------------------------------------------------------------------ estimate, detection


def test_estimate_is_always_labelled_and_scales_with_utilization():
    const = EstimatePowerSource(350.0)
    scaled = EstimatePowerSource(100.0, utilization_fn=lambda: 50.0, idle_fraction=0.3)
    assert [(r.source, r.power_w, r.energy_mj) for r in const.read()] == [("estimate", 350.0, None)]
    (r,) = scaled.read()
    assert (r.source, r.power_w, r.utilization_pct) == ("estimate", pytest.approx(65.0), 50.0)  # 30 + 70 x 0.5
    with pytest.raises(ValueError, match="tdp_w must be > 0 watts, got 0"):
        EstimatePowerSource(0)


def test_detect_prefers_nvml_then_falls_back_and_says_so_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(power, "_said", set())
    assert isinstance(detect_power_source(nvml=FakeNvml([FakeGpu(100.0)])), NvmlPowerSource)
    broken = FakeNvml([], init_error="Driver Not Loaded")
    with caplog.at_level(logging.WARNING, logger="telemetry.power"):
        first = detect_power_source(tdp_w=65.0, nvml=broken, rapl_root=tmp_path)
        second = detect_power_source(tdp_w=65.0, nvml=broken, rapl_root=tmp_path)
    assert isinstance(first, EstimatePowerSource) and isinstance(second, EstimatePowerSource)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "estimate" in warnings[0] and "Driver Not Loaded" in warnings[0] and "RAPL" in warnings[0]
    assert isinstance(detect_power_source(nvml=broken, rapl_root=tmp_path), NoPowerSource)
    _rapl_zone(tmp_path, "intel-rapl:0", 10)
    assert isinstance(detect_power_source(nvml=broken, rapl_root=tmp_path), RaplPowerSource)


def test_detect_explicit_choices():
    with pytest.raises(ValueError, match="must be one of"):
        detect_power_source("gpu")
    with pytest.raises(ValueError, match="needs tdp_w"):
        detect_power_source("estimate")
    with pytest.raises(PowerSourceError, match="Driver Not Loaded"):
        detect_power_source("nvml", nvml=FakeNvml([], init_error="Driver Not Loaded"))
    assert detect_power_source("none").read() == []


# ------------------------------------------------------------------------------- energy attribution


def test_energy_for_window_by_counter_difference_hand_checked():
    counter_mj = [0, 100_000, 250_000, 300_000]  # 100 J, 150 J, 50 J per second
    readings = [PowerReading(at(i), 0, None, e, None, "nvml") for i, e in enumerate(counter_mj)]
    # 0.5..2.5 s: half of second 0 (50) + all of second 1 (150) + half of second 2 (25) = 225 J
    assert energy_for_window(readings, at(0.5), at(2.5)) == pytest.approx(225.0)
    assert energy_for_window(readings, at(0), at(3)) == pytest.approx(300.0)
    assert energy_for_window(readings, at(-5), at(10)) is None  # samples cover 3 s of 15: unknown, not 300 J


def test_energy_for_window_by_power_trapezoid_hand_checked():
    readings = [PowerReading(at(0), 0, 100.0, None, None, "estimate"), PowerReading(at(2), 0, 200.0, None, None, "estimate")]
    assert energy_for_window(readings, at(0), at(2)) == pytest.approx(300.0)  # (100 + 200) / 2 x 2 s
    assert energy_for_window(readings, at(1), at(2)) == pytest.approx(175.0)  # 150 W at 1 s: (150 + 200) / 2


def test_energy_sums_devices_and_is_none_when_nothing_was_measured():
    two = [PowerReading(at(i), d, 100.0, None, None, "nvml") for i in range(3) for d in (0, 1)]
    assert energy_for_window(two, at(0), at(2)) == pytest.approx(400.0)
    assert energy_for_window(two, at(5), at(6)) is None  # after the last sample: unknown, not 0
    assert energy_for_window([], at(0), at(1)) is None
    assert energy_for_window(two[:1], at(0), at(1)) is None  # one sample spans no time
    with pytest.raises(ValueError, match="before start"):
        energy_for_window(two, at(2), at(1))


def test_concurrent_requests_share_energy_by_overlap_hand_checked():
    readings = [PowerReading(at(i), 0, 100.0, None, None, "nvml") for i in range(5)]  # 100 W for 4 s
    a, b, c = (at(0), at(2)), (at(1), at(3)), (at(10), at(11))
    # [0,1]: A alone 100 J; [1,2]: shared 50/50; [2,3]: B alone 100 J; [3,4]: idle, nobody's
    assert attribute_energy(readings, [a, b, c]) == [pytest.approx(150.0), pytest.approx(150.0), None]


def test_a_window_the_samples_cover_only_in_part_has_no_energy_figure():
    """A 10 s window with samples over 5 s of it got 500 J, counted as its whole energy; so did a window on two
    devices one of which stopped reporting halfway. Missing, not the covered part."""
    readings = [PowerReading(at(i), 0, 100.0, None, None, "estimate") for i in range(11)]  # 100 W over 0..10 s
    assert energy_for_window(readings, at(0), at(10)) == pytest.approx(1000.0)
    assert energy_for_window(readings, at(-5), at(5)) is None
    assert energy_for_window(readings, at(5), at(15)) is None
    two = readings + [PowerReading(at(i), 1, 100.0, None, None, "estimate") for i in range(6)]  # device 1: 0..5 s
    assert energy_for_window(two, at(0), at(10)) is None
    assert energy_for_window(two, at(1), at(4)) == pytest.approx(600.0)
    # timestamps in whole microseconds: an edge a sliver (< 1 ms) past the samples still counts as covered
    assert energy_for_window(readings, at(-0.0005), at(10.0005)) == pytest.approx(1000.0)
    # shared: the part-covered window gets None, and still takes its half of the time it overlaps the other
    assert attribute_energy(readings, [(at(0), at(6)), (at(4), at(12))]) == [pytest.approx(500.0), None]


def test_a_request_older_than_the_kept_readings_gets_no_energy_not_a_part():
    """With max_kept=10 a 1.5 s window at 100 W got 42 J (the last 10 readings' span) instead of missing."""
    sampler = PowerSampler(EstimatePowerSource(100.0), interval_s=0.05, max_kept=10)
    for i in range(30):  # 30 readings 0.05 s apart: only the last 10 (1.0..1.45 s) are kept
        sampler._kept.append(PowerReading(at(i * 0.05), 0, 100.0, None, None, "estimate"))
    assert sampler.energy_share_j([(at(0), at(1.45))]) is None
    assert sampler.energy_j(at(0), at(1.45)) is None
    assert sampler.energy_j(at(1.0), at(1.45)) == pytest.approx(45.0)


def test_sampler_collects_labelled_readings_and_hands_them_on():
    batches: list[list[PowerReading]] = []
    sampler = PowerSampler(EstimatePowerSource(200.0), batches.append, interval_s=0.02)
    with sampler:
        deadline = time.monotonic() + 30
        while len(batches) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(batches) >= 4
    kept = sampler.readings()
    assert kept == [r for batch in batches for r in batch]
    assert {r.source for r in kept} == {"estimate"}
    span = (kept[0].t, kept[-1].t)
    assert sampler.energy_j(*span) == pytest.approx(200.0 * (span[1] - span[0]).total_seconds(), rel=1e-6)
    with pytest.raises(ValueError, match="interval_s"):
        PowerSampler(NoPowerSource(), interval_s=0)


def test_a_run_on_some_gpus_reads_those_and_no_cpu_meter_stands_in(tmp_path, monkeypatch):
    """NVML sees every GPU of the machine: a vLLM run on 2 of 8 was charged all 8's power; the TDP estimate
    counted one GPU whatever the run spanned; and 'auto' fell back to RAPL, the CPU's energy, for a GPU run."""
    monkeypatch.setattr(power, "_said", set())
    gpus = [FakeGpu(100.0 + i) for i in range(8)]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    src = detect_power_source("nvml", nvml=FakeNvml(gpus), gpus=2)
    assert [r.device_index for r in src.read()] == [0, 1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    src = detect_power_source("nvml", nvml=FakeNvml(gpus), gpus=2)
    assert [r.device_index for r in src.read()] == [4, 5]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-0a1b,GPU-2c3d")  # by UUID: every GPU, said
    assert len(detect_power_source("nvml", nvml=FakeNvml(gpus), gpus=2).read()) == 8
    est = detect_power_source("estimate", tdp_w=700.0, gpus=4)
    assert [r.power_w for r in est.read()] == [700.0] * 4 and "x 4 devices" in est.description
    _rapl_zone(tmp_path, "intel-rapl:0", 10)
    broken = FakeNvml([], init_error="Driver Not Loaded")
    assert isinstance(detect_power_source(nvml=broken, rapl_root=tmp_path), RaplPowerSource)  # a CPU run
    assert isinstance(detect_power_source(nvml=broken, rapl_root=tmp_path, gpus=1), NoPowerSource)
    assert isinstance(detect_power_source(tdp_w=700.0, nvml=broken, rapl_root=tmp_path, gpus=2), EstimatePowerSource)


def test_a_sampler_that_drops_old_readings_says_so(monkeypatch, caplog):
    """A long multi-GPU run outgrew the kept readings: early requests got no energy, and nothing said why."""
    monkeypatch.setattr(power, "_said", set())
    sampler = power.PowerSampler(EstimatePowerSource(100.0, devices=4), max_kept=10)
    with caplog.at_level(logging.WARNING, logger="telemetry.power"):
        for _ in range(2):
            sampler.sample_now()
        assert not caplog.records  # 8 of 10 kept
        sampler.sample_now()
    assert len(sampler.readings()) == 10
    assert any("keeping only the last 10 readings" in r.getMessage() for r in caplog.records)
