"""Prompt workloads: JSONL files, one prompt per line (or plain text files, one prompt per line).

Each line of a ``.jsonl`` file is a JSON object with exactly one of ``"prompt"`` (a plain user prompt) and
``"messages": [{"role", "content"}, ...]`` (a conversation; the model answers the last turn), and optionally
``"id"`` (default: the file's name and the line number, ``prompts.jsonl:3``) and ``"domain"`` (default:
``custom``); ``{"prompt": "Write a haiku about tea."}`` is a whole line. Each non-blank line of a ``.txt`` file is
one prompt, with those defaults. FILE_FORMAT says the same for the commands' --help. Builtin workloads ship as
package data next to this module: one file per domain (``code``, ``chat``, ``rewrite``) plus ``mixed`` (alias
``all``), which interleaves every builtin domain round-robin.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

__all__ = [
    "BUILTIN_DOMAINS",
    "BUILTIN_WORKLOADS",
    "DEFAULT_DOMAIN",
    "FILE_FORMAT",
    "FILE_SUFFIXES",
    "MIXED_NAMES",
    "Prompt",
    "canonical_workload",
    "load_workload",
    "workload_path",
]

_DIR = Path(__file__).resolve().parent
BUILTIN_DOMAINS: tuple[str, ...] = ("code", "chat", "rewrite")
MIXED_NAMES: tuple[str, ...] = ("mixed", "all")
BUILTIN_WORKLOADS: tuple[str, ...] = BUILTIN_DOMAINS + MIXED_NAMES
ROLES: frozenset[str] = frozenset({"system", "user", "assistant"})
FILE_SUFFIXES: tuple[str, ...] = (".jsonl", ".txt")  # a JSON object a line, or a prompt a line
DEFAULT_DOMAIN = "custom"  # the domain of a prompt whose line names none (and of every line of a .txt file)
# A workload file's format in the words of the --help of every command that reads one (bench, calibrate, loadtest)
FILE_FORMAT = f"""workload files (--workload PATH):
  PATH.jsonl  one JSON object a line: exactly one of "prompt" (a user prompt) or "messages" (a conversation,
              [{{"role": "system"|"user"|"assistant", "content": "..."}}, ...], the model answers the last turn),
              and optionally "id" (default: the file's name and line, prompts.jsonl:3) and "domain"
              (default: {DEFAULT_DOMAIN}), e.g.
                {{"prompt": "Write a haiku about tea."}}
                {{"id": "sum-1", "domain": "rewrite", "messages": [{{"role": "user", "content": "Shorten: ..."}}]}}
  PATH.txt    one prompt a line (blank lines skipped), ids and domain as above
  A file is recorded by its absolute path: any spelling of it (prompts.jsonl, ./prompts.jsonl, its absolute path)
  selects its runs in cost, project, export and report --workload.
"""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One workload item: exactly one of ``prompt`` and ``messages`` is set."""

    id: str
    domain: str
    prompt: str | None
    messages: tuple[dict, ...] | None

    def as_messages(self) -> list[dict]:
        """The prompt as chat messages (a plain prompt becomes one user turn)."""
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.prompt}]


def canonical_workload(name: str) -> str:
    """The name a workload is recorded under: 'mixed' for either of MIXED_NAMES ('all' is the same prompts, so
    its runs pool and pair with 'mixed' ones), a workload file by its absolute path (telemetry.queries.workload_file:
    the file benched as `../my.jsonl` from one folder and as `my.jsonl` from another was two workloads that
    never pooled or paired, and `cost --workload my.jsonl` found neither), any other name as given. ValueError
    where the store could not record it (runs.workload): PostgreSQL refused a longer path only when the first run
    was recorded."""
    from telemetry.db import Run
    from telemetry.queries import workload_file

    if name in MIXED_NAMES:
        return MIXED_NAMES[0]
    recorded = workload_file(name) if Path(name).suffix in FILE_SUFFIXES else name
    limit = Run.__table__.c.workload.type.length
    if len(recorded) > limit:
        raise ValueError(f"workload {recorded[:40]!r}... is {len(recorded)} characters; the store records at most "
                         f"{limit} (runs.workload): move the file to a folder with a shorter path")
    return recorded


def workload_path(name_or_path: str | Path) -> Path:
    """The JSONL file of a builtin domain workload (``code``, ``chat``, ``rewrite``) or an existing workload file
    (a .jsonl or .txt path).

    ``mixed``/``all`` have no single file; use :func:`load_workload` for them.
    """
    name = str(name_or_path)
    if name in BUILTIN_DOMAINS:
        return _DIR / f"{name}.jsonl"
    if name in MIXED_NAMES:
        raise ValueError(f"workload {name!r} combines the builtin domains and has no single file; "
                         "use load_workload()")
    path = Path(name).expanduser()
    if path.suffix in FILE_SUFFIXES and path.is_file():
        return path
    if path.suffix in FILE_SUFFIXES:
        raise ValueError(f"workload {path} is a directory, not a {path.suffix} file" if path.is_dir()
                         else f"workload file not found: {path}")
    accepted = (f"a builtin name ({', '.join(BUILTIN_WORKLOADS)}), a .jsonl file (one JSON object a line, "
                "{\"prompt\": \"...\"}) or a .txt file (one prompt a line)")
    if path.is_file():
        raise ValueError(f"workload file {name!r} is neither .jsonl nor .txt: a workload is {accepted}")
    raise ValueError(f"unknown workload {name!r}: expected {accepted}")


def load_workload(name_or_path: str | Path, limit: int | None = None,
                  domain: str | None = None) -> list[Prompt]:
    """Load and validate a workload; optionally keep only ``domain`` and then the first ``limit`` prompts.

    Any malformed line raises ValueError naming ``file:line`` and the problem.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    if str(name_or_path) in MIXED_NAMES:
        per_domain = [_parse_file(workload_path(d)) for d in BUILTIN_DOMAINS]
        prompts = [p for group in zip_longest(*per_domain) for p in group if p is not None]
    else:
        prompts = _parse_file(workload_path(name_or_path))
    if domain is not None:
        prompts = [p for p in prompts if p.domain == domain]
        if not prompts:
            raise ValueError(f"workload {str(name_or_path)!r} has no prompts in domain {domain!r}")
    if not prompts:
        raise ValueError(f"workload {str(name_or_path)!r} is empty")
    return prompts[:limit] if limit is not None else prompts


def _parse_file(path: Path) -> list[Prompt]:
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    text = path.suffix == ".txt"
    form = "text file, one prompt" if text else "JSONL file, one JSON object"
    with path.open("rb") as fh:  # decoded line by line, so text that is not UTF-8 is named where it is
        for lineno, raw in enumerate(fh, 1):
            where = f"{path}:{lineno}"
            try:
                # a BOM that editors on Windows write at the start is not part of the first object
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                                 f"a workload is a UTF-8 {form} a line") from None
            if not line.strip():
                continue
            default_id = f"{path.name[:100]}:{lineno}"  # stable while the file keeps its lines; fits requests' 128
            item = (Prompt(id=default_id, domain=DEFAULT_DOMAIN, prompt=line.rstrip("\r\n"), messages=None) if text
                    else _parse_line(line, where, default_id))
            if item.id in seen:
                raise ValueError(f"{where}: duplicate id {item.id!r} (first on line {seen[item.id]})")
            seen[item.id] = lineno
            prompts.append(item)
    return prompts


def _parse_line(line: str, where: str, default_id: str) -> Prompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: malformed JSON: {exc.msg} (column {exc.colno}); a .jsonl line is one JSON "
                         "object, such as {\"prompt\": \"...\"} (a .txt file takes one plain prompt a line)") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, such as {{\"prompt\": \"...\"}}, "
                         f"got {type(obj).__name__}")
    # a line without an id is named by where it is; without a domain it is DEFAULT_DOMAIN's
    names = {"id": obj.get("id", default_id), "domain": obj.get("domain", DEFAULT_DOMAIN)}
    for key, column in (("id", "external_id"), ("domain", "domain")):
        value = names[key]
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{where}: {key!r} must be a non-empty string (or left out: default "
                             f"{'the file name and line' if key == 'id' else repr(DEFAULT_DOMAIN)}), got {value!r}")
        # recorded with every request: PostgreSQL refuses a longer one or a NUL (SQLite kept them), and the
        # recorder could then only drop the request's record, after the model had run it
        limit = _stored_length(column)
        if len(value) > limit:
            raise ValueError(f"{where}: {key!r} is {len(value)} characters; the store keeps at most {limit} "
                             f"(requests.{column}): {value[:20]!r}...")
        if "\x00" in value:
            raise ValueError(f"{where}: {key!r} holds a NUL character (\\u0000), which the store cannot keep")
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        which = "both" if has_prompt else "neither"
        raise ValueError(f"{where}: needs exactly one of 'prompt' and 'messages', found {which}")
    if has_prompt:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
        return Prompt(id=names["id"], domain=names["domain"], prompt=prompt, messages=None)
    return Prompt(id=names["id"], domain=names["domain"], prompt=None,
                  messages=_parse_messages(obj["messages"], where))


def _stored_length(column: str) -> int:
    """The length of the requests column that records a prompt's id or domain (telemetry.db)."""
    from telemetry.db import Request

    return Request.__table__.c[column].type.length


def _parse_messages(messages: object, where: str) -> tuple[dict, ...]:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or set(msg) != {"role", "content"}:
            raise ValueError(f"{where}: messages[{i}] must be an object with exactly 'role' and 'content'")
        if msg["role"] not in ROLES:
            raise ValueError(f"{where}: messages[{i}] has role {msg['role']!r}; "
                             f"expected one of {', '.join(sorted(ROLES))}")
        if not isinstance(msg["content"], str) or not msg["content"].strip():
            raise ValueError(f"{where}: messages[{i}] content must be a non-empty string")
        out.append({"role": msg["role"], "content": msg["content"]})
    if out[-1]["role"] == "assistant":
        raise ValueError(f"{where}: the last message must not be from the assistant (nothing to answer)")
    return tuple(out)
