"""Prompt workloads: JSONL files, one prompt per line.

Each line is a JSON object, either ``{"id", "domain", "prompt"}`` (a plain user prompt) or
``{"id", "domain", "messages": [{"role", "content"}, ...]}`` (a conversation; the model answers the
last turn). Builtin workloads ship as package data next to this module: one file per domain
(``code``, ``chat``, ``rewrite``) plus ``mixed`` (alias ``all``), which interleaves every builtin
domain round-robin.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

__all__ = [
    "BUILTIN_DOMAINS",
    "BUILTIN_WORKLOADS",
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
    its runs pool and pair with 'mixed' ones), any other name or path as given. ValueError where the store could not
    record it (runs.workload): PostgreSQL refused a longer path only when the first run was recorded."""
    from telemetry.db import Run

    limit = Run.__table__.c.workload.type.length
    if len(name) > limit:
        raise ValueError(f"workload {name[:40]!r}... is {len(name)} characters; the store records at most {limit} "
                         "(runs.workload): give a shorter path (a relative one, or a link to the file)")
    return MIXED_NAMES[0] if name in MIXED_NAMES else name


def workload_path(name_or_path: str | Path) -> Path:
    """The JSONL file of a builtin domain workload (``code``, ``chat``, ``rewrite``) or an existing path.

    ``mixed``/``all`` have no single file; use :func:`load_workload` for them.
    """
    name = str(name_or_path)
    if name in BUILTIN_DOMAINS:
        return _DIR / f"{name}.jsonl"
    if name in MIXED_NAMES:
        raise ValueError(f"workload {name!r} combines the builtin domains and has no single file; "
                         "use load_workload()")
    path = Path(name).expanduser()
    if path.suffix == ".jsonl" and path.is_file():
        return path
    if path.suffix == ".jsonl":
        raise ValueError(f"workload {path} is a directory, not a .jsonl file" if path.is_dir()
                         else f"workload file not found: {path}")
    raise ValueError(f"unknown workload {name!r}: expected one of {', '.join(BUILTIN_WORKLOADS)} "
                     "or a path to a .jsonl file")


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
    with path.open("rb") as fh:  # decoded line by line, so text that is not UTF-8 is named where it is
        for lineno, raw in enumerate(fh, 1):
            where = f"{path}:{lineno}"
            try:
                # a BOM that editors on Windows write at the start is not part of the first object
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                                 "a workload is a UTF-8 JSONL file, one JSON object a line") from None
            if not line.strip():
                continue
            item = _parse_line(line, where)
            if item.id in seen:
                raise ValueError(f"{where}: duplicate id {item.id!r} (first on line {seen[item.id]})")
            seen[item.id] = lineno
            prompts.append(item)
    return prompts


def _parse_line(line: str, where: str) -> Prompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: malformed JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key, column in (("id", "external_id"), ("domain", "domain")):
        value = obj.get(key)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{where}: missing or empty {key!r} (a non-empty string)")
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
        return Prompt(id=obj["id"], domain=obj["domain"], prompt=prompt, messages=None)
    return Prompt(id=obj["id"], domain=obj["domain"], prompt=None,
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
