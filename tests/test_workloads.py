"""Workload files: builtins load, every malformed-line kind is refused with file:line, filters work."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from serving.workloads import (
    BUILTIN_DOMAINS,
    BUILTIN_WORKLOADS,
    DEFAULT_DOMAIN,
    Prompt,
    load_workload,
    workload_path,
)

GOOD_PROMPT = {"id": "x-001", "domain": "code", "prompt": "Write a function."}
GOOD_MESSAGES = {"id": "x-002", "domain": "chat",
                 "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}


def _write(tmp_path: Path, lines: list[str], name: str = "w.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("name", BUILTIN_DOMAINS)
def test_builtin_domain_loads(name):
    prompts = load_workload(name)
    assert len(prompts) >= 20
    assert {p.domain for p in prompts} == {name}
    assert all(p.id.startswith(f"{name}-") for p in prompts)
    assert all((p.prompt is None) != (p.messages is None) for p in prompts)
    assert workload_path(name).is_file()


def test_builtin_ids_unique_across_files():
    ids = [p.id for name in BUILTIN_DOMAINS for p in load_workload(name)]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("name", ["mixed", "all"])
def test_mixed_interleaves_round_robin(name):
    prompts = load_workload(name)
    counts = Counter(p.domain for p in prompts)
    assert set(counts) == set(BUILTIN_DOMAINS)
    assert all(n >= 20 for n in counts.values())
    assert [p.domain for p in prompts[:6]] == list(BUILTIN_DOMAINS) * 2
    assert [p.domain for p in load_workload(name, limit=3)] == list(BUILTIN_DOMAINS)


def test_builtins_include_multi_turn_and_code_to_modify():
    chat = load_workload("chat")
    assert any(p.messages is not None and len(p.messages) >= 3 for p in chat)
    assert sum("```" in (p.prompt or "") for p in load_workload("code")) >= 8


def test_good_lines_parse(tmp_path):
    path = _write(tmp_path, [json.dumps(GOOD_PROMPT), "", json.dumps(GOOD_MESSAGES)])
    a, b = load_workload(path)
    assert a == Prompt(id="x-001", domain="code", prompt="Write a function.", messages=None)
    assert b.prompt is None and b.messages[1] == {"role": "user", "content": "Hi"}
    assert a.as_messages() == [{"role": "user", "content": "Write a function."}]
    assert load_workload(str(path)) == [a, b]


def test_a_byte_order_mark_at_the_start_is_read_past_and_nowhere_else(tmp_path):
    """Editors on Windows save UTF-8 with a BOM; it is not part of the first JSON object. One later in the
    file is no BOM but text where JSON was expected, and is named where it is."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join([json.dumps(GOOD_PROMPT), json.dumps(GOOD_MESSAGES)]).encode())
    assert [p.id for p in load_workload(path)] == ["x-001", "x-002"]
    path.write_bytes("\n".join([json.dumps(GOOD_PROMPT), "\ufeff" + json.dumps(GOOD_MESSAGES)]).encode())
    with pytest.raises(ValueError, match="malformed JSON") as err:
        load_workload(path)
    assert f"{path}:2:" in str(err.value)


def test_limit_and_domain_filters(tmp_path):
    assert len(load_workload("code", limit=5)) == 5
    assert [p.id for p in load_workload("code", limit=2)] == ["code-001", "code-002"]
    rewrite = load_workload("mixed", domain="rewrite", limit=4)
    assert len(rewrite) == 4 and {p.domain for p in rewrite} == {"rewrite"}
    path = _write(tmp_path, [json.dumps(GOOD_PROMPT), json.dumps(GOOD_MESSAGES)])
    assert [p.id for p in load_workload(path, domain="chat")] == ["x-002"]
    with pytest.raises(ValueError, match="no prompts in domain 'nope'"):
        load_workload("code", domain="nope")
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="limit must be a positive integer"):
            load_workload("code", limit=bad)


def test_unknown_name_lists_builtins(tmp_path):
    with pytest.raises(ValueError) as err:
        load_workload("poetry")
    assert "unknown workload 'poetry'" in str(err.value)
    for name in BUILTIN_WORKLOADS:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="workload file not found"):
        workload_path(tmp_path / "missing.jsonl")


def test_empty_file_refused(tmp_path):
    path = _write(tmp_path, [""])
    with pytest.raises(ValueError, match="is empty"):
        load_workload(path)


_MSG_USER = {"role": "user", "content": "hi"}

MALFORMED = {
    "json": ('{"id": "a", "domain": "code", "prompt": "x"', "malformed JSON"),
    "not_object": ('["a", "b"]', "expected a JSON object"),
    # left out, an id and a domain have defaults (test_a_line_of_only_a_prompt_loads); given, they must be text
    "id_not_str": (json.dumps({"id": 3, "domain": "code", "prompt": "x"}), "'id' must be a non-empty string"),
    "id_null": (json.dumps({"id": None, "domain": "code", "prompt": "x"}), "'id' must be a non-empty string"),
    "empty_id": (json.dumps({"id": " ", "domain": "code", "prompt": "x"}), "'id'"),
    "empty_domain": (json.dumps({"id": "a", "domain": "", "prompt": "x"}), "'domain' must be a non-empty string"),
    "domain_not_str": (json.dumps({"id": "a", "domain": ["code"], "prompt": "x"}), "'domain'"),
    "neither": (json.dumps({"id": "a", "domain": "code"}), "found neither"),
    "both": (json.dumps({"id": "a", "domain": "code", "prompt": "x", "messages": [_MSG_USER]}), "found both"),
    "empty_prompt": (json.dumps({"id": "a", "domain": "code", "prompt": "  "}), "non-empty string"),
    "prompt_not_str": (json.dumps({"id": "a", "domain": "code", "prompt": 3}), "non-empty string"),
    "messages_not_list": (json.dumps({"id": "a", "domain": "chat", "messages": "hi"}), "non-empty list"),
    "messages_empty": (json.dumps({"id": "a", "domain": "chat", "messages": []}), "non-empty list"),
    "message_not_dict": (json.dumps({"id": "a", "domain": "chat", "messages": ["hi"]}), r"messages\[0\]"),
    "message_extra_key": (json.dumps({"id": "a", "domain": "chat",
                                      "messages": [{"role": "user", "content": "x", "name": "n"}]}),
                          r"messages\[0\] must be an object"),
    "bad_role": (json.dumps({"id": "a", "domain": "chat", "messages": [{"role": "bot", "content": "x"}]}),
                 "role 'bot'"),
    "content_not_str": (json.dumps({"id": "a", "domain": "chat", "messages": [{"role": "user", "content": 1}]}),
                        "content must be a non-empty string"),
    # recorded with each request: PostgreSQL refused these, and the bench dropped the requests' records
    "id_too_long": (json.dumps({"id": "i" * 129, "domain": "code", "prompt": "x"}),
                    r"'id' is 129 characters; the store keeps at most 128 \(requests.external_id\)"),
    "domain_too_long": (json.dumps({"id": "a", "domain": "d" * 65, "prompt": "x"}),
                        r"'domain' is 65 characters; the store keeps at most 64 \(requests.domain\)"),
    "nul_in_id": (json.dumps({"id": "a\u0000b", "domain": "code", "prompt": "x"}), "'id' holds a NUL character"),
    "ends_with_assistant": (json.dumps({"id": "a", "domain": "chat",
                                        "messages": [_MSG_USER, {"role": "assistant", "content": "yo"}]}),
                            "last message"),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_line_names_file_and_line(tmp_path, kind):
    line, problem = MALFORMED[kind]
    path = _write(tmp_path, [json.dumps(GOOD_PROMPT), line])
    with pytest.raises(ValueError, match=problem) as err:
        load_workload(path)
    assert f"{path}:2:" in str(err.value)


def test_the_longest_id_and_domain_the_store_keeps_load(tmp_path):
    path = _write(tmp_path, [json.dumps({"id": "i" * 128, "domain": "d" * 64, "prompt": "x"})])
    assert [(len(p.id), len(p.domain)) for p in load_workload(path)] == [(128, 64)]


def test_a_workload_path_the_store_cannot_record_is_refused():
    from serving.workloads import canonical_workload

    assert canonical_workload("all") == "mixed"
    with pytest.raises(ValueError, match=r"is 300 characters; the store records at most 255 \(runs.workload\)"):
        canonical_workload("/tmp/" + "w" * 295)


def test_duplicate_id_names_both_lines(tmp_path):
    path = _write(tmp_path, [json.dumps(GOOD_PROMPT), json.dumps(GOOD_MESSAGES), json.dumps(GOOD_PROMPT)])
    with pytest.raises(ValueError, match=r"duplicate id 'x-001' \(first on line 1\)") as err:
        load_workload(path)
    assert f"{path}:3:" in str(err.value)


def test_a_line_of_only_a_prompt_loads(tmp_path):
    """`{"prompt": "..."}` is a whole line: it was refused for its missing id, then its missing domain, a format
    said only in a docstring. The id defaults to the file's name and line (stable while the lines stay), the
    domain to 'custom'; a line that names them keeps its own."""
    path = tmp_path / "my1.jsonl"
    path.write_text("\n".join([json.dumps({"prompt": "Write a haiku."}), "",
                               json.dumps({"messages": [{"role": "user", "content": "Hi"}]}),
                               json.dumps(GOOD_PROMPT), json.dumps({"domain": "chat", "prompt": "Hello"})]) + "\n")
    prompts = load_workload(path)
    assert [(p.id, p.domain) for p in prompts] == [
        ("my1.jsonl:1", DEFAULT_DOMAIN), ("my1.jsonl:3", DEFAULT_DOMAIN), ("x-001", "code"), ("my1.jsonl:5", "chat")]
    assert DEFAULT_DOMAIN == "custom" and prompts[0].prompt == "Write a haiku."
    assert prompts[1].as_messages() == [{"role": "user", "content": "Hi"}]
    assert [p.id for p in load_workload(path, domain="custom")] == ["my1.jsonl:1", "my1.jsonl:3"]


def test_a_given_id_that_repeats_a_default_one_is_a_duplicate(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"id": "w.jsonl:1", "prompt": "b"}) + "\n")
    with pytest.raises(ValueError, match=r"w.jsonl:2: duplicate id 'w.jsonl:1' \(first on line 1\)"):
        load_workload(path)


def test_a_text_file_is_one_prompt_a_line(tmp_path):
    """A .txt workload was 'unknown workload': each non-blank line is now a prompt, with the same defaults."""
    path = tmp_path / "asks.txt"
    path.write_bytes(b"\xef\xbb\xbfWrite a haiku about tea.\r\n\n  \nSummarise {\"json\": \"as text\"}\n")
    prompts = load_workload(str(path))
    assert prompts == [Prompt(id="asks.txt:1", domain="custom", prompt="Write a haiku about tea.", messages=None),
                       Prompt(id="asks.txt:4", domain="custom", prompt='Summarise {"json": "as text"}', messages=None)]
    path.write_bytes(b"ok\n\xff\n")
    with pytest.raises(ValueError, match=r"asks.txt:2: not UTF-8 text .* a UTF-8 text file, one prompt a line"):
        load_workload(path)


def test_a_file_of_another_kind_is_told_what_a_workload_is(tmp_path):
    """A .csv (or any other) file said 'unknown workload', as a typo of a builtin name did, without the formats."""
    path = tmp_path / "asks.csv"
    path.write_text("prompt\nWrite a haiku.\n")
    with pytest.raises(ValueError) as err:
        load_workload(path)
    said = str(err.value)
    assert f"workload file '{path}' is neither .jsonl nor .txt" in said
    assert all(name in said for name in BUILTIN_WORKLOADS) and "one prompt a line" in said
    with pytest.raises(ValueError, match=r"unknown workload 'poetry': expected a builtin name \(code, .*\.txt file"):
        load_workload("poetry")
    (tmp_path / "d.txt").mkdir()
    with pytest.raises(ValueError, match="is a directory, not a .txt file"):
        load_workload(tmp_path / "d.txt")


def test_a_workload_file_is_recorded_by_its_absolute_path(tmp_path, monkeypatch):
    """Runs recorded the path as typed: the file benched as `../my2.jsonl` and as `my2.jsonl` was two workloads
    that never pooled, and `cost --workload` matched only the spelling bench was given."""
    from serving.workloads import canonical_workload

    (tmp_path / "sub").mkdir()
    (tmp_path / "my2.jsonl").write_text(json.dumps({"prompt": "x"}) + "\n")
    want = str((tmp_path / "my2.jsonl").resolve())
    monkeypatch.chdir(tmp_path / "sub")
    monkeypatch.setenv("HOME", str(tmp_path))
    for spelling in ("../my2.jsonl", "./../my2.jsonl", str(tmp_path / "my2.jsonl"), "~/my2.jsonl",
                     "../sub/../my2.jsonl"):
        assert canonical_workload(spelling) == want, spelling
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "my2.jsonl")
    assert canonical_workload("../link.jsonl") == want  # links resolved, as a model directory's path is
    assert canonical_workload("../asks.txt") == str((tmp_path / "asks.txt").resolve())
    for name in ("code", "chat", "rewrite", "mixed"):
        assert canonical_workload(name) == name


def test_the_workload_filter_takes_any_path_of_a_file(tmp_path, monkeypatch):
    from telemetry.queries import workload_is, workload_names

    monkeypatch.chdir(tmp_path)
    absolute = str(tmp_path.resolve() / "my2.jsonl")
    for spelling in ("my2.jsonl", "./my2.jsonl", absolute):
        assert workload_is(absolute, spelling), spelling
    assert workload_is("my2.jsonl", "my2.jsonl")  # a run recorded before: by the path as it was typed
    assert not workload_is("../my2.jsonl", "my2.jsonl") and not workload_is(absolute, "other.jsonl")
    assert workload_names("code") == ("code",) and workload_names("all") == ("mixed", "all")
    # a home that cannot be found is not a crash (RuntimeError: Could not determine home directory): as typed
    assert workload_names("~nosuchuser-xyz/p.jsonl") == ("~nosuchuser-xyz/p.jsonl",)


def test_a_workload_file_is_labelled_by_its_name():
    """The pages, the report and `cost` / `invocations` tables show a recorded absolute path by its file name."""
    from telemetry.labels import short_workload

    assert short_workload("/home/me/projects/prompts/my2.jsonl") == "my2.jsonl"
    assert [short_workload(w) for w in ("code", "mixed", "my2.jsonl", None)] == ["code", "mixed", "my2.jsonl", None]
