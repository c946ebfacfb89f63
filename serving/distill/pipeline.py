"""`specfinops distill` end to end: data (generate or reuse), train, measure, write the draft + model card."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch


def distill_cache() -> Path:
    """Where distill caches data, evaluation answers and checkpoints: `distill` under the cache directory
    (serving.models.cache_dir: SPECFINOPS_CACHE, else $XDG_CACHE_HOME/specfinops, else ~/.cache/specfinops), read
    at each call so the variable set at any time counts."""
    from serving.models import cache_dir

    return cache_dir() / "distill"


def __getattr__(name: str):
    if name == "CACHE":  # the old module constant, for scripts that import it: now read when asked
        return distill_cache()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "generation_config.json")
EVAL_DOMAINS = ("code", "chat", "rewrite")


REPRO_OPTIONS = ("target", "corpus", "generate_prompts", "stdlib_prompts", "package_prompts", "self_prompts",
                 "stdlib_code", "data_dir",
                 "max_new_tokens", "gen_batch",
                 "dtype", "out", "minutes", "total_minutes", "steps",
                 "head_vocab", "layers", "feature_layers", "data_feature_layers", "lr", "batch_tokens", "batch_pool", "unroll", "detach_unroll", "freeze_head", "w_feat", "w_hard",
                 "feat_noise", "seed", "k", "eval_max_new_tokens", "threads", "device")
# recorded as absolute paths (a target may be a model's name instead)
PATH_OPTIONS = ("target", "out", "corpus", "data_dir")
# the options whose 0 is their default and means "none of this data"; any other option's 0 is a choice the
# command must record (--w-feat 0, --feat-noise 0 train other weights than the defaults do)
ZERO_IS_UNSET = ("generate_prompts", "stdlib_prompts", "package_prompts", "self_prompts", "stdlib_code")


def resolve_device(spec: str) -> torch.device:
    """`--device`: cpu, or a CUDA GPU torch can see (cuda, cuda:N). ValueError naming what is wrong."""
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise ValueError(f"--device {spec!r}: not a device (use cpu, cuda or cuda:N)") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ValueError(f"--device {spec!r}: distill runs on cpu or a CUDA GPU")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {spec!r}: torch {torch.__version__} sees no CUDA GPU here "
                         "(a CPU build of torch, or no driver); use --device cpu")
    index = dev.index or 0
    if index >= torch.cuda.device_count():
        raise ValueError(f"--device {spec!r}: torch sees {torch.cuda.device_count()} CUDA GPU(s) (cuda:0.."
                         f"cuda:{torch.cuda.device_count() - 1})")
    return torch.device("cuda", index)


def command_line(args) -> str:
    """The command that reproduces a run, every training option spelled out (--resume and --checkpoint are left
    out: they change how the run got there, not its result). --data-dir is kept: the data in it is what the run
    trained on (`data_settings_refusal` keeps it to data made with the command's settings)."""
    import os

    from serving.kernels import resolve_dtype

    def absolute(path: str, name: str) -> str:
        p = Path(path).expanduser()
        return os.path.abspath(p) if name != "target" or p.is_dir() else path  # a target's name stays a name

    parts = ["specfinops", "distill"]
    for name in REPRO_OPTIONS:
        v = getattr(args, name, None)
        if name == "dtype" and v is not None:
            v = resolve_dtype(v)  # the precision this run used, not "auto"
        if name == "eval_max_new_tokens" and getattr(args, "no_eval", False):
            parts.append("--no-eval")  # no evaluation: a rerun measures nothing either (nor makes its data)
            continue
        if name in PATH_OPTIONS and v:
            v = [absolute(c, name) for c in v] if isinstance(v, list) else absolute(v, name)
        if v is None or v is False or v == [] or (v == 0 and name in ZERO_IS_UNSET):
            continue
        if name == "device" and v == "cpu":  # the default: cards of CPU runs read as they always did
            continue
        flag = "--" + name.replace("_", "-")
        if v is True:
            parts.append(flag)
        elif isinstance(v, list):
            parts += [flag, *map(str, v)]
        else:
            parts += [flag, str(int(v) if isinstance(v, float) and v.is_integer() and name != "lr" else v)]
    return shlex.join(parts)


# what --total-minutes keeps back from training for the last checkpoint, the weights and the model card
BUDGET_MARGIN_MINUTES = 0.5
MIN_TRAIN_MINUTES = 0.1  # the least training a budget must leave


def training_minutes(total_minutes: float, spent_minutes: float, minutes: float | None = None,
                     trained_minutes: float = 0.0, margin: float = BUDGET_MARGIN_MINUTES,
                     earlier_minutes: float = 0.0) -> float:
    """The training budget (`TrainConfig.minutes`, which counts the minutes a resumed run already trained)
    under a wall-clock budget of `total_minutes` for the whole run, of which the runs a --resume continues took
    `earlier_minutes` (their training included) and this one's data and set-up `spent_minutes`: the time left
    after `margin`, capped by an explicit `minutes`. Raises ValueError when nothing is left."""
    left = total_minutes - earlier_minutes - spent_minutes - margin
    if left < MIN_TRAIN_MINUTES and earlier_minutes:
        raise ValueError(f"--total-minutes {total_minutes:g}: the runs this --resume continues took "
                         f"{earlier_minutes:.1f} minutes (the budget bounds the whole run), this one's data and "
                         f"set-up {spent_minutes:.1f} and {margin:g} are kept for saving the draft, which leaves no "
                         "time to train; resume with a larger --total-minutes")
    if left < MIN_TRAIN_MINUTES:
        raise ValueError(f"--total-minutes {total_minutes:g}: preparing the data took {spent_minutes:.1f} minutes "
                         f"and {margin:g} are kept for saving the draft, which leaves no time to train; raise --total-minutes, or train on the data now cached "
                         "(the same data options reuse it) with --minutes")
    budget = trained_minutes + left
    return budget if minutes is None else min(minutes, budget)


def resume_budget_refusal(total_minutes: float, earlier_minutes: float, trained_minutes: float) -> str | None:
    """Why a --resume with --total-minutes `total_minutes` cannot train, said before anything is done: the runs it
    continues took `earlier_minutes` of it (their training, `trained_minutes`, included) and the margin for saving
    leaves less than MIN_TRAIN_MINUTES, before this run's data and set-up take any. None where some is left."""
    if total_minutes - earlier_minutes - BUDGET_MARGIN_MINUTES >= MIN_TRAIN_MINUTES:
        return None
    least = smallest_resume_budget(earlier_minutes)
    return (f"--total-minutes {total_minutes:g}: the runs this --resume continues took {earlier_minutes:.1f} minutes "
            f"(the budget bounds the whole run) and {BUDGET_MARGIN_MINUTES:g} are kept for saving the draft, which "
            f"leaves no time to train; resume with --total-minutes {least:g} or more (plus this run's data and "
            f"set-up), or with --minutes in place of --total-minutes (a training budget, counting the "
            f"{trained_minutes:.2f} minutes the checkpoint trained)")


def smallest_resume_budget(earlier_minutes: float) -> float:
    """The least --total-minutes (to 0.1 minute, rounded up) that leaves a --resume time to train after the runs it
    continues took `earlier_minutes`, before its own data and set-up."""
    return math.ceil(round((earlier_minutes + BUDGET_MARGIN_MINUTES + MIN_TRAIN_MINUTES) * 10, 6)) / 10


def _say(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr, flush=True)


def _umask() -> int:
    from serving.models import current_umask

    return current_umask()


def save_draft(draft, out: Path, extra: dict) -> None:
    """The EagleDraft file format (config.json + model.safetensors), weights cast to bf16 on the way out.
    Written in place: `write_output` writes a whole draft folder and swaps it in."""
    from safetensors.torch import save_file

    from serving.eagle import MODEL_TYPE

    out.mkdir(parents=True, exist_ok=True)
    state = {k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach()).cpu().contiguous()
             for k, v in draft.state_dict().items()}
    save_file(state, str(out / "model.safetensors.tmp"))
    # safetensors writes through a private (0600) temporary file: give the weights the mode the other files get
    # under the umask, so a server running as another user can read them as it reads config.json
    os.chmod(out / "model.safetensors.tmp", 0o666 & ~_umask())
    (out / "model.safetensors.tmp").replace(out / "model.safetensors")
    cfg = {"model_type": MODEL_TYPE, **asdict(draft.cfg), "torch_dtype": "bfloat16", **extra}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def copy_tokenizer(target_dir: Path, out: Path) -> None:
    for name in TOKENIZER_FILES:
        if (target_dir / name).is_file():
            shutil.copyfile(target_dir / name, out / name)


def _partial(out: Path) -> Path:
    """The sibling a new draft folder is written into before it is swapped in (this process's own)."""
    import os

    return out.with_name(f".{out.name}.partial-{os.getpid()}")


def _replaced(out: Path) -> Path:
    """Where the previous draft folder waits while the new one is renamed in (`swap_in` without an exchange)."""
    return out.with_name(f".{out.name}.previous")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where the system or
    the file system cannot."""
    import ctypes
    import os
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def recover_output(out: Path) -> None:
    """Put back a previous draft folder that a run killed between `swap_in`'s two renames left aside, and
    remove folders that runs no longer alive were writing."""
    import os

    if not out.exists() and _replaced(out).is_dir():
        _replaced(out).rename(out)
    shutil.rmtree(_replaced(out), ignore_errors=True)
    for d in out.parent.glob(f".{out.name}.partial-*"):
        pid = d.name.rsplit("-", 1)[-1]
        alive = pid.isdigit() and int(pid) != os.getpid() and Path(f"/proc/{pid}").exists()
        if not alive:
            shutil.rmtree(d, ignore_errors=True)


def swap_in(new: Path, out: Path) -> None:
    """Make the complete folder `new` the folder `out`: one rename where `out` does not exist yet, else one
    atomic exchange (the previous folder is then removed), or where the file system has none, the previous
    folder renamed aside first and removed only once the new one is in place (`recover_output` puts it back
    if a run dies in between)."""
    if not out.exists():
        new.rename(out)
        return
    if _exchange(new, out):
        shutil.rmtree(new)  # now the previous folder
        return
    aside = _replaced(out)
    shutil.rmtree(aside, ignore_errors=True)
    out.rename(aside)
    try:
        new.rename(out)
    except OSError:
        aside.rename(out)  # the previous folder back where it was
        raise
    shutil.rmtree(aside)


def _finite(obj):
    """`obj` (a model card, or part of one) with every float that is not a finite number (NaN, infinity) as None:
    JSON has no such numbers, and strict parsers refuse the bare NaN json.dumps writes for them."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def card_json(card: dict) -> str:
    """A model card as the file holds it: strict JSON (`_finite`), indented."""
    return json.dumps(_finite(card), indent=2, allow_nan=False) + "\n"


def write_output(out: Path, draft, extra: dict, target_dir: Path, card: dict) -> None:
    """The draft folder as one set: weights, config.json, the target's tokenizer files and model_card.json
    written into a sibling folder, then swapped in whole (`swap_in`), so a run killed at any moment leaves
    `out` as the previous set or the new one, never new weights beside an old config."""
    recover_output(out)
    new = _partial(out)
    shutil.rmtree(new, ignore_errors=True)
    try:
        save_draft(draft, new, extra)
        copy_tokenizer(target_dir, new)
        (new / "model_card.json").write_text(card_json(card))
        out.parent.mkdir(parents=True, exist_ok=True)
        swap_in(new, out)
    finally:
        shutil.rmtree(new, ignore_errors=True)  # what an error left half-written (nothing once swapped in)


def write_card_only(out: Path, card: dict) -> None:
    """model_card.json of a draft folder already in place replaced in one rename (the weights stay as they are)."""
    import os

    tmp = out / f".model_card.json.partial-{os.getpid()}"
    tmp.write_text(card_json(card))
    tmp.replace(out / "model_card.json")


def is_distill_output(path: Path) -> bool:
    """Whether `path` holds what an earlier `distill` wrote there: its model card, or the draft's config.json
    (written first, so a run stopped before its first card still counts)."""
    from serving.eagle import MODEL_TYPE, is_eagle_dir

    card = path / "model_card.json"
    try:
        if card.is_file() and json.loads(card.read_text()).get("model_type") == MODEL_TYPE:
            return True
        return is_eagle_dir(path)
    except (OSError, ValueError, AttributeError):  # unreadable, not JSON, or JSON that is not an object
        return False


def finished_status(out: Path) -> str | None:
    """The status of the finished draft in `out` (its model card says "trained", with or without a note after
    it such as an interrupted evaluation); None where `out` holds none (no card, an unfinished run's)."""
    try:
        card = json.loads((out / "model_card.json").read_text())
    except (OSError, ValueError):
        return None
    status = card.get("status") if isinstance(card, dict) else None
    return status if isinstance(status, str) and status.split(";")[0] == "trained" else None


def check_out(out: Path, target_dir: Path, data_dirs: list[Path], overwrite: bool = True) -> None:
    """Refuse, before any work, an --out the run would damage or could not write: the target's own directory
    (the draft's config.json and model.safetensors would replace the target's), a data directory, a file, a
    directory holding anything but an earlier distill output (which a rerun or --resume refreshes), or, without
    `overwrite`, one holding a finished draft (an unfinished run's stays replaceable). ValueError naming what is
    wrong."""
    import os

    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {out}: {existing} is a file, not a directory; give a directory for the draft")
    where = out.resolve()
    if where == target_dir.resolve():
        raise ValueError(f"--out {out} is the target's own directory ({target_dir}): writing the draft there "
                         "would replace the target's config.json and weights; give another directory")
    for d in data_dirs:
        if where == d.expanduser().resolve():
            raise ValueError(f"--out {out} is the data directory {d}; give another directory for the draft")
    if out.is_dir() and any(out.iterdir()) and not is_distill_output(out):
        raise ValueError(f"--out {out} is a directory that holds other files (no model_card.json of an earlier "
                         "distill run): give a new or empty directory, or the --out of an earlier distill run")
    status = finished_status(out) if not overwrite else None
    if status is not None:
        try:
            made_for = json.loads((out / "model_card.json").read_text()).get("target")
        except (OSError, ValueError, AttributeError):
            made_for = None
        raise ValueError(f"--out {out} holds a finished draft (status {status!r}" + (f", for {made_for}" if made_for
                         else "") + "): give --overwrite to replace it, or another --out")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"--out {out}: {existing} is not writable")
    _probe_write(out, existing)


def _probe_write(out: Path, existing: Path) -> None:
    """Make (and remove) the folder `write_output` writes the draft into, with a file in it, before any work: a
    file system where the permission bits say writable and writing fails (read-only mounts seen through some
    network or FUSE file systems, a full disk, quotas) is said now, not after the data and the training. Where
    --out's parent does not exist yet, in the nearest folder above it that does (`existing`)."""
    probe = (_partial(out) if out.parent.is_dir() else existing / _partial(out).name)
    try:
        probe.mkdir(exist_ok=True)
        (probe / "probe").write_bytes(b"\0")
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot write in {probe.parent} ({exc.strerror or exc}): give a folder this "
                         "process can write") from None
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def target_fingerprint(target_dir: Path) -> str:
    """A short name for a target's exact weights, cheap to take: a hash of its config.json and of each weight
    file's name, size and modification time (no weights are read). Another model under the same directory
    name, or the same one retrained in place, gets another; a copy made without keeping the times too."""
    from serving.models import weight_files

    h = hashlib.sha1((target_dir / "config.json").read_bytes())
    for f in weight_files(target_dir):
        st = f.stat()
        h.update(f"\0{f.name}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:10]


def data_prefix(target_dir: Path) -> str:
    """How the names of a target's cached data begin: its directory name and `target_fingerprint`, so data
    cached for one model is never read for another."""
    return f"{target_dir.name}-{target_fingerprint(target_dir)}"


def target_mismatch(meta: dict, target_dir: Path) -> tuple[str, str] | None:
    """(theirs, ours) where prepared data's meta.json (`meta`) says another target made it, else None. By the
    weights' content (`target_weights_fingerprint`, as model cards record it) where the data records it: a copy of
    the target (new modification times, another folder) is the same target, other weights another. Data made
    before that was recorded is compared by `target_fingerprint` (config.json and the weight files' names, sizes
    and times), the only fingerprint it has. The same weights under another config.json (`config_fingerprint`,
    where the data records it: another rope_theta or eos_token_id answers otherwise) are another target too."""
    from serving.models import config_fingerprint, weights_fingerprint

    theirs = meta.get("target_weights_fingerprint")
    if theirs is not None:
        ours = weights_fingerprint(target_dir)
        their_cfg = meta.get("target_config_fingerprint")
        if theirs == ours and their_cfg is not None:
            our_cfg = config_fingerprint(target_dir)
            if their_cfg != our_cfg:  # the weights are the same: the config.json is what differs
                return f"{theirs} with config.json {their_cfg}", f"{ours} with config.json {our_cfg}"
    else:
        theirs, ours = meta.get("target_fingerprint"), target_fingerprint(target_dir)
    return (str(theirs), str(ours)) if theirs is not None and theirs != ours else None


def foreign_data(flag: str, data_dir: Path, meta: dict, target_dir: Path, target_cfg: dict) -> str | None:
    """The one line refusing prepared data (`meta`, its meta.json) that another target made: the target it records
    is not this one (`target_mismatch`), or its hidden or vocabulary size is not this target's (what tells data
    that records no target apart). None when the data may be this target's."""
    made_by = meta.get("target") or "a target it does not name"
    mismatch = target_mismatch(meta, target_dir)
    if mismatch:
        theirs, ours = mismatch
        return (f"{flag} {data_dir} holds data another target made ({made_by}, fingerprint {theirs}); this target "
                f"is {target_dir} (fingerprint {ours}): give data this target made, or let distill make it "
                "(--generate-prompts N, --stdlib-code N)")
    for key in ("hidden_size", "vocab_size"):
        if meta.get(key) is not None and target_cfg.get(key) is not None and meta[key] != target_cfg[key]:
            return (f"{flag} {data_dir} holds data of a target with {key} {meta[key]} ({made_by}); this target "
                    f"{target_dir} has {key} {target_cfg[key]}: give data this target made, or let distill make "
                    "it (--generate-prompts N, --stdlib-code N)")
    return None


SETTING_FLAGS = {"generate_prompts": "--generate-prompts", "stdlib_prompts": "--stdlib-prompts",
                 "package_prompts": "--package-prompts", "seed": "--seed", "max_new_tokens": "--max-new-tokens",
                 "dtype": "--dtype", "feature_layers": "--data-feature-layers (or --feature-layers)",
                 "target_fingerprint": "target (fingerprint)",
                 "target_weights_fingerprint": "target (weights fingerprint)",
                 "target_config_fingerprint": "target (config.json fingerprint)"}


def data_settings(args, dtype: torch.dtype, data_layers, made_by: dict) -> dict:
    """What generated data is made with (`SETTING_FLAGS`): data made otherwise is other data, whatever its folder.
    The target as `made_by` (`target_meta`) records it."""
    return {"generate_prompts": args.generate_prompts or 0, "stdlib_prompts": args.stdlib_prompts or 0,
            "package_prompts": args.package_prompts or 0, "seed": args.seed, "max_new_tokens": args.max_new_tokens,
            "dtype": str(dtype).replace("torch.", ""), "feature_layers": list(data_layers or []),
            "target_fingerprint": made_by["target_fingerprint"],
            "target_weights_fingerprint": made_by["target_weights_fingerprint"],
            "target_config_fingerprint": made_by["target_config_fingerprint"]}


def _recorded_settings(d: Path) -> dict:
    """The settings a data folder records: its meta.json's "settings" (finished data) or settings.json (data being
    made, or cut short); for finished data from before either was written, what its meta.json says of them."""
    from serving.distill.data import META, read_meta

    if (d / META).is_file():
        meta = read_meta(d)
        if isinstance(meta.get("settings"), dict):
            return meta["settings"]
        older = {"max_new_tokens": meta.get("max_new_tokens"), "dtype": meta.get("compute_dtype"),
                 "feature_layers": meta.get("feature_layers") or [],
                 "target_fingerprint": meta.get("target_fingerprint")}
        return {k: v for k, v in older.items() if v is not None}
    from serving.distill.data import SETTINGS

    try:
        recorded = json.loads((d / SETTINGS).read_text())
    except (OSError, ValueError):  # none (cut short before this version wrote it): matched by prompt id only
        return {}
    return recorded if isinstance(recorded, dict) else {}


def data_settings_refusal(d: Path, want: dict) -> str | None:
    """The one line refusing --data-dir `d` whose data (finished or half made) was made with other settings than
    `want` (`data_settings`): reused, it would be trained on as this command's data, and the card would say so.
    None where every setting it records is this run's. The target is compared by its weights' content where the
    data records it (`target_mismatch`): a copy of the target made with new modification times is the same."""
    recorded = _recorded_settings(d)
    if recorded.get("target_weights_fingerprint") is not None:
        recorded = {k: v for k, v in recorded.items() if k != "target_fingerprint"}
    for name, was in recorded.items():
        if name in want and was != want[name]:
            def shown(v) -> str:
                return " ".join(map(str, v)) if isinstance(v, list) else str(v)

            flag = SETTING_FLAGS.get(name, name)
            return (f"--data-dir {d} holds data made with {flag} {shown(was) or 'none'}; this run has {flag} "
                    f"{shown(want[name]) or 'none'}: give another --data-dir, or the settings it was made with")
    return None


def target_meta(target_dir: Path) -> dict:
    """What prepared data (meta.json) records of the target that made it: where it was, `target_fingerprint` (what
    its cached data is named by) and its weights by content (`target_weights_fingerprint`, the name model cards
    give it) and its config.json by content (`target_config_fingerprint`), which tell whether data is another
    target's (`target_mismatch`)."""
    from serving.models import config_fingerprint, weights_fingerprint

    return {"target": str(target_dir.resolve()), "target_fingerprint": target_fingerprint(target_dir),
            "target_weights_fingerprint": weights_fingerprint(target_dir),
            "target_config_fingerprint": config_fingerprint(target_dir)}


# TrainConfig's fields that are distill options of the same name
CLI_TRAINING_OPTIONS = ("head_vocab", "layers", "feature_layers", "lr", "batch_tokens", "batch_pool", "unroll",
                        "detach_unroll", "freeze_head", "feat_noise", "w_hard", "w_feat", "seed", "dtype")
# the data options a checkpoint records beside its TrainConfig: a resume must train on the same data
DATA_OPTIONS = ("corpus", "generate_prompts", "stdlib_prompts", "package_prompts", "self_prompts", "stdlib_code",
                "max_new_tokens", "data_feature_layers")


def resume_record(args, target_dir: Path) -> dict:
    """`TrainConfig.extra` of a run: the target (where it is, and its fingerprint, which a resume must match)
    and the options that choose the data (`DATA_OPTIONS`; --max-new-tokens only where answers are generated)."""
    from serving.distill.train import BUDGET_GIVEN

    generating = any(getattr(args, n, 0) for n in ("generate_prompts", "stdlib_prompts", "package_prompts",
                                                   "self_prompts"))
    data = {n: getattr(args, n, None) for n in DATA_OPTIONS}
    data["corpus"] = [str(Path(c).expanduser().resolve()) for c in args.corpus]
    data["max_new_tokens"] = args.max_new_tokens if generating else None
    data["data_feature_layers"] = list(data["data_feature_layers"] or [])
    # the target and the --corpus data by content, which a resume compares (not the target's modification times,
    # target_fingerprint, nor the corpus's paths, which only checkpoints from before these were recorded are
    # compared by: train.SUPERSEDED): a copied or moved corpus of the same data resumes
    from serving.distill.data import data_fingerprint
    from serving.models import config_fingerprint, weights_fingerprint

    content = {"target_weights_fingerprint": weights_fingerprint(target_dir),
               "target_config_fingerprint": config_fingerprint(target_dir),
               "corpus_fingerprint": [data_fingerprint(Path(c).expanduser()) for c in args.corpus]}
    # the budget as given (cfg.minutes becomes the training minutes a --total-minutes budget leaves): what a resume
    # with another one changes (BUDGET_CHANGED); not compared on resume (train.RESUMABLE_CHANGES)
    given = {"steps": args.steps, "minutes": args.minutes, "total_minutes": getattr(args, "total_minutes", None)}
    return {"target": str(target_dir.resolve()), "target_fingerprint": target_fingerprint(target_dir), **data,
            **content, BUDGET_GIVEN: given}


def read_checkpoint(ckpt: Path) -> dict:
    """A distill checkpoint for --resume, memory-mapped (only what is asked of it is read). A file torch cannot
    read back (cut short, another file in its place) or that holds no distill checkpoint is one line naming it
    (UsageError)."""
    from app.errors import UsageError

    try:
        state = torch.load(ckpt, weights_only=False, mmap=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - torch.load's many ways to fail on a damaged file (zip, pickle, mmap)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"--resume: the checkpoint {ckpt} cannot be read ({first[:200]}): it is damaged or not a "
                         "distill checkpoint; drop --resume to start again (a new checkpoint replaces it)") from None
    if not isinstance(state, dict) or not {"draft", "step"} <= state.keys():
        raise UsageError(f"--resume: {ckpt} is not a distill checkpoint (no draft weights and step): drop --resume "
                         "to start again, or give the --checkpoint of the run to continue")
    return state


def first_changed(was, now) -> tuple:
    """The first pair of two lists of fingerprints (a checkpoint's --corpus, this run's) that differ."""
    pairs = [(w, n) for w, n in zip(was or [], now or [], strict=False) if w != n]
    return pairs[0] if pairs else (was, now)


def resume_refusal(ckpt: Path, saved: dict, name: str, was, now) -> str:
    """The one line refusing a --resume whose checkpoint was made for another target or with other options."""
    extra = saved.get("extra") or {}
    if name == "target_fingerprint":  # a checkpoint from before the target was recorded by content
        return (f"--resume: the checkpoint {ckpt} was made for another target ({extra.get('target')}, "
                f"fingerprint {was}; this target's is {now}; this older checkpoint knows its target by its files' "
                "modification times only, so a copied or touched target reads as another too): drop --resume to "
                "start again")
    if name == "target_weights_fingerprint":
        return (f"--resume: the checkpoint {ckpt} was made for another target ({extra.get('target')}, weights "
                f"fingerprint {was}; this target's weights are {now}): drop --resume to start again")
    if name == "target_config_fingerprint":
        return (f"--resume: the checkpoint {ckpt} was made for a target with these weights but another config.json "
                f"({extra.get('target')}, config fingerprint {was}; this target's config.json is {now}): resume "
                "with the config.json it was made with, or drop --resume to start again")
    if name == "corpus_fingerprint":
        changed = [c for c, w, n in zip(extra.get("corpus") or [], was or [], now or [], strict=False) if w != n]
        before, after = first_changed(was, now)
        return (f"--resume: the checkpoint {ckpt} was trained on --corpus data that has changed since: "
                f"{changed[0] if changed else 'the --corpus'} holds other data now (fingerprint was {before}, now "
                f"{after}): resume with the data it was trained on, or give --fresh in place of --resume to start "
                "again")

    def shown(v) -> str:
        return " ".join(map(str, v)) if isinstance(v, list | tuple) else str(v)

    if name not in CLI_TRAINING_OPTIONS + DATA_OPTIONS:  # a setting without an option (another version's default)
        return (f"--resume: the checkpoint {ckpt} was trained with {name} = {shown(was)}, this version of distill "
                f"trains with {shown(now)}: give --fresh in place of --resume to start again")
    flag = "--" + name.replace("_", "-")
    return (f"--resume: the checkpoint {ckpt} was made with {flag} {shown(was)}, this run has {flag} {shown(now)}: "
            "resume with the options it was made with, or give --fresh in place of --resume to start again")


def rerun_refusal(ckpt: Path, cfg) -> str | None:
    """The line refusing a run without --resume or --fresh whose checkpoint file holds an unfinished run's
    training (interrupted, or killed): starting from step 0 would replace it at the first save. None where
    nothing would be lost: a checkpoint of a finished run (its draft is in --out), none, or one unreadable."""
    from serving.distill.train import resume_mismatch

    try:
        state = torch.load(ckpt, weights_only=False, mmap=True, map_location="cpu")
    except Exception:  # noqa: BLE001 - damaged or not a checkpoint: nothing a rerun could continue from
        return None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) or state.get("finished"):
        return None
    step, saved = state["step"], state.get("config") or {}
    if step < 1:
        return None
    differs = resume_mismatch(saved, cfg)
    del state
    if differs:
        name, was, now = differs
        what = {"target_fingerprint": "target", "target_weights_fingerprint": "target (weights fingerprint)",
                "target_config_fingerprint": "target config.json (fingerprint)",
                "corpus_fingerprint": "--corpus content (fingerprint)"}.get(name, "--" + name.replace("_", "-"))
        if name == "corpus_fingerprint":
            was, now = first_changed(was, now)
        return (f"a checkpoint at step {step} of an unfinished run exists for this --out ({ckpt}), made with "
                f"another {what} ({was} there, {now} here), so --resume cannot continue it: add --fresh (or remove "
                "it) to start over, or give another --checkpoint")
    return (f"a checkpoint at step {step} exists for this command ({ckpt}): add --resume to continue from it, "
            "or --fresh (or remove it) to start over")


def _dtype_tag(dtype: torch.dtype) -> str:
    """Cache-name suffix of data made in `dtype` (float32 data keeps the names it always had)."""
    return "" if dtype == torch.float32 else "-" + str(dtype).replace("torch.", "")


def _layers_tag(layers: tuple[int, ...] | None) -> str:
    """Cache-name suffix of data that records several blocks' features (last-block data keeps its names)."""
    return "-f" + ".".join(map(str, layers)) if layers else ""


def eval_data(target_dir: Path, max_new_tokens: int, say, dtype: torch.dtype = torch.float32,
              feature_layers: tuple[int, ...] | None = None) -> Path:
    """The target's greedy answers to the builtin evaluation workloads (for measuring alpha only)."""
    from serving.distill.data import is_prepared, prepare

    d = distill_cache() / (f"{data_prefix(target_dir)}-eval-{'-'.join(EVAL_DOMAINS)}-{max_new_tokens}{_dtype_tag(dtype)}"
                 + _layers_tag(feature_layers))
    if not is_prepared(d):
        items = [{"id": p.id, "domain": p.domain, "messages": p.as_messages()} for p in evaluation_prompts()]
        say(f"evaluation data: the target's greedy answers to {len(items)} workload prompts -> {d}")
        prepare(target_dir, items, d, max_new_tokens=max_new_tokens, say=say, dtype=dtype,
                feature_layers=feature_layers, extra_meta={"corpus": "builtin evaluation workloads (never trained on)",
                                                           **target_meta(target_dir)})
    return d


def rerun_note(cfg, steps_trained: int) -> dict:
    """What rerunning a card's command gives (the card's "rerun"): with --steps the same steps on the same
    learning-rate schedule; with a time budget (--minutes, --total-minutes) as many steps as the machine trains
    in the time, on a schedule that follows the elapsed time, so the same options but not the same steps (and
    no --steps N gives that schedule back). A run resumed with another budget than it started with matches in
    options only: its first steps followed the old budget's schedule, which the command no longer says."""
    from serving.distill.train import BUDGET_CHANGED

    changed = cfg.extra.get(BUDGET_CHANGED)
    if changed:
        was = " ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in changed.items() if v is not None) or "its budget"
        return {"matches": "options", "steps_trained": steps_trained,
                "why": f"resumed from a checkpoint trained toward {was}: the steps before the resume followed that "
                       "budget's learning-rate schedule, so a rerun of this command (one budget from step 0) "
                       "matches this run in options, not in weights"}
    if cfg.steps is not None:
        return {"matches": "options and steps", "steps_trained": steps_trained,
                "why": f"--steps {cfg.steps}: a rerun trains the same {cfg.steps} steps on the same learning-rate "
                       "schedule"}
    return {"matches": "options", "steps_trained": steps_trained,
            "why": f"a time budget trains as many steps as the machine allows in the time ({steps_trained} here), "
                   "and its learning-rate schedule follows the elapsed time: a rerun of the command matches this "
                   "run in options, not in steps or weights, and no --steps N reproduces the schedule"}


def evaluation_prompts() -> list:
    """The builtin evaluation workloads' prompts (`eval_data` answers them)."""
    from serving.workloads import load_workload

    return [p for d in EVAL_DOMAINS for p in load_workload(d)]


def evaluation_cost_note(num_prompts: int, eval_tokens: int, max_new_tokens: int) -> str:
    """What the evaluation after training costs, in work (not time, which is not known before it runs), said where
    it is larger than the run's own answers: a quick trial was silent for minutes after its last step."""
    return (f"note: after training, alpha is measured on the target's greedy answers to {num_prompts} builtin "
            f"prompts of up to {eval_tokens} tokens each (--eval-max-new-tokens {eval_tokens}, more than "
            f"--max-new-tokens {max_new_tokens}): up to {num_prompts * eval_tokens:,} answer tokens, generated once "
            "for this target and cached, then drafted over token by token; --no-eval skips the evaluation, "
            "a lower --eval-max-new-tokens shortens it")


def evaluation_prompt_ids(tokenizer) -> set[tuple[int, ...]]:
    """The builtin evaluation prompts (those `eval_data` measures alpha on) as the target reads them: token ids
    in its chat format, as prepared data stores each sequence's prompt."""
    from serving.distill.data import encode_prompt

    return {tuple(encode_prompt(tokenizer, {"messages": p.as_messages()})) for p in evaluation_prompts()}


def evaluation_overlap(preps, evaluated: set[tuple[int, ...]]) -> int:
    """How many sequences of the prepared data `preps` have one of the `evaluated` prompts as their prompt."""
    return sum(tuple(p.tokens[s["offset"]: s["offset"] + s["num_prompt"]].tolist()) in evaluated
               for p in preps for s in p.seqs)


def resume_command(args) -> str:
    """The command that continues an interrupted run: its card's command (--no-eval included), with the options
    that say where its data and checkpoint are, --save-every as given, and --resume."""
    import os

    extra = []
    for name in ("checkpoint",):  # --data-dir is in the card's command already
        if getattr(args, name, None):
            extra += ["--" + name.replace("_", "-"), os.path.abspath(Path(getattr(args, name)).expanduser())]
    if getattr(args, "save_every", 3.0) != 3.0:
        extra += ["--save-every", f"{args.save_every:g}"]
    return command_line(args) + " " + shlex.join([*extra, "--resume"])


def interrupted_note(args, step: int, ckpt: Path, out: Path, run_minutes: float = 0.0) -> str:
    """What an interrupted training run says: the checkpoint step saved, and how to continue from it. `run_minutes`:
    the wall-clock the run took so far (the runs it continued included), which a --total-minutes budget bounds: where
    it leaves the command's --resume no time to train, the note says so and names a budget that does."""
    if not step:
        return ("interrupted before the first checkpoint: nothing to resume; the data is cached, so the same "
                "command starts training again without making it")
    note = (f"interrupted: checkpoint at step {step} saved to {ckpt} (the draft so far in {out}); continue with:\n"
            f"  {resume_command(args)}")
    total = getattr(args, "total_minutes", None)
    if total is not None and resume_budget_refusal(total, run_minutes, 0.0):
        note += (f"\nbut this run took {run_minutes:.1f} of its --total-minutes {total:g}, which leaves that command "
                 f"no time to train (it is refused): give it --total-minutes {smallest_resume_budget(run_minutes):g} "
                 "or more (plus its data and set-up), or --minutes in place of --total-minutes")
    return note


def _made_so_far(d: Path, items: list[dict]) -> str:
    """' (192 already made, 108 to go)' where an interrupted generation into `d` finished some of `items`."""
    from serving.distill.data import read_jsonl

    index = d / "sequences.jsonl"
    if not index.is_file():
        return ""
    try:
        made = len({r.get("id") for r in read_jsonl(index)} & {i["id"] for i in items})
    except (OSError, ValueError, AttributeError):
        return ""
    return f" ({made} already made, {len(items) - made} to go)" if made else ""


def _unprepared_corpus(c: Path) -> str:
    """Why --corpus `c` (a folder) is refused as not prepared: a generation stopped before its end (its answers
    so far in sequences.jsonl, no meta.json, which is written last) is said to be one, with how to finish it."""
    from serving.distill.data import META, read_jsonl

    if (c / "sequences.jsonl").is_file() and not (c / META).is_file():
        try:
            made = f"{len(read_jsonl(c / 'sequences.jsonl'))} answers made so far"
        except (OSError, ValueError):
            made = "answers made so far"
        return (f"corpus {c} is an unfinished generation ({made}, no {META}): rerun the command that generated it "
                "(the same --generate-prompts, --stdlib-prompts, --package-prompts or --self-prompts, and its "
                "--data-dir if it gave one), which goes on from the answers finished so far; then give the folder as "
                "--corpus")
    return (f"corpus {c} is not a prepared distillation data directory (make one with --generate-prompts N or "
            "--stdlib-code N)")


@contextmanager
def _note_interrupt(note: str):
    """Say `note` when Ctrl-C stops what runs inside (the command line then says 'interrupted')."""
    try:
        yield
    except KeyboardInterrupt:
        _say(note)
        raise


def run(args) -> int:
    from app.commands._common import model_option
    from app.errors import UsageError
    from serving.distill.data import check_prepared, is_prepared, load_prepared, read_meta, select_features
    from serving.distill.data import prepare as prepare_data
    from serving.distill.prompts import (
        interleave,
        make_prompts,
        package_prompts,
        package_versions,
        stdlib_code_items,
        stdlib_prompts,
    )
    from serving.distill.train import (
        BUDGET_CHANGED,
        BUDGET_GIVEN,
        TrainConfig,
        TrainingDiverged,
        TrainingInterrupted,
        new_draft,
        resume_mismatch,
        train,
    )
    from serving.eagle import EagleDraft, is_trained_status
    from serving.llama import load_causal_lm
    from serving.models import load_tokenizer, read_config, resolve_model

    def prepare(target_dir_: Path, items: list[dict], d: Path, **options) -> dict:
        """`prepare_data`, saying on Ctrl-C that the same command goes on from what was finished."""
        with _note_interrupt(f"interrupted while making the data in {d}: the same command goes on from the "
                             "answers finished so far"):
            return prepare_data(target_dir_, items, d, **options)

    torch.set_num_threads(args.threads)
    device = torch.device(getattr(args, "device", "cpu"))  # checked by the command (resolve_device)
    dtype = getattr(torch, args.dtype)  # bfloat16 | float32 (the CLI's choices)
    # data made on a GPU is cached apart: its kernels round differently, and sampled questions differ
    tag = _dtype_tag(dtype) + ("" if device.type == "cpu" else "-cuda")
    t_start = time.perf_counter()
    # a name or folder given: checked as bench and calibrate check theirs (a feature draft is named as one)
    target_dir = resolve_model(None, "target") if args.target is None else model_option("--target", args.target,
                                                                                         "target", draft_flag=None)
    out = Path(args.out).expanduser()
    recover_output(out)  # a previous draft folder a killed run left aside goes back first
    # --resume continues the run that wrote --out (the refusals below say when it cannot)
    check_out(out, target_dir, [Path(c) for c in args.corpus]
              + ([Path(args.data_dir)] if getattr(args, "data_dir", None) else []),
              overwrite=getattr(args, "overwrite", False) or args.resume)
    # ---- which target blocks the draft reads, and which the generated data records
    target_cfg = read_config(target_dir)  # not JSON, not an object: one line naming the file
    num_blocks = target_cfg.get("num_hidden_layers")
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
        raise UsageError(f"{target_dir / 'config.json'} has no num_hidden_layers (a whole number >= 1, got "
                         f"{num_blocks!r}): not the config of a causal LM distill can start a draft from")
    vocab = target_cfg.get("vocab_size")
    if isinstance(vocab, int) and args.head_vocab > vocab:
        raise UsageError(f"--head-vocab {args.head_vocab}: the target's vocabulary has {vocab} tokens; give at most "
                         f"{vocab}")
    draft_layers = tuple(getattr(args, "feature_layers", None) or ())
    data_layers = tuple(getattr(args, "data_feature_layers", None) or draft_layers) or None
    for layers, flag in ((draft_layers, "--feature-layers"), (data_layers or (), "--data-feature-layers")):
        if layers and layers[-1] >= num_blocks:
            raise UsageError(f"{flag} {list(layers)}: the target has blocks 0..{num_blocks - 1}")
    if data_layers and not set(draft_layers or (num_blocks - 1,)) <= set(data_layers):
        raise UsageError(f"--data-feature-layers {list(data_layers)} must include the blocks the draft reads "
                         f"({list(draft_layers or (num_blocks - 1,))})")
    if args.layers > num_blocks:
        raise UsageError(f"--layers {args.layers}: the draft starts from the target's last blocks, and it has "
                         f"{num_blocks}")
    corpora = [Path(c).expanduser() for c in args.corpus]
    for c in corpora:
        if not is_prepared(c):
            raise UsageError(_unprepared_corpus(c))
        refusal = foreign_data("--corpus", c, read_meta(c), target_dir, target_cfg)
        if refusal:
            raise UsageError(refusal)
        try:  # whole, with the features the draft reads: found now, not after the other sources' data is made
            check_prepared(c, draft_layers, num_blocks)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if getattr(args, "self_prompts", 0):
        from serving.distill.selfprompts import question_room

        try:  # a target too short for a question of its own: said before any data is made
            question_room(target_dir)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    # ---- what training will be, and the checkpoint a --resume continues (checked before any work)
    cfg = TrainConfig(head_vocab=args.head_vocab, layers=args.layers, lr=args.lr, batch_tokens=args.batch_tokens,
                      batch_pool=args.batch_pool,
                      unroll=args.unroll, detach_unroll=args.detach_unroll, freeze_head=args.freeze_head,
                      minutes=args.minutes, steps=args.steps,
                      seed=args.seed, save_every_s=args.save_every * 60, w_feat=args.w_feat, w_hard=args.w_hard,
                      feat_noise=args.feat_noise, dtype=args.dtype, feature_layers=draft_layers,
                      extra=resume_record(args, target_dir))
    ckpt = Path(args.checkpoint).expanduser() if args.checkpoint else \
        distill_cache() / "checkpoints" / (hashlib.sha1(str(out.resolve()).encode()).hexdigest()[:12] + ".pt")
    trained_s = 0.0  # what the resumed checkpoint trained
    # the wall-clock and data minutes of the runs the resumed checkpoint continues (their "run" record): summed
    # with this run's, as train_minutes sums the training of every run
    before = {"total_minutes": 0.0, "data_minutes": 0.0}
    trained_out = False  # whether it trained to the end of this run's budget
    # where --resume cannot continue the checkpoint: starting again, which an --out holding a finished draft
    # takes only with --overwrite (check_out)
    again = "drop --resume and give --fresh" + (" --overwrite" if finished_status(out) else "")
    if args.resume and ckpt.is_file():  # memory-mapped: only its config and "elapsed" are read here
        resumed = read_checkpoint(ckpt)
        saved = resumed.get("config") or {}
        differs = resume_mismatch(saved, cfg)
        if differs:
            raise UsageError(resume_refusal(ckpt, saved, *differs))
        at = resumed.get("step")
        if cfg.steps is not None and isinstance(at, int) and at > cfg.steps:  # it cannot train back to fewer
            raise UsageError(f"--resume: the checkpoint {ckpt} is already at step {at}, past --steps {cfg.steps}: "
                             f"give --steps {at} or more to continue it (the steps it trained cannot be undone), or "
                             f"{again} to start again from step 0")
        trained_s = float(resumed.get("elapsed", 0.0))
        # a run whose training finished and whose evaluation was interrupted: resumed with the budget it was given,
        # it goes straight to the evaluation (a --total-minutes budget would otherwise train its minutes again)
        trained_out = bool(resumed.get("finished")) and (
            (resumed.get("config") or {}).get("extra", {}).get(BUDGET_GIVEN) == cfg.extra[BUDGET_GIVEN])
        # as --steps: it cannot train back to fewer minutes (a finished run's last step passes its own --minutes)
        if args.minutes is not None and trained_s > args.minutes * 60 and not trained_out:
            raise UsageError(f"--resume: the checkpoint {ckpt} already trained {trained_s / 60:.2f} minutes, past "
                             f"--minutes {args.minutes:g}: give --minutes {math.ceil(trained_s / 60 * 100) / 100:g} "
                             f"or more to continue it (the minutes it trained cannot be undone), or {again} to start "
                             "again from step 0")
        run = resumed.get("run")
        for k in before:  # a checkpoint from before the record: its training at least (total >= train_minutes)
            v = run.get(k) if isinstance(run, dict) else None
            before[k] = float(v) if isinstance(v, int | float) and not isinstance(v, bool) else \
                (trained_s / 60 if k == "total_minutes" else 0.0)
        del resumed
        total = getattr(args, "total_minutes", None)
        refused = None if total is None or trained_out else \
            resume_budget_refusal(total, before["total_minutes"], trained_s / 60)
        if refused:  # before the data is made and the target loaded: the budget is spent whatever they take
            raise UsageError(refused)
        # a budget changed on resume: the steps trained so far followed the old one's learning-rate schedule
        # (kept through later resumes: the card's "rerun" must not promise the command reproduces the weights)
        saved_extra = saved.get("extra") or {}
        was = saved_extra.get(BUDGET_GIVEN)  # None: a checkpoint from before the budget was recorded as given
        changed = saved_extra.get(BUDGET_CHANGED) or (was if was is not None and was != cfg.extra[BUDGET_GIVEN]
                                                      else None)
        if changed:
            cfg.extra[BUDGET_CHANGED] = changed
    elif args.resume and (out / "model_card.json").is_file():
        try:
            status = str(json.loads((out / "model_card.json").read_text()).get("status", ""))
        except (ValueError, AttributeError):
            status = ""
        # the status without its parenthesis: that says what --resume does, which this refuses
        shown = status.split(" (", 1)[0]
        measure = shlex.join(["specfinops", "calibrate", "--draft", str(out),
                              *(["--target", args.target] if args.target is not None else [])])
        held = ("a finished draft (a finished run keeps no checkpoint)" if status == "trained"
                else f"a finished draft, not measured ({shown}): `{measure}` measures it"
                if is_trained_status(status) else "a draft" + (f" ({shown})" if shown else ""))
        raise UsageError(f"--resume: no checkpoint {ckpt} to resume for --out {out}, which holds {held}; starting "
                         "from scratch would replace it. Drop --resume (and give --overwrite) to train it again from "
                         "step 0, or give --out another folder")
    elif args.resume:
        _say(f"--resume: no checkpoint {ckpt} to resume for --out {out}; starting from scratch")
    elif ckpt.is_file() and not getattr(args, "fresh", False):
        refused = rerun_refusal(ckpt, cfg)  # before anything is made: the steps it trained would be lost
        if refused:
            raise UsageError(refused)
    # ---- what can fail in setting up fails now, not after the data is made: the target, its tokenizer, a draft
    # started from it
    target = load_causal_lm(target_dir, torch.float32)
    tok = load_tokenizer(target_dir)
    try:
        EagleDraft.init_from_target(target, torch.arange(args.head_vocab),
                                    num_layers=args.layers, feature_layers=draft_layers)
    except RuntimeError as exc:  # the target's blocks do not load into the draft's
        raise ValueError(f"cannot start a draft from target {target_dir}: {str(exc).strip().splitlines()[-1]}") from None
    if not args.no_eval:  # measured after training: a target too short for every evaluation prompt is said now
        positions = target.cfg.max_position
        shortest = min(map(len, evaluation_prompt_ids(tok)))
        if shortest >= positions:
            raise UsageError(f"none of the builtin evaluation prompts fits the target's context ({positions} "
                             f"positions, its {target.cfg.max_position_source}; the shortest is {shortest} tokens): "
                             "alpha cannot be measured on this target; add --no-eval")
        if getattr(args, "max_new_tokens", None) is not None and args.max_new_tokens < args.eval_max_new_tokens:
            # a quick trial: the evaluation, unannounced, outlasted it
            _say(evaluation_cost_note(len(evaluation_prompts()), args.eval_max_new_tokens, args.max_new_tokens))
    if any(getattr(args, n, 0) for n in ("generate_prompts", "stdlib_prompts", "package_prompts", "self_prompts",
                                         "stdlib_code")):
        target = None  # generating loads its own copy (in --dtype); this one is loaded again for training
    # ---- data (cached under the target's name and fingerprint; meta.json records which target made it)
    prefix, made_by = data_prefix(target_dir), target_meta(target_dir)
    settings = data_settings(args, dtype, data_layers, made_by)
    if getattr(args, "data_dir", None):
        given = Path(args.data_dir).expanduser()
        mismatch = target_mismatch(read_meta(given), target_dir) if is_prepared(given) else None
        if mismatch:
            raise UsageError(f"--data-dir {args.data_dir} holds data another target made (fingerprint {mismatch[0]}; "
                             f"this target's is {mismatch[1]}): give another --data-dir")
        generating = args.generate_prompts or args.stdlib_prompts or args.package_prompts  # what --data-dir holds
        refused = data_settings_refusal(given, settings) if generating and given.is_dir() else None
        if refused:
            raise UsageError(refused)
    data_t0 = time.perf_counter()
    described = [f"prepared data {c}" for c in corpora]
    packages = {}
    n_p = args.package_prompts or 0
    if args.generate_prompts or args.stdlib_prompts or n_p:
        n_t, n_s = args.generate_prompts or 0, args.stdlib_prompts or 0
        d = Path(args.data_dir).expanduser() if args.data_dir else \
            distill_cache() / (f"{prefix}-generated-t{n_t}-l{n_s}" + (f"-p{n_p}" if n_p else "")
                     + f"-s{args.seed}-n{args.max_new_tokens}{tag}{_layers_tag(data_layers)}")
        if n_p:
            packages = package_versions()
        if not is_prepared(d):
            prompts = interleave(interleave(make_prompts(n_t, seed=args.seed) if n_t else [],
                                            stdlib_prompts(n_s, seed=args.seed) if n_s else []),
                                 package_prompts(n_p, seed=args.seed) if n_p else [])
            _say(f"generating the target's greedy answers to {len(prompts)} prompts{_made_so_far(d, prompts)} -> {d}")
            prepare(target_dir, prompts, d, max_new_tokens=args.max_new_tokens, batch=args.gen_batch, say=_say,
                    dtype=dtype, feature_layers=data_layers, device=device,
                    extra_meta={"corpus": "templated prompts and standard-library code prompts "
                                          "(serving/distill/prompts.py), the target's greedy answers",
                                "settings": settings, **made_by})
        corpora.append(d)
        if n_t:
            described.append(f"the target's greedy answers (max {args.max_new_tokens} tokens) to {n_t} templated "
                             f"prompts (seed {args.seed})")
        if n_s:
            described.append(f"the target's greedy answers (max {args.max_new_tokens} tokens) to {n_s} code prompts "
                             "made from documented Python standard-library functions")
        if n_p:
            described.append(f"the target's greedy answers (max {args.max_new_tokens} tokens) to {n_p} code prompts "
                             "made from documented functions of installed packages (versions under 'packages')")
    if getattr(args, "self_prompts", 0):
        n_q = args.self_prompts
        d = distill_cache() / (f"{prefix}-self-q{n_q}-s{args.seed}-n{args.max_new_tokens}{tag}"
                     f"{_layers_tag(data_layers)}")
        if not is_prepared(d):
            from serving.distill.selfprompts import self_prompts

            _say(f"the target writes {n_q} code questions of its own (seed {args.seed})")
            asked = self_prompts(target_dir, n_q, seed=args.seed, dtype=dtype, batch=args.gen_batch, device=device)
            _say(f"generating the target's greedy answers to its {len(asked)} questions{_made_so_far(d, asked)} -> {d}")
            prepare(target_dir, asked, d, max_new_tokens=args.max_new_tokens, batch=args.gen_batch, say=_say,
                    dtype=dtype, feature_layers=data_layers, device=device,
                    extra_meta={"corpus": "code questions the target wrote itself "
                                          "(serving/distill/selfprompts.py), the target's greedy answers",
                                "questions": [q["prompt"] for q in asked], **made_by})
        corpora.append(d)
        described.append(f"the target's greedy answers (max {args.max_new_tokens} tokens) to {n_q} code questions "
                         f"it wrote itself (sampled, seed {args.seed}; the questions are in the data's meta.json)")
    if args.stdlib_code:
        d = distill_cache() / f"{prefix}-stdlib-code-{args.stdlib_code}-s{args.seed}{tag}{_layers_tag(data_layers)}"
        if not is_prepared(d):
            items = stdlib_code_items(args.stdlib_code, seed=args.seed)
            _say(f"teacher pass over {len(items)} standard-library functions -> {d}")
            prepare(target_dir, items, d, say=_say, dtype=dtype, feature_layers=data_layers, device=device,
                    extra_meta={"corpus": "Python standard library functions as chat answers (teacher-forced)", **made_by})
        corpora.append(d)
        described.append(f"{args.stdlib_code} Python standard-library functions shown as chat answers, "
                         "teacher-forced (the target's own distributions as labels)")
    if not corpora:
        raise UsageError("no training data: give --corpus DIR, --generate-prompts N, --stdlib-prompts N or "
                         "--stdlib-code N")
    data_minutes = (time.perf_counter() - data_t0) / 60
    try:
        preps = [select_features(load_prepared(c), draft_layers, num_blocks) for c in corpora]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    # held out or not: is any training sequence's prompt one of the prompts alpha is measured on (compared in
    # tokens, so data made by any means, --corpus included, is checked as it is, not as its description says)
    evaluated = evaluation_prompt_ids(tok)
    overlap = evaluation_overlap(preps, evaluated)
    if overlap:
        _say(f"warning: {overlap} training sequence(s) have one of the {len(evaluated)} evaluation prompts as their "
             "prompt: alpha measured on them is not held out (the model card says so)")
    # what making the data cost when it was made (this run may have reused it from the cache)
    data_made_minutes = sum(p.meta.get("generate_seconds", 0) + p.meta.get("teacher_seconds", 0) for p in preps) / 60
    # ---- model
    if target is None:
        target = load_causal_lm(target_dir, torch.float32)
    eos = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
    minutes, budget = args.minutes, None
    total = getattr(args, "total_minutes", None)
    if total is not None:
        spent = (time.perf_counter() - t_start) / 60
        trained = trained_s / 60
        earlier = before["total_minutes"]  # the runs a --resume continues: the budget bounds the whole run
        try:
            minutes = trained if trained_out else training_minutes(total, spent, args.minutes, trained,
                                                                   earlier_minutes=earlier)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        this_run = minutes - trained
        # the card's training.budget: runs_before_resume_minutes (the earlier runs' wall-clock) includes
        # trained_before_resume_minutes (their training): the two overlap
        budget = {"total_minutes": total, "spent_before_training_minutes": round(spent, 2),
                  "training_minutes": round(this_run, 2),
                  **({"trained_before_resume_minutes": round(trained, 2)} if trained else {}),
                  **({"runs_before_resume_minutes": round(earlier, 2)} if earlier else {})}
        _say(f"--total-minutes {total:g}: " + (f"the runs this --resume continues took {earlier:.1f} min, "
                                                if earlier else "") +
             f"data and set-up took {spent:.1f} min, training gets {this_run:.1f}")
    cfg.minutes = minutes
    draft, coverage = new_draft(target, preps, cfg, eos)
    card = {
        "model_type": "specfinops-eagle",
        "target": target_dir.name,
        "target_fingerprint": made_by["target_fingerprint"],
        # the target's weights by content, as a load checks them (serving.eagle.foreign_target_note): the name and
        # target_fingerprint above change with a copy of the same target, and stay for another in its place
        "target_weights_fingerprint": made_by["target_weights_fingerprint"],
        # and its config.json by content: the same weights under another config are another target
        "target_config_fingerprint": made_by["target_config_fingerprint"],
        "architecture": {"kind": "feature-level draft (EAGLE) with a reduced-vocabulary head (FR-Spec)"
                                 + (", fused features of several target blocks (EAGLE-3)" if draft_layers else ""),
                         "layers": cfg.layers, "hidden_size": draft.cfg.hidden_size, "head_vocab": cfg.head_vocab,
                         "feature_layers": list(draft_layers) or [num_blocks - 1],
                         "parameters": sum(p.numel() for p in draft.parameters()),
                         "init": "the target's last layer(s), final norm and head rows; fc = [0.1 I | I]",
                         "shares": "the target's token embedding (not stored)"},
        "corpus": {"sources": described, "data_dirs": [os.path.abspath(c) for c in corpora],  # as the command's
                   "sequences": sum(len(p.seqs) for p in preps),
                   "prompts": sum(p.meta.get("prompts", len(p.seqs)) for p in preps),
                   "tokens": sum(p.meta["num_tokens"] for p in preps),
                   "answer_tokens": sum(p.answer_tokens for p in preps),
                   "head_coverage_of_answer_tokens": coverage,
                   **({"packages": packages} if packages else {}),
                   "evaluation_prompts_excluded": not overlap,
                   "evaluation_prompts_check": (
                       f"{overlap} training sequence(s) have one of the {len(evaluated)} builtin evaluation prompts "
                       "as their prompt" if overlap else
                       f"no training sequence has one of the {len(evaluated)} builtin evaluation prompts as its "
                       "prompt") + " (compared token by token in the target's chat format)"},
        # feature_layers: the blocks the draft read (the option's () is the last one), as "architecture" says
        "training": {**{k: v for k, v in asdict(cfg).items() if k != "extra"},
                     "feature_layers": list(draft_layers) or [num_blocks - 1], **({"budget": budget} if budget else {}),
                     "device": str(device) if device.type == "cpu" else f"{device} ({torch.cuda.get_device_name(device)})"},
        "command": command_line(args),
    }

    def write_draft(d, extra: dict) -> None:
        """The draft folder as one set (`write_output`): weights, config, tokenizer and this card."""
        write_output(out, d, {"head_coverage": coverage.get("chosen")}, target_dir, {**card, **extra})

    def on_checkpoint(d, info) -> None:
        card["rerun"] = rerun_note(cfg, info["step"])
        status = (f"interrupted at step {info['step']} (Ctrl-C; the same command with --resume continues it)"
                  if info.get("interrupted") else "training (intermediate checkpoint)")
        write_draft(d, {"status": status,
                        "results": {"steps": info["step"], "train_minutes": round(info["elapsed"] / 60, 2),
                                    "curve": info["curve"][-50:]}})

    _say(f"draft: {cfg.layers} layer(s), head over {cfg.head_vocab} tokens (covers {coverage['chosen']:.1%} of "
         f"answer tokens); corpus {card['corpus']['tokens']} tokens in {card['corpus']['sequences']} sequences")
    target.to(device)  # the draft reads the target's token embedding (shared, not copied)
    draft.to(device)
    if getattr(args, "fresh", False) and ckpt.is_file():
        ckpt.unlink()  # --fresh: an unfinished run's checkpoint is not continued, nor resumed later by mistake
        _say(f"--fresh: removed the checkpoint {ckpt}; training starts from step 0")
    try:
        summary = train(draft, preps, cfg, checkpoint=ckpt, resume=args.resume, on_checkpoint=on_checkpoint,
                        say=_say, device=device, run_record=lambda: {
                            "total_minutes": before["total_minutes"] + (time.perf_counter() - t_start) / 60,
                            "data_minutes": before["data_minutes"] + data_minutes})
    except TrainingInterrupted as exc:
        _say(interrupted_note(args, exc.step, ckpt, out, before["total_minutes"] + (time.perf_counter() - t_start) / 60))
        raise
    except TrainingDiverged as exc:  # nothing is written as trained; an earlier checkpoint stays as it was
        raise UsageError(str(exc)) from None
    results: dict = {**summary, "data_minutes": round(before["data_minutes"] + data_minutes, 2),
                     "data_made_minutes": round(data_made_minutes, 2)}
    card["rerun"] = rerun_note(cfg, summary["steps"])
    write_draft(draft, {"status": "trained", "results": results})
    # ---- measure
    if not args.no_eval:  # on the CPU whatever --device was: the draft serves there
        del target
        try:
            _evaluate(args, out, target_dir, dtype, data_layers, draft_layers, num_blocks, results)
        except KeyboardInterrupt:  # the draft is whole; its card says what is missing and how to measure it
            write_card_only(out, {**card, "status": EVALUATION_INTERRUPTED, "results": results})
            _say(f"interrupted during the evaluation: the trained draft is in {out} (its card says the evaluation "
                 f"was interrupted); measure it with (training is not repeated):\n  {resume_command(args)}")
            raise
    results["total_minutes"] = round(before["total_minutes"] + (time.perf_counter() - t_start) / 60, 2)
    write_card_only(out, {**card, "status": "trained", "results": results})
    _say(f"wrote {out}")
    if not args.checkpoint:  # the default one, under the cache: the run is done, its draft is in --out
        ckpt.unlink(missing_ok=True)
        _say(f"removed this run's checkpoint {ckpt} (the run finished)")
    return 0


EVALUATION_INTERRUPTED = "trained; evaluation interrupted (the same command with --resume measures it)"


def _evaluate(args, out: Path, target_dir: Path, dtype, data_layers, draft_layers, num_blocks: int,
              results: dict) -> None:
    """alpha, agreement and c of the draft written to `out`, measured as the engine runs it (bf16, packed, int8
    where faster), added to `results`."""
    from serving.distill.data import load_prepared, select_features
    from serving.distill.train import measure_c, simulate_alpha, teacher_forced_agreement
    from serving.eagle import load_eagle
    from serving.int8 import quantize_draft
    from serving.kernels import pack_for_inference
    from serving.llama import load_causal_lm

    target16 = load_causal_lm(target_dir, torch.bfloat16)
    d16 = load_eagle(out, target16, torch.bfloat16)
    pack_for_inference(target16)  # alpha and c as the engine will see them
    pack_for_inference(d16)
    results["draft_int8_layers"] = quantize_draft(d16)  # where int8 measured faster here (serving/int8.py)
    ev = select_features(load_prepared(eval_data(target_dir, args.eval_max_new_tokens, _say, dtype, data_layers)),
                         draft_layers, num_blocks)
    alpha = simulate_alpha(d16, ev, k=args.k, progress=True)
    results["alpha"] = alpha
    results["alpha_method"] = (f"simulated greedy drafting, K={args.k}, bf16: step 1 reads the target's real "
                               "feature, later steps the draft's own; verified against the target's greedy "
                               f"({args.dtype}) answers (max {args.eval_max_new_tokens} tokens) to the builtin "
                               "workloads; alpha = accepted / tested (per-token), acceptance_rate = accepted / drafted")
    results["agreement"] = teacher_forced_agreement(d16, ev)
    results["agreement_method"] = ("every answer position fed the target's real feature; top: share of the "
                                   "target's greedy tokens in the draft's top-k; by_target_confidence: draft "
                                   "top-1 agreement by the target's own top-1 probability")
    results["cost"] = measure_c(d16, target16)
    _say("alpha " + ", ".join(f"{k} {'— (nothing drafted)' if v['alpha'] is None else format(v['alpha'], '.3f')}"
                              for k, v in alpha.items()) +
         f"; c {results['cost']['c']:.3f} ({results['cost']['draft_ms']} ms / {results['cost']['target_ms']} ms)")
