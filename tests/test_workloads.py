"""Workload files: builtins load, every malformed-line kind is refused with file:line, filters work."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from serving.workloads import (
    BUILTIN_DOMAINS,
    BUILTIN_WORKLOADS,
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
    "missing_id": (json.dumps({"domain": "code", "prompt": "x"}), "'id'"),
    "empty_id": (json.dumps({"id": " ", "domain": "code", "prompt": "x"}), "'id'"),
    "missing_domain": (json.dumps({"id": "a", "prompt": "x"}), "'domain'"),
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
