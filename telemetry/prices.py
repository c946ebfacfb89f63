"""Price catalog: $/GPU-hour and $/node-hour defaults, electricity $/kWh and PUE, kept in the `prices` table.

Defaults come from `telemetry/data/prices.json` (each with its source and date). Reading the catalog writes
nothing (a read-only store can be priced): it is the table's entries, and the defaults for names the table
lacks. Only `set_price` (`specfinops prices set`) writes, the one entry it sets; older stores hold the
defaults that reads used to insert. Names are looked up case-insensitively.

Public API:
    list_prices(engine) -> list[PriceEntry]          # the catalog, writes nothing
    get_price(engine, name) -> PriceEntry            # writes nothing; ValueError listing the known names when unknown
    hourly_entry(catalog, name) -> PriceEntry        # what --gpu NAME takes; ValueError listing the hourly entries
    check_price(name, value, *, source, kind=None, as_of=None) -> (value, as_of)   # before opening a store
    set_price(engine, name, value, *, source, kind=None, as_of=None) -> PriceEntry
    catalog_name_for_device(device) -> str | None    # "NVIDIA H100 80GB HBM3" -> "H100", "cpu (2 cores)" -> "cpu-2core"
    device_units(device) -> int   # the entry's units a device is: "... x 8 (tp 8)" -> 8 GPUs, "cpu (16 threads)" -> 8
    device_gpus(device) -> int    # the GPUs a device spans: "... x 8 (tp 8)" -> 8, else 1
    catalog_entry_for_device(catalog, device) -> PriceEntry | None   # a user's entry named in it, else the built-in match
    own_entry_name(device) -> str | None   # the name an entry needs to price the device itself: "AMD EPYC 7763"
    gpu_chip(device_or_entry_name) -> str | None   # "H100-SXM", "NVIDIA H100 80GB HBM3" -> "H100"; "H100 x8" -> None
    resolve_node_price(engine, *, device, price_snapshot=None, gpu=None, gpus_per_node=1,
                       node_hourly_usd=None, catalog=None) -> NodePrice
    energy_prices(engine, catalog=None) -> tuple[float, float]     # (usd_per_kwh, pue)
    load_catalog(engine_or_connection) -> PriceCatalog   # the whole catalog in one SELECT, writes nothing
    price_snapshot(catalog, device, taken_at=None) -> dict   # what a run records when it starts
    snapshot_energy(snapshot, key) -> float | None   # a recorded usd_per_kwh (>= 0) or pue (>= 1)

A run records, as it starts, the prices then in force (`price_snapshot`, written by the recorder with the run
row): costing prices it at those, not at whatever the catalog says later, so a past period's cost does not
change when a price is edited; --gpu / --node-hourly-usd / --usd-per-kwh / --pue still override them.

Pricing many runs: read the catalog once and pass it as `catalog=` to resolve_node_price and energy_prices,
which then query nothing (without it, each call reads the table again: a few statements per run).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from importlib import resources

from sqlalchemy import func, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from telemetry.db import Price, Run, retry_while_locked, utcnow

ELECTRICITY = "electricity"
PUE = "pue"
MAX_SOURCE_CHARS = 500  # a price's source: a URL or a quote reference, one line
CPU_NODE = "cpu-2core"
KIND_UNITS = {"gpu": "usd_per_hour", "node": "usd_per_hour", "electricity": "usd_per_kwh", "pue": "ratio"}

# Upper bounds of a price, wherever one enters (`prices set`, the --node-hourly-usd / --usd-per-kwh / --pue options
# of cost and project; the dashboard's inputs stop at the same figures): a larger value is a typo or a unit slip,
# and near the float limit it turns costs into inf. Far beyond any real price, so no real one is refused.
MAX_USD_PER_HOUR = 10_000.0  # $/h of a GPU or a node: ~100x the dearest 8-GPU cloud node (about $100/h)
MAX_USD_PER_KWH = 10.0  # $/kWh: retail electricity costs well under $1/kWh nearly everywhere
MAX_PUE = 5.0  # real data centres run at 1.1-2.5; a PUE of 5 would spend 4 W on cooling per watt of compute
MAXIMUM_BY_UNIT = {"usd_per_hour": (MAX_USD_PER_HOUR, "$/h"), "usd_per_kwh": (MAX_USD_PER_KWH, "$/kWh"),
                   "ratio": (MAX_PUE, "")}


class NoPriceError(ValueError):
    """No price covers a device: no catalog entry matches it and nothing else (a flag, a snapshot) priced it."""


@dataclass(frozen=True, slots=True)
class PriceEntry:
    name: str
    kind: str  # gpu | node | electricity | pue
    value: float  # $/hour, $/kWh or a ratio (PUE)
    unit: str  # usd_per_hour | usd_per_kwh | ratio
    source: str
    as_of: str


@dataclass(frozen=True, slots=True)
class NodePrice:
    """The node price used for a cost figure, and where it came from."""

    usd_per_hour: float
    priced_as: str  # e.g. "H100 x8", "cpu-2core", "custom $8.806/h", "run price snapshot (H100)"
    origin: str  # flag | gpu | snapshot | catalog
    catalog_name: str | None = None  # the catalog entry behind the price; None for a custom price
    catalog_kind: str | None = None  # that entry's kind (gpu | node) where it was read from the catalog

    def differs_from(self, device: str) -> bool:
        """True when this price is that of other hardware than the measured `device`: a catalog entry that is
        not the device's (`--gpu H100` on runs measured on a CPU), or any entry where no catalog entry matches
        the device. Costs and projections then leave out the energy measured on the device (it is not that
        hardware's) and say so. A custom price (`--node-hourly-usd`, no catalog entry) is what the measured
        hardware costs per node-hour (the documented use: a device the catalog does not list, or another rate
        for it), so it does not differ and the measured energy stays in."""
        if self.catalog_name is None:
            return False
        measured = catalog_name_for_device(device)
        if measured is not None and self.catalog_name.lower() == measured.lower():
            return False  # the device's own catalog entry
        if names_own_device(self.catalog_name, device):
            return False  # an entry named after the device (a user's "TPU v5e" for "Google TPU v5e", "H100 PCIe")
        # another price of the same GPU (H100-SXM, my-h100-reserved for an H100; each GPU of a vLLM "x 8 (tp 8)")
        chip = gpu_chip(_DEVICE_GPUS.sub("", device or ""))
        return chip is None or chip != gpu_chip(self.catalog_name)


@dataclass(frozen=True, slots=True)
class PriceCatalog:
    """The price catalog as read at one moment (`load_catalog`): look-ups by name, any case, with no query."""

    entries: tuple[PriceEntry, ...]

    def get(self, name: str) -> PriceEntry:
        """The entry named `name` (any case); ValueError naming it and listing the known names, as get_price."""
        key = name.strip().lower()
        for entry in self.entries:
            if entry.name.lower() == key:
                return entry
        raise _unknown(name, (e.name for e in self.entries))

    def energy_prices(self) -> tuple[float, float]:
        """(usd_per_kwh, pue)."""
        return self.get(ELECTRICITY).value, self.get(PUE).value


def default_entries() -> list[PriceEntry]:
    """The defaults shipped in `telemetry/data/prices.json`."""
    text = resources.files("telemetry").joinpath("data/prices.json").read_text(encoding="utf-8")
    return [PriceEntry(**row) for row in json.loads(text)["prices"]]


def _entry(row: Price) -> PriceEntry:
    return PriceEntry(row.name, row.kind, row.value, row.unit, row.source, row.as_of)


def load_catalog(bind: Engine | Connection) -> PriceCatalog:
    """The catalog in one SELECT, as get_price sees it: the table's entries, and the defaults for names the
    table lacks (read, never inserted: a report on a store writes nothing).
    Given a Connection, it reads inside that connection's transaction."""
    if isinstance(bind, Connection):
        rows = _read_entries(bind)
    else:
        with bind.connect() as conn:
            rows = _read_entries(conn)
    have = {e.name.lower() for e in rows}
    rows += [e for e in default_entries() if e.name.lower() not in have]
    return PriceCatalog(listed(rows))


def listed(entries: list[PriceEntry]) -> tuple[PriceEntry, ...]:
    """Entries in the order the catalog lists them: by kind, then name."""
    return tuple(sorted(entries, key=lambda e: (e.kind, e.name)))


def _read_entries(conn: Connection) -> list[PriceEntry]:
    table = Price.__table__
    cols = (table.c.name, table.c.kind, table.c.value, table.c.unit, table.c.source, table.c.as_of)
    return [PriceEntry(*row) for row in conn.execute(select(*cols))]


def list_prices(engine: Engine) -> list[PriceEntry]:
    """The catalog (the table's entries and the defaults for names it lacks), by kind and name; writes nothing,
    so it reads a read-only store."""
    return list(load_catalog(engine).entries)


def _find(s: Session, name: str) -> Price | None:
    """The row named `name` in any case, as the database's lower() folds it (as uq_prices_name_lower does)."""
    return s.scalars(select(Price).where(func.lower(Price.name) == func.lower(name.strip()))).first()


def get_price(engine: Engine, name: str) -> PriceEntry:
    """The entry named `name` (any case), stored or default; ValueError naming it and listing the known names.
    Writes nothing."""
    return load_catalog(engine).get(name)


def _unknown(name: str, known: Iterable[str], lead: str = "") -> ValueError:
    return ValueError(f"{lead}unknown price name {name!r}; known: {', '.join(sorted(known, key=str.lower))}")


def check_price(
    name: str, value: float, *, source: str, kind: str | None = None, as_of: str | None = None
) -> tuple[float, str | None]:
    """Validate a `set_price` input without a store: (value, as_of normalised to YYYY-MM-DD or None).

    Call it before opening the store, so bad input creates no database. The value must be > 0, except
    electricity, which may cost $0/kWh (own solar, a flat-rate lease); what the name's kind is, when `kind`
    is not given, only the store knows: `set_price` checks that part again.
    """
    if not name or not name.strip() or len(name.strip()) > 64:
        raise ValueError(f"name must be 1-64 characters, got {name!r}")
    # names match in any case: SQLite's lower() folds ASCII letters only, so 'ÄBC' and 'äbc' were two entries
    # there (one never read) where PostgreSQL kept one; hardware names are ASCII
    if not (name.isascii() and name.isprintable()):
        raise ValueError(f"name must be printable ASCII (letters, digits, spaces, - _ . and the like), got {name!r}")
    if kind is not None and kind not in KIND_UNITS:
        raise ValueError(f"kind must be one of {', '.join(KIND_UNITS)}, got {kind!r}")
    for used in (ELECTRICITY, PUE):  # energy is priced at these two entries only: another of their kind is never read
        if kind == used and name.strip().lower() != used:
            raise ValueError(f"a price of kind {used} named {name.strip()!r} would never be used: energy is priced "
                             f"at the catalog's entry named {used!r} (`specfinops prices set {used} X --source ...`)")
    if not source or not source.strip():
        raise ValueError(f"source must say where the price comes from, got {source!r}")
    if not source.isprintable() or len(source) > MAX_SOURCE_CHARS:  # a newline broke `prices`' table into rows
        raise ValueError(f"source must be one line of at most {MAX_SOURCE_CHARS} printable characters, got "
                         f"{len(source)} characters: {source[:40]!r}")
    value = float(value)
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"value must be a number >= 0, got {value!r}")
    if kind is not None:
        _check_value_for_kind(kind, value)
    # a default name's kind is fixed (set_price refuses another): bound its value before any store is opened;
    # another name's kind only the store knows, so it gets the widest bound here and its own in set_price
    known = kind or next((e.kind for e in default_entries() if e.name.lower() == name.strip().lower()), None)
    _check_maximum(known, value, name)
    if as_of is not None:
        try:
            day = date.fromisoformat(as_of.strip())
        except ValueError:
            raise ValueError(f"--as-of must be a date YYYY-MM-DD, got {as_of!r}") from None
        if day > latest_today():
            raise ValueError(f"--as-of {as_of.strip()} is in the future: it is the date the price was quoted or "
                             "seen (default today), so today at the latest")
        as_of = day.isoformat()
    return value, as_of


def latest_today() -> date:
    """Today's date where it is latest on Earth (UTC+14): a price quoted 'today' in any time zone passes."""
    return (datetime.now(UTC) + timedelta(hours=14)).date()


def _check_maximum(kind: str | None, value: float, name: str | None = None) -> None:
    """ValueError where `value` is above the bound of its kind's unit (MAXIMUM_BY_UNIT); an unknown kind (None)
    is held to the widest bound."""
    if kind is None:
        maximum, unit = max(MAXIMUM_BY_UNIT.values())
        what = "a price"
    else:
        maximum, unit = MAXIMUM_BY_UNIT[KIND_UNITS[kind]]
        what = "a PUE" if kind == PUE else "an electricity price" if kind == ELECTRICITY else f"a {kind} price"
    if value > maximum:
        named = f" ({name.strip()})" if name else ""
        raise ValueError(f"value of {what}{named} must be at most {maximum:g}{' ' + unit if unit else ''} (far beyond any "
                         f"real one: a typo or a unit slip?), got {value:g}")


def _check_value_for_kind(kind: str, value: float, name: str | None = None) -> None:
    if kind == "pue" and value < 1:
        raise ValueError(f"value of a PUE must be >= 1, got {value!r}")
    if kind != ELECTRICITY and not value > 0:
        raise ValueError(f"value of a {kind} price must be > 0 (only electricity may cost 0), got {value!r}")
    _check_maximum(kind, value, name)


def set_price(
    engine: Engine, name: str, value: float, *, source: str, kind: str | None = None, as_of: str | None = None
) -> PriceEntry:
    """Create or update an entry. A new name needs `kind`; the value must be > 0 (electricity >= 0, PUE >= 1).

    Names are unique in any case (uq_prices_name and uq_prices_name_lower): when another writer creates the same
    name (in any case) between this call's look-up and its insert, the insert fails and is retried once as an
    update of that row, as if this call had come second."""
    value, as_of = check_price(name, value, source=source, kind=kind, as_of=as_of)
    def write() -> PriceEntry:  # one transaction: waited for while another process holds the store locked
        return _set_price(engine, name, value, source=source, kind=kind, as_of=as_of)

    try:
        return retry_while_locked(engine, write)
    except _LostRace:
        return retry_while_locked(engine, write)


class _LostRace(Exception):
    """The new row's insert met a row of the same name (any case) committed since the look-up."""


def _set_price(engine: Engine, name: str, value: float, *, source: str, kind: str | None,
               as_of: str | None) -> PriceEntry:
    with Session(engine) as s:
        row = _find(s, name)
        created = row is None
        if created:  # a new row: a default's name keeps the default's spelling and kind
            default = next((e for e in default_entries() if e.name.lower() == name.strip().lower()), None)
            if default is not None and kind is not None and kind != default.kind:
                raise ValueError(f"kind of {default.name!r} is {default.kind!r}, cannot change it to {kind!r}")
            if default is None and kind is None:
                raise ValueError(
                    f"kind is required for a new price name {name!r} (one of {sorted(KIND_UNITS)})"
                )
            new_kind = default.kind if default is not None else kind
            row = Price(name=default.name if default is not None else name.strip(), kind=new_kind,
                        unit=KIND_UNITS[new_kind], value=value, source="", as_of="")
            s.add(row)
        elif kind is not None and kind != row.kind:
            raise ValueError(f"kind of {row.name!r} is {row.kind!r}, cannot change it to {kind!r}")
        _check_value_for_kind(row.kind, value, row.name)
        row.value = value
        row.source = source.strip()
        row.as_of = as_of or utcnow().strftime("%Y-%m-%d")
        row.updated_at = utcnow()
        written = _entry(row)  # what this call wrote: read back after the commit, a concurrent set's value
        try:
            s.commit()
        except IntegrityError as exc:
            if not created:
                raise
            raise _LostRace from exc
        return written


# Device strings as the worker records them -> catalog names. Order matters: most specific first.
_DEVICE_PATTERNS = [
    (re.compile(r"^\s*cpu\b", re.I), CPU_NODE),  # first: a CPU model name may hold "a100"-like letters
    (re.compile(r"h100.*sxm|sxm.*h100", re.I), "H100"),
    (re.compile(r"h100", re.I), "H100"),
    (re.compile(r"a100", re.I), "A100-80GB"),
    (re.compile(r"\bl4\b", re.I), "L4"),
]


# The one GPU a recorded device string, or a price entry's name, describes: entries of one chip price the same
# hardware (H100 on AWS, H100-SXM on Lambda, a user's "my-h100-reserved"), so its measured energy is that chip's
# too. Only these chips are told apart; a CPU node's price stands for its own size (cpu-2core is not cpu-64core),
# and a name or device that counts several devices ("H100 x8", "8x H100", "h100-8gpu", a vLLM device
# "... x 8 (tp 8)") is not one GPU.
_CHIPS = [
    (re.compile(r"\bh100\b", re.I), "H100"),
    (re.compile(r"\ba100\b", re.I), "A100"),
    (re.compile(r"\bl4\b", re.I), "L4"),
]
_COUNTED = re.compile(r"(?:\d+\s*[x×*]\s*[a-z]|[x×*]\s*\d+\b|\d+\s*-?\s*gpus?\b|\btp\s*\d+)", re.I)


def gpu_chip(text: str) -> str | None:
    """'H100' for "NVIDIA H100 80GB HBM3", "H100-SXM" or "my-h100-reserved"; 'A100' ("A100-80GB-lambda"), 'L4';
    None for anything else: other chips, CPUs, and names or devices that count several GPUs ("H100 x8")."""
    text = text or ""
    if _COUNTED.search(text):
        return None
    return next((chip for pattern, chip in _CHIPS if pattern.search(text)), None)


def catalog_name_for_device(device: str) -> str | None:
    """The catalog entry that prices a recorded device string, or None when none matches."""
    for pattern, name in _DEVICE_PATTERNS:
        if pattern.search(device or ""):
            return name
    return None


# How much hardware one recorded device is. A vLLM run over several GPUs records "cuda: NVIDIA H100 80GB HBM3 x 8
# (tp 8)": 8 GPUs, each priced by the per-GPU entry. A CPU run records its threads, "cpu: AMD EPYC (16 threads)":
# the cpu-2core entry prices 2 of them (a 2-vCPU node; cloud CPU prices scale with vCPUs), so 16 threads are 8 of
# its nodes. A CPU device without a count ("cpu") is one such node.
_DEVICE_GPUS = re.compile(r"\sx\s*(\d+)\s*\(tp\s*\d+\)\s*$", re.I)
_CPU_THREADS = re.compile(r"^\s*cpu\b.*\((\d+)\s*(?:threads?|cores?)\)", re.I)
CPU_NODE_THREADS = 2  # the threads the cpu-2core entry prices


def device_gpus(device: str) -> int:
    """The GPUs one recorded device spans: 8 for a vLLM "... x 8 (tp 8)", else 1."""
    m = _DEVICE_GPUS.search(device or "")
    return max(1, int(m.group(1))) if m else 1


def _cpu_nodes(device: str) -> int | None:
    """A CPU device's threads in CPU_NODE_THREADS-thread nodes, rounded up; None for a device that counts none."""
    m = _CPU_THREADS.search(device or "")
    return max(1, -(-int(m.group(1)) // CPU_NODE_THREADS)) if m else None


def device_units(device: str) -> int:
    """How many of its catalog entry's units a recorded device is (the entry's price is per unit): its GPUs
    (device_gpus), or for a CPU its threads in CPU_NODE_THREADS-thread nodes, rounded up."""
    nodes = _cpu_nodes(device)
    return nodes if nodes is not None else device_gpus(device)


def names_device(name: str, device: str) -> bool:
    """True when a catalog entry's name stands in a recorded device string as a whole word, any case
    ("TPU v5e" in "Google TPU v5e"; "L4" not in "L40S"): how an entry a user adds prices a device that
    catalog_name_for_device does not know."""
    name = (name or "").strip()
    return bool(name) and re.search(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9])", device or "", re.I) is not None


@functools.cache
def _default_names() -> frozenset[str]:
    """The shipped defaults' names, lower case (read once: the file ships with the package)."""
    return frozenset(e.name.lower() for e in default_entries())


# The CPU model a CPU device string names: "cpu: AMD EPYC 7763 (16 threads)" -> "AMD EPYC 7763"; "" for "cpu".
_CPU_MODEL = re.compile(r"^\s*cpu\b\s*:?\s*(.*?)\s*(?:\(\s*\d+\s*(?:threads?|cores?)\s*\))?\s*$", re.I)
# The words of an entry's name (a version such as "1.5TB" is one word) and those holding a digit that still say
# no model: a memory's size (80GB, 40G, 1TB, 16GiB) or kind (HBM3, HBM2e, GDDR6)
_NAME_WORD = re.compile(r"[a-z0-9]+(?:\.[a-z0-9]+)*", re.I)
_MEMORY_WORD = re.compile(r"\d+(?:\.\d+)?[kmgtp]i?b?|hbm\d\w*|g?ddr\d\w*", re.I)


def cpu_model(device: str) -> str | None:
    """The CPU model part of a CPU device string ("AMD EPYC 7763" for "cpu: AMD EPYC 7763 (16 threads)"); None
    for a device that is not a CPU's or names no model ("cpu (2 cores)", "cpu: cpu (16 threads)")."""
    m = _CPU_MODEL.match(device or "")
    model = " ".join(m.group(1).split()) if m else ""
    return model if model and model.lower() != "cpu" else None


def names_a_model(name: str) -> bool:
    """True when an entry's name holds a model: a word with a digit in it that is not a memory's size or kind
    ("A100", "A100X", "GH100", "H100 PCIe", "A100-SXM4-40GB", "AMD EPYC 7763", "Neoverse-N1", "TPU v5e"; not
    "PCIe", "NVIDIA", "cuda", "80GB", "HBM3", "cpu", "EPYC", "AMD EPYC")."""
    return any(any(c.isdigit() for c in w) and not _MEMORY_WORD.fullmatch(w) for w in _NAME_WORD.findall(name or ""))


def names_own_device(name: str, device: str) -> bool:
    """True when an entry `name` describes the recorded `device` itself, as catalog_entry_for_device prices it
    over the built-in pattern (the longest of several): named in the device string as whole words, any case
    (names_device), and
    - for a device no built-in pattern knows: any such entry ("TPU v5e" for "Google TPU v5e");
    - for a device a pattern knows (a GPU or a CPU alike): a user's entry (not a shipped default's name) that
      holds a model (names_a_model): "A100-SXM4-40GB", "A100" or "H100 PCIe" for "NVIDIA A100-SXM4-40GB" and
      "NVIDIA H100 PCIe", "GH100" for "NVIDIA GH100", "AMD EPYC 7763" for "cpu: AMD EPYC 7763 64-Core Processor
      (16 threads)"; not "PCIe", "NVIDIA", "cuda", "80GB", "EPYC", "AMD EPYC". A CPU's is looked for in its
      model ("cpu: cpu (16 threads)" names none, its thread count is not a model), a GPU's without the GPUs a
      vLLM device counts (" x 8 (tp 8)")."""
    name = (name or "").strip()
    builtin, text = _own_device_text(device or "")
    if builtin is None:
        return names_device(name, device)
    if name.lower() in _default_names() or not names_a_model(name):
        return False
    return text is not None and names_device(name, text)


@functools.lru_cache(maxsize=1024)
def _own_device_text(device: str) -> tuple[str | None, str | None]:
    """(the built-in entry a pattern gives `device`, the part of it a user's entry must name: a CPU's model, a
    GPU's string without the GPUs a vLLM device counts): read once per device, not once per catalog entry that
    catalog_entry_for_device asks names_own_device about."""
    builtin = catalog_name_for_device(device)
    if builtin is None:
        return None, None
    return builtin, cpu_model(device) if builtin == CPU_NODE else _DEVICE_GPUS.sub("", device)


_BACKEND_PREFIX = re.compile(r"^\s*[a-z]+\s*:\s*", re.I)  # "cuda: " of "cuda: NVIDIA H100 80GB HBM3"


def own_entry_name(device: str) -> str | None:
    """A name under which an entry of the user's prices the recorded `device` itself (names_own_device): a CPU's
    model ("AMD EPYC 7763" for "cpu: AMD EPYC 7763 64-Core Processor (16 threads)"), a GPU's name without its
    backend and the GPUs a vLLM device counts ("NVIDIA H100 80GB HBM3"), a device no pattern knows as recorded;
    None where no entry's name can ("cpu: AMD EPYC (2 threads)" names no model: price it with --node-hourly-usd)."""
    builtin, text = _own_device_text(device or "")
    name = " ".join(_BACKEND_PREFIX.sub("", (text or "") if builtin is not None else (device or "")).split())
    if not (0 < len(name) <= 64 and name.isascii() and name.isprintable()) or name.lower() in _default_names():
        return None
    return name if names_own_device(name, device) else None


OTHER_HARDWARE = "an entry named otherwise is taken as other hardware"  # how own_price_text's clause ends


def own_price_text(devices: Iterable[str]) -> str:
    """How to price the measured `devices` themselves, as a clause: a catalog entry named after a device's model
    (own_entry_name) is that device's price, as --node-hourly-usd N is; an entry of another name is other hardware.
    The two prices are told apart: a GPU entry's X is per GPU (a device of 8 GPUs costs 8 X an hour), N is the whole
    measured device's $/h; a node entry's X is the whole device's too."""
    devices = list(dict.fromkeys(devices))
    names = [own_entry_name(d) for d in devices]
    if not devices or any(n is None for n in names):
        which = f"{devices[0]!r}" if len(devices) == 1 else "devices"
        return (f"to price the measured {'hardware' if len(devices) != 1 else which} itself, pass --node-hourly-usd N "
                f"(N: one measured device's whole $/h): {'its' if len(devices) == 1 else 'a'} device string names "
                f"no model that a catalog entry could be named after, and {OTHER_HARDWARE}")
    sets = "; ".join(
        f'`specfinops prices set "{n}" X --kind {kind} --source ...`, X {OWN_X[kind]}, and --gpu "{n}"'
        for n, kind in zip(names, _own_kinds(devices), strict=True))
    return (f"to price the measured hardware itself, name its entry after the device's model, as it stands in the "
            f"device string ({sets}), or pass --node-hourly-usd N, N the whole measured device's $/h; "
            f"{OTHER_HARDWARE}")


# what an entry's price X is, by the entry's kind (own_price_text): a GPU's is per GPU, a node's the whole device's
OWN_X = {"gpu": "its $/h per GPU", "node": "the whole device's $/h"}


def _own_kinds(devices: Iterable[str]) -> list[str]:
    """The kind of the entry that prices each of `devices` itself: node for a CPU, gpu otherwise."""
    return ["node" if _own_device_text(d)[0] == CPU_NODE else "gpu" for d in devices]


def catalog_entry_for_device(catalog: PriceCatalog, device: str) -> PriceEntry | None:
    """The catalog entry that prices `device` per unit: the longest hourly entry whose name stands in the device
    string as its own (names_own_device: a user's price of its model, "H100 PCIe" for "NVIDIA H100 PCIe", over
    the built-in H100, "AMD EPYC 7763" over cpu-2core; any entry for a device no pattern knows), else the one
    catalog_name_for_device names; None when none does."""
    named = [e for e in catalog.entries if e.unit == "usd_per_hour" and names_own_device(e.name, device)]
    if named:
        return max(named, key=lambda e: len(e.name))
    name = catalog_name_for_device(device)
    if name is not None:
        try:
            entry = catalog.get(name)
        except ValueError:
            return None
        return entry if entry.unit == "usd_per_hour" else None
    return None


def entry_units(entry: PriceEntry, device: str) -> int:
    """How many of `entry` one recorded device is: a GPU entry's GPUs (device_gpus), the CPU node entry's
    CPU_NODE_THREADS-thread nodes (device_units); a node entry prices a whole node."""
    if entry.kind == "gpu":
        return device_gpus(device)
    return (_cpu_nodes(device) or 1) if entry.name.lower() == CPU_NODE else 1


def _times(name: str, units: int) -> str:
    return name if units == 1 else f"{name} x{units}"


def price_snapshot(catalog: PriceCatalog, device: str, taken_at: datetime | None = None) -> dict:
    """The prices in force for a run on `device`, as the run records them as it starts (runs.price_snapshot):
    {"name": catalog entry pricing the device, "node_hourly_usd": its value, "usd_per_kwh", "pue",
    "taken_at": UTC ISO time}. name and node_hourly_usd only when a catalog entry prices the device (as
    resolve_node_price would price it from the catalog); the energy prices always."""
    snap: dict = {}
    entry = catalog_entry_for_device(catalog, device)
    if entry is not None and entry.value > 0:
        units = entry_units(entry, device)  # node_hourly_usd prices the whole device: `units` x the entry
        snap.update(name=entry.name, units=units, node_hourly_usd=entry.value * units)
    usd_per_kwh, pue = catalog.energy_prices()
    when = (taken_at or datetime.now(UTC)).astimezone(UTC)
    snap.update(usd_per_kwh=usd_per_kwh, pue=pue, taken_at=when.isoformat())
    return snap


def snapshot_energy(snapshot: dict | None, key: str) -> float | None:
    """A run's recorded electricity price ($/kWh >= 0: $0 is a real price, own solar or a flat lease) or PUE
    (>= 1); None where the snapshot has no valid one."""
    v = snapshot.get(key) if isinstance(snapshot, dict) else None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v) if v >= (1 if key == "pue" else 0) else None


def _snapshot_price(snapshot: dict | None, device: str = "") -> NodePrice | None:
    """A run's recorded price snapshot: {"node_hourly_usd": x, "name": ..., "units": n} (or "usd_per_hour").
    node_hourly_usd prices the whole device, `units` of the entry `name`. A snapshot without "units" (taken
    before they were counted) holds one unit's price: where it is the price of the device's own entry, it is
    scaled to the device's units (device_units), as a snapshot taken now would be."""
    if not isinstance(snapshot, dict):
        return None
    value = snapshot.get("node_hourly_usd", snapshot.get("usd_per_hour"))
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        return None
    name = snapshot.get("name") or snapshot.get("priced_as")
    units = snapshot.get("units")
    if isinstance(units, float) and units.is_integer():  # 8.0 after a JSON round trip through another tool
        units = int(units)
    if isinstance(units, bool) or not isinstance(units, int) or units < 1:
        own = name is not None and str(name).lower() == (catalog_name_for_device(device) or "").lower()
        units = device_units(device) if own else 1
        value = value * units
    label = f"run price snapshot ({_times(str(name), units)})" if name else "run price snapshot"
    return NodePrice(float(value), label, "snapshot", str(name) if name else None)


def runs_priced_by_entry(engine: Engine, name: str) -> dict[str, int]:
    """Per device: how many stored runs recorded no node price (no snapshot, one taken before snapshots, or one
    taken while no entry priced their device) and are priced by the catalog entry `name` as it now stands: its
    edits change their cost, unlike that of runs that recorded one. Reads each run's device and snapshot (runs,
    not requests); writes nothing."""
    catalog = load_catalog(engine)
    found: dict[str, int] = {}
    with Session(engine) as s:
        for device, snapshot in s.execute(select(Run.device, Run.price_snapshot)):
            if _snapshot_price(snapshot, device) is not None:
                continue
            entry = catalog_entry_for_device(catalog, device)
            if entry is not None and entry.name.lower() == name.lower():
                found[device] = found.get(device, 0) + 1
    return found


def resolve_node_price(
    engine: Engine,
    *,
    device: str,
    price_snapshot: dict | None = None,
    gpu: str | None = None,
    gpus_per_node: int = 1,
    node_hourly_usd: float | None = None,
    catalog: PriceCatalog | None = None,
) -> NodePrice:
    """Node price: `node_hourly_usd` > `gpu` x `gpus_per_node` > the run's snapshot > the catalog entry
    matching `device`. ValueError when nothing prices it. With `catalog` (load_catalog) the look-ups query
    nothing; without, they read the table."""
    if node_hourly_usd is not None:
        if not node_hourly_usd > 0:
            raise ValueError(f"node_hourly_usd must be > 0, got {node_hourly_usd!r}")
        return NodePrice(float(node_hourly_usd), f"custom ${node_hourly_usd:g}/h node", "flag")
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be an integer >= 1, got {gpus_per_node!r}")
    if gpu is not None:
        entry = hourly_entry(catalog if catalog is not None else load_catalog(engine), gpu)
        # a GPU entry times the GPUs asked for; a node entry times the device's units of it (a 16-thread CPU run
        # given --gpu cpu-2core is 8 of those 2-vCPU nodes, as the run's own catalog price counts it)
        n = gpus_per_node if entry.kind == "gpu" else entry_units(entry, device)
        return NodePrice(entry.value * n, _times(entry.name, n), "gpu", entry.name, entry.kind)
    snap = _snapshot_price(price_snapshot, device)
    if snap is not None:
        return snap
    entry = catalog_entry_for_device(catalog if catalog is not None else load_catalog(engine), device)
    if entry is None:
        raise NoPriceError(f"no catalog price matches device {device!r}; pass --gpu NAME or --node-hourly-usd X")
    units = entry_units(entry, device)
    return NodePrice(entry.value * units, _times(entry.name, units), "catalog", entry.name, entry.kind)


def energy_prices(engine: Engine, catalog: PriceCatalog | None = None) -> tuple[float, float]:
    """(usd_per_kwh, pue) from the catalog: `catalog` when given (no query), else the table."""
    if catalog is not None:
        return catalog.energy_prices()
    return get_price(engine, ELECTRICITY).value, get_price(engine, PUE).value


def hourly_entry(catalog: PriceCatalog, name: str) -> PriceEntry:
    """The entry `--gpu NAME` prices at: an hourly (GPU or node) entry named `name`, any case. ValueError where
    none is: listing the hourly entries only where no entry has that name (electricity and pue are no price
    --gpu takes), naming the entry's kind where it is the electricity or PUE price."""
    try:
        entry = catalog.get(name)
    except ValueError:
        raise _unknown(name, (e.name for e in catalog.entries if e.unit == "usd_per_hour"), "--gpu: ") from None
    if entry.unit != "usd_per_hour":
        raise ValueError(f"--gpu {name!r} names the {entry.kind} price ({entry.unit}), not an hourly GPU or node "
                         "price")
    return entry
