"""A recorded device is priced as the hardware it is: a vLLM run over 8 GPUs (tensor parallel) as 8 GPUs, a CPU
run of 16 threads as 8 of the 2-vCPU catalog nodes, in its price snapshot, in `cost` and in `project` (where a
node holds whole replicas of the measured device)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.orm import Session
from synthetic import Req, h100_runs_of_two_recorded_prices, make_run, spec_req

from app.cli import main
from telemetry.costing import costs, project_from_store
from telemetry.prices import (
    catalog_entry_for_device,
    device_gpus,
    device_units,
    entry_units,
    load_catalog,
    names_own_device,
    price_snapshot,
    resolve_node_price,
    set_price,
)
from telemetry.store import open_store

TP8 = "cuda: NVIDIA H100 80GB HBM3 x 8 (tp 8)"
CPU16 = "cpu: AMD EPYC (16 threads)"


@pytest.mark.parametrize(
    ("device", "gpus", "units"),
    [
        (TP8, 8, 8),
        ("cuda: NVIDIA H100 80GB HBM3 x 1 (tp 1)", 1, 1),
        ("NVIDIA H100 80GB HBM3", 1, 1),
        (CPU16, 1, 8),
        ("cpu: AMD EPYC (2 threads)", 1, 1),
        ("cpu: AMD EPYC (1 threads)", 1, 1),
        ("cpu: Intel Xeon (3 threads)", 1, 2),
        ("cpu (2 cores)", 1, 1),
        ("cpu", 1, 1),
        ("vllm: device unknown (4 workers)", 1, 1),  # as recorded before the count was in the device's form
        ("vllm: device unknown x 4 (tp 2)", 4, 4),
    ],
)
def test_device_units_count_the_hardware_a_device_string_names(device, gpus, units):
    assert device_gpus(device) == gpus
    assert device_units(device) == units


def test_the_snapshot_and_the_catalog_price_the_whole_device(sqlite_url):
    engine = open_store(sqlite_url)
    catalog = load_catalog(engine)
    h100 = catalog.get("H100").value
    cpu = catalog.get("cpu-2core").value
    snap = price_snapshot(catalog, TP8)
    assert (snap["name"], snap["units"]) == ("H100", 8) and snap["node_hourly_usd"] == pytest.approx(8 * h100)
    assert price_snapshot(catalog, CPU16)["node_hourly_usd"] == pytest.approx(8 * cpu)
    assert price_snapshot(catalog, "cpu (2 cores)")["node_hourly_usd"] == pytest.approx(cpu)
    for price in (resolve_node_price(engine, device=TP8, price_snapshot=snap),
                  resolve_node_price(engine, device=TP8, catalog=catalog)):
        assert price.usd_per_hour == pytest.approx(8 * h100) and "H100 x8" in price.priced_as
        assert not price.differs_from(TP8)  # its own hardware: the measured energy stays in
    # a snapshot taken before units were recorded held one GPU's price: scaled to the device's GPUs
    old = {"name": "H100", "node_hourly_usd": h100, "usd_per_kwh": 0.13, "pue": 1.2}
    assert resolve_node_price(engine, device=TP8, price_snapshot=old).usd_per_hour == pytest.approx(8 * h100)
    # ... but not a price the device's own entry does not name (a user's whole-node quote)
    quote = {"name": "my-8gpu-node", "node_hourly_usd": 40.0}
    assert resolve_node_price(engine, device=TP8, price_snapshot=quote).usd_per_hour == 40.0
    # --gpu prices each GPU of the device; a node entry is a whole node already
    assert resolve_node_price(engine, device=TP8, gpu="H100-SXM", gpus_per_node=8).usd_per_hour == pytest.approx(
        8 * catalog.get("H100-SXM").value)
    assert not resolve_node_price(engine, device=TP8, gpu="H100-SXM", gpus_per_node=8).differs_from(TP8)
    assert resolve_node_price(engine, device=TP8, gpu="cpu-2core", gpus_per_node=8).usd_per_hour == cpu


def _tp8_store(url: str) -> None:
    engine = open_store(url)
    with Session(engine) as s:  # AR 10 tokens/s, spec 20 tokens/s, each over 10 s, on one 8-GPU replica
        make_run(s, "ar", device=TP8, backend="vllm", requests=[Req(100, ttft_ms=100, e2e_ms=10_000)])
        make_run(s, "spec", device=TP8, backend="vllm",
                 requests=[spec_req(200, 4, 150, ttft_ms=100, e2e_ms=10_000)])
        s.commit()


def test_cost_prices_a_tensor_parallel_run_as_all_its_gpus(sqlite_url, capsys):
    _tp8_store(sqlite_url)
    engine = open_store(sqlite_url)
    h100 = load_catalog(engine).get("H100").value
    run_costs, _ = costs(engine)
    assert [rc.node_price.usd_per_hour for rc in run_costs] == pytest.approx([8 * h100] * 2)
    # AR: 100 tokens in 10 s on 8 GPUs
    ar = next(rc for rc in run_costs if rc.run.mode == "ar")
    assert ar.cost.hardware_usd_per_1m == pytest.approx(8 * h100 * 10 / 3600 / 100 * 1e6)
    assert main(["cost", "--db", sqlite_url, "--gpu", "H100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["node_hourly_usd"] for r in out["runs"]] == pytest.approx([8 * h100] * 2)


def test_project_holds_whole_replicas_of_a_multi_gpu_device(sqlite_url, capsys):
    _tp8_store(sqlite_url)
    engine = open_store(sqlite_url)
    h100 = load_catalog(engine).get("H100").value
    kw = {"daily_tokens": 8.64e6, "peak_factor": 1.6, "sla_ms": 200.0}  # 160 tokens/s at peak
    for given, gpus, replicas, nodes_ar in ((None, 8, 1, 16), (1, 8, 1, 16), (8, 8, 1, 16), (16, 16, 2, 8)):
        extra = {} if given is None else {"gpu": "H100", "gpus_per_node": given}
        sp = project_from_store(engine, **kw, **extra)
        assert (sp.gpus_per_node, sp.replicas_per_node) == (gpus, replicas)
        assert sp.projection.node_hourly_usd == pytest.approx(gpus * h100)
        assert sp.projection.nodes_ar == nodes_ar
    with pytest.raises(ValueError, match="multiple of the 8 GPUs"):
        project_from_store(engine, gpu="H100", gpus_per_node=4, **kw)
    assert main(["project", "--db", sqlite_url, "--daily-tokens", "8.64e6", "--peak-factor", "1.6",
                 "--p95-tpot-sla-ms", "200", "--gpu", "H100", "--gpus-per-node", "12"]) == 2
    err = capsys.readouterr().err
    assert "--gpus-per-node 12" in err and "multiple of the 8 GPUs" in err


def test_an_entry_named_after_an_unknown_device_prices_it_and_the_error_names_the_runs(sqlite_url, capsys):
    """A device no built-in rule knows: `cost` named neither the runs nor a way to price only them (its hint,
    --node-hourly-usd, reprices every run in view); an entry named as the device string names the chip prices it."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", device="cpu (2 cores)", requests=[Req(100, ttft_ms=100, e2e_ms=10_000)])
        tpu = [make_run(s, "ar", device="Google TPU v5e", requests=[Req(100, ttft_ms=100, e2e_ms=10_000)]).id
               for _ in range(2)]
        s.commit()
    assert main(["cost", "--db", sqlite_url]) == 0  # the CPU run's cost is shown; the TPU runs are named
    out = capsys.readouterr().out.strip()
    assert f"no price for runs {tpu[0]}-{tpu[1]} (device 'Google TPU v5e')" in out and "prices set" in out, out
    assert main(["cost", "--db", sqlite_url, "--run", str(tpu[0])]) == 2  # nothing in view has a price
    err = capsys.readouterr().err.strip()
    assert f"no price for run {tpu[0]} (device 'Google TPU v5e')" in err and "prices set" in err, err
    assert main(["prices", "set", "TPU v5e", "1.2", "--kind", "gpu", "--source", "quote", "--db", sqlite_url]) == 0
    capsys.readouterr()
    assert main(["cost", "--db", sqlite_url, "--json"]) == 0
    by_run = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert by_run[tpu[0]]["node_hourly_usd"] == 1.2 and by_run[tpu[0]]["priced_as"] == "TPU v5e"
    # "L4" is a word of "NVIDIA L4", not of "NVIDIA L40S"
    catalog = load_catalog(engine)
    assert price_snapshot(catalog, "NVIDIA L40S").get("name") is None
    assert price_snapshot(catalog, "NVIDIA L4")["name"] == "L4"
    price = resolve_node_price(engine, device="Google TPU v5e", catalog=catalog)
    assert price.usd_per_hour == 1.2 and not price.differs_from("Google TPU v5e")


def test_project_says_why_it_prices_at_the_catalog_when_the_runs_recorded_other_prices(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        h100_runs_of_two_recorded_prices(s)
    assert main(["project", "--db", sqlite_url, "--daily-tokens", "8.64e6", "--peak-factor", "1.6",
                 "--p95-tpot-sla-ms", "200"]) == 0
    out = capsys.readouterr().out
    assert "warning: the runs recorded different node prices ($4/h, $5/h): priced at the catalog's current H100" \
        in out, out
    assert main(["project", "--db", sqlite_url, "--daily-tokens", "8.64e6", "--peak-factor", "1.6",
                 "--p95-tpot-sla-ms", "200", "--node-hourly-usd", "4.5"]) == 0
    assert "recorded different node prices" not in capsys.readouterr().out


def test_a_cut_option_is_not_read_as_a_longer_one_and_the_sla_note_tells_its_figures_apart(filled_pair, capsys):
    """`project --run 3` was read as `--run-kind 3` (argparse's prefix matching), its error naming an option
    the user never gave; a p95 TPOT of 38.83 ms read "best measured 38.8 ms" beside an SLA of 38.8 ms."""
    base = ["project", "--db", filled_pair, "--daily-tokens", "1e6", "--peak-factor", "1"]
    with pytest.raises(SystemExit) as exc:
        main([*base, "--p95-tpot-sla-ms", "50", "--run", "3"])
    err = capsys.readouterr().err.splitlines()[-1]
    assert exc.value.code == 2 and "unrecognized arguments: --run 3" in err and "--run-kind" not in err, err
    assert main([*base, "--p95-tpot-sla-ms", "38.8", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["assumptions"]["notes"]
    assert any("best measured p95 TPOT is 38.83 ms" in n for n in notes), notes


@pytest.fixture
def filled_pair(sqlite_url) -> str:
    """AR whose one request's TPOT is 38.83 ms ((3983 - 100) / 100 tokens), and a spec run."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(101, ttft_ms=100, e2e_ms=3983)])
        make_run(s, "spec", requests=[spec_req(101, 4, 60, ttft_ms=100, e2e_ms=1000)])
        s.commit()
    return sqlite_url


def test_a_cpu_node_price_counts_the_threads_however_it_is_given(sqlite_url):
    """`--gpu cpu-2core` priced a 16-thread run as one 2-vCPU node while no flag priced it as 8 (and kept its
    energy as the same hardware's); a snapshot recorded before units were counted, or with units as 8.0, is
    the device's units too; a pipeline-parallel device spans tp x pp GPUs."""
    engine = open_store(sqlite_url)
    catalog = load_catalog(engine)
    cpu = catalog.get("cpu-2core").value
    flagged = resolve_node_price(engine, device=CPU16, gpu="cpu-2core", catalog=catalog)
    unflagged = resolve_node_price(engine, device=CPU16, catalog=catalog)
    assert flagged.usd_per_hour == unflagged.usd_per_hour == pytest.approx(8 * cpu)
    assert not flagged.differs_from(CPU16)
    legacy = {"name": "cpu-2core", "node_hourly_usd": cpu}
    assert resolve_node_price(engine, device=CPU16, price_snapshot=legacy).usd_per_hour == pytest.approx(8 * cpu)
    floated = {"name": "H100", "units": 8.0, "node_hourly_usd": 55.04}
    assert resolve_node_price(engine, device=TP8, price_snapshot=floated).usd_per_hour == pytest.approx(55.04)
    pp = "cuda: NVIDIA H100 80GB HBM3 x 8 (tp 4)"
    assert device_gpus(pp) == 8 and not resolve_node_price(engine, device=pp, gpu="H100", gpus_per_node=8) \
        .differs_from(pp)
    # a CPU model name with GPU-like letters is a CPU
    assert device_units("cpu: Fancy H100-ish Xeon (4 threads)") == 2
    assert price_snapshot(catalog, "cpu: Fancy H100-ish Xeon (4 threads)")["name"] == "cpu-2core"


def test_project_names_runs_that_recorded_a_price_beside_runs_that_did_not(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", device="NVIDIA H100 80GB HBM3", price_snapshot={"name": "H100", "node_hourly_usd": 4.0},
                 requests=[Req(100, ttft_ms=100, e2e_ms=10_000)])
        make_run(s, "spec", device="NVIDIA H100 80GB HBM3", requests=[spec_req(200, 4, 150, ttft_ms=100,
                                                                              e2e_ms=10_000)])
        s.commit()
    assert main(["project", "--db", sqlite_url, "--daily-tokens", "8.64e6", "--peak-factor", "1.6",
                 "--p95-tpot-sla-ms", "200"]) == 0
    assert "warning: only some runs recorded a node price ($4/h): priced at the catalog's" in capsys.readouterr().out


def test_the_mixed_workloads_two_names_filter_as_one(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        old = make_run(s, "ar", workload="all", requests=[Req(100, ttft_ms=100, e2e_ms=10_000)]).id
        new = make_run(s, "ar", workload="mixed", requests=[Req(100, ttft_ms=100, e2e_ms=10_000)]).id
        make_run(s, "ar", workload="code", requests=[Req(100, ttft_ms=100, e2e_ms=10_000)])
        s.commit()
    for name in ("all", "mixed"):
        assert main(["cost", "--db", sqlite_url, "--workload", name, "--json"]) == 0
        assert {r["run_id"] for r in json.loads(capsys.readouterr().out)["runs"]} == {old, new}
    assert main(["cost", "--db", sqlite_url, "--run", str(old), "--workload", "mixed", "--json"]) == 0


@pytest.mark.parametrize(
    ("device", "entry", "kind"),
    [
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB", "gpu"),  # the built-in pattern said A100-80GB ($3.43/h)
        ("NVIDIA H100 PCIe", "H100 PCIe", "gpu"),  # ... and H100 ($6.88/h)
        ("cpu: AMD EPYC 7763 (16 threads)", "AMD EPYC 7763", "node"),  # ... and 8 x cpu-2core
    ],
)
def test_a_users_entry_named_in_the_device_prices_it_over_the_built_in_pattern(sqlite_url, capsys, device, entry,
                                                                               kind):
    """A user's catalog entry for a device variant was never used: the built-in patterns (a100 -> A100-80GB,
    h100 -> H100, cpu -> cpu-2core) were tried first. The entry named in the device string prices it, in `cost`
    and in the snapshot a new run records, as the same hardware (its measured energy stays in); without such an
    entry the built-in pattern still prices it."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        run_id = make_run(s, "ar", device=device, power_source="nvml",
                          requests=[Req(100, ttft_ms=100, e2e_ms=10_000, energy_j=50.0)]).id
        s.commit()
    builtin = resolve_node_price(engine, device=device)
    assert builtin.catalog_name != entry and not builtin.differs_from(device)
    assert main(["prices", "set", entry, "2.0", "--kind", kind, "--source", "test", "--db", sqlite_url]) == 0
    capsys.readouterr()
    assert main(["cost", "--db", sqlite_url, "--run", str(run_id), "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert (run["priced_as"], run["node_hourly_usd"]) == (entry, 2.0), run
    assert run["energy_included"] and not run["priced_differs_from_measured"], run
    assert main(["cost", "--db", sqlite_url, "--run", str(run_id)]) == 0
    assert f"{entry} at $2/h" in capsys.readouterr().out
    catalog = load_catalog(engine)
    assert (price_snapshot(catalog, device)["name"], price_snapshot(catalog, device)["node_hourly_usd"]) == (entry, 2.0)
    assert not resolve_node_price(engine, device=device, gpu=entry).differs_from(device)
    # another device the pattern matches still gets the built-in entry; the default's names do not override it
    other = {"gpu": "NVIDIA A100-SXM4-80GB", "node": "cpu: Fancy H100-ish Xeon (4 threads)"}[kind]
    assert price_snapshot(catalog, other)["name"] == resolve_node_price(engine, device=other).catalog_name \
        == {"gpu": "A100-80GB", "node": "cpu-2core"}[kind]
    engine.dispose()


@pytest.mark.parametrize(
    ("device", "entry", "kind", "wins"),
    [
        # a device a built-in pattern knows, GPU or CPU: a user's entry named in it as whole words that holds a
        # model (a word with a digit that is not a memory's size or kind)
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB", "gpu", True),
        ("NVIDIA H100 PCIe", "H100 PCIe", "gpu", True),
        ("NVIDIA H100 80GB HBM3", "H100 80GB", "gpu", True),
        # these three lost to the built-in A100-80GB as "naming no more than it": "H100 80GB" won where "A100 80GB"
        # did not; one rule now, the model A100 names the device
        ("NVIDIA A100-SXM4-80GB", "A100", "gpu", True),
        ("NVIDIA A100 80GB PCIe", "A100 80GB", "gpu", True),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100", "gpu", True),
        # chips the built-in patterns match inside a word (h100, a100) but no "names the chip" check let win
        ("NVIDIA A100X", "A100X", "gpu", True),
        ("NVIDIA GH100 96GB", "GH100", "gpu", True),
        ("NVIDIA A100-SXM4-80GB", "80GB", "gpu", False),  # a memory size is no model
        ("NVIDIA A100-SXM4-40GB", "40G", "gpu", False),
        ("NVIDIA H100 80GB HBM3", "HBM3", "gpu", False),  # nor a memory kind
        ("NVIDIA H100 PCIe", "PCIe", "gpu", False),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA", "gpu", False),
        ("cuda: NVIDIA H100 80GB HBM3", "cuda", "gpu", False),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4", "gpu", True),
        ("NVIDIA A100-SXM4-80GB", "A10", "gpu", False),  # not a word of it
        (TP8, "H100 80GB", "gpu", True),  # each of a tensor-parallel device's GPUs
        (TP8, "tp 8", "gpu", False),  # the GPUs a vLLM device counts are no model
        # a CPU: the same rule, in the model its device string gives
        ("cpu: AMD EPYC 7763 (16 threads)", "AMD EPYC 7763", "node", True),
        ("cpu: AMD EPYC 7763 (16 threads)", "amd epyc 7763", "node", True),
        # had to be the whole model string: a real device's entry never won, and `project --gpu "AMD EPYC 7763"`
        # left its measured energy out as other hardware's
        ("cpu: AMD EPYC 7763 64-Core Processor (16 threads)", "AMD EPYC 7763", "node", True),
        ("cpu: ARM Neoverse-N1 (4 threads)", "Neoverse-N1", "node", True),
        ("cpu: ARM Neoverse-N1 (4 threads)", "N1", "node", True),  # was refused as part of the model; it is one
        ("cpu: AMD EPYC 7763 (16 threads)", "AMD EPYC", "node", False),  # no model
        (CPU16, "AMD EPYC", "node", False),  # won as the whole model string; a vendor and family are no model
        (CPU16, "amd epyc", "node", False),
        (CPU16, "cpu", "node", False),
        ("cpu: cpu (16 threads)", "cpu", "node", False),  # won as "the model" where none was recorded
        (CPU16, "EPYC", "node", False),
        (CPU16, "16 threads", "node", False),  # the thread count is no model
        # a device no built-in pattern knows: any entry named in it, as a whole word
        ("Google TPU v5e", "TPU v5e", "gpu", True),
        ("Google TPU v5e", "Google", "gpu", True),
        ("NVIDIA L40S", "L40", "gpu", False),  # not a word of "L40S"
    ],
)
def test_which_users_entry_named_in_a_device_prices_it_over_the_built_in_pattern(sqlite_url, device, entry, kind,
                                                                                 wins):
    """A user's entry named anywhere in the device string took over from the built-in pattern, generic words
    included ('PCIe', 'NVIDIA', 'cuda', '80GB', 'cpu'). For a device a pattern knows, GPU or CPU, the entry must
    be named in it as whole words and hold a model: a word with a digit that is not a memory's size or kind
    ('A100', 'GH100', 'H100 PCIe', 'AMD EPYC 7763', 'Neoverse-N1'), a CPU's in the model its string gives; a
    device no pattern knows takes any entry named in it as a whole word. The snapshot, cost's price and
    differs_from (an explicit --gpu naming the device keeps its measured energy) follow the same rule."""
    engine = open_store(sqlite_url)
    try:
        builtin = price_snapshot(load_catalog(engine), device).get("name")
        set_price(engine, name=entry, value=2.0, kind=kind, source="test")
        catalog = load_catalog(engine)
        found = catalog_entry_for_device(catalog, device)
        snap = price_snapshot(catalog, device)
        assert names_own_device(entry, device) is wins
        if wins:
            assert found is not None and found.name == entry and snap["name"] == entry
            assert snap["node_hourly_usd"] == 2.0 * entry_units(found, device)
            assert not resolve_node_price(engine, device=device, gpu=entry).differs_from(device)
        else:
            assert (found.name if found else None) == builtin and snap.get("name") == builtin, (found, snap)
            if builtin is not None:
                assert resolve_node_price(engine, device=device).catalog_name == builtin
    finally:
        engine.dispose()


def test_the_readme_says_which_users_entry_named_in_a_device_prices_it():
    """The README said any entry named in the device string priced a device no built-in rule knows, and nothing
    of a known one; then a rule for GPUs (the chip and more) and one for CPUs (the whole model string) that let
    "H100 80GB" win but not "A100 80GB", nor "AMD EPYC 7763" on a real CPU's string. It says the one rule
    names_own_device keeps: whole words that hold a model."""
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8").split())
    assert "named as the device string names the hardware" not in text
    assert "naming its chip and more than the built-in entry" not in text
    for said in ('holds a model: a word with a digit that is not a memory\'s size or kind',
                 '`"A100-SXM4-40GB"` or `"A100"` over `A100-80GB`', '`"H100 PCIe"` over `H100`',
                 '`"AMD EPYC 7763"` over `cpu-2core` for "cpu: AMD EPYC 7763 64-Core Processor (16 threads)"',
                 'not `"PCIe"`, `"NVIDIA"`, `"cuda"`, `"80GB"`, `"cpu"`, `"EPYC"` or `"AMD EPYC"`',
                 'the longest of several such entries winning'):
        assert said in text, said
    assert names_own_device("H100 PCIe", "NVIDIA H100 PCIe") and not names_own_device("PCIe", "NVIDIA H100 PCIe")
    device = "cpu: AMD EPYC 7763 64-Core Processor (16 threads)"
    assert names_own_device("AMD EPYC 7763", device) and not names_own_device("AMD EPYC", device)


def test_the_longest_users_entry_naming_a_device_prices_it(sqlite_url):
    """Several of a user's entries name the device: the longest, the most specific, prices it."""
    engine = open_store(sqlite_url)
    try:
        for name in ("A100", "A100-SXM4", "A100-SXM4-40GB", "NVIDIA"):
            set_price(engine, name=name, value=2.0, kind="gpu", source="test")
        assert catalog_entry_for_device(load_catalog(engine), "NVIDIA A100-SXM4-40GB").name == "A100-SXM4-40GB"
        assert catalog_entry_for_device(load_catalog(engine), "NVIDIA A100 PCIe 40GB").name == "A100"
    finally:
        engine.dispose()
