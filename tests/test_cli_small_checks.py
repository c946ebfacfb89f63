"""Small CLI checks with no model: an output path's check leaves nothing behind, an option is named in full
everywhere, and which logprobs values the server takes as asking for none."""

from __future__ import annotations

import pytest

from app.cli import build_parser
from app.commands._common import check_writable
from app.errors import UsageError


def test_checking_an_output_path_leaves_no_folder_behind(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_writable("a/b/out.json", "--json")  # made to be tried, then removed
    assert list(tmp_path.iterdir()) == []
    check_writable("x/../y/out.json", "--json")  # through "..": x was made too, and removed
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UsageError, match="cannot make its directory"):  # a failed mkdir keeps nothing it made
        check_writable(f"n1/{'x' * 300}/out.json", "--json")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "keep").mkdir()
    check_writable("keep/new/out.json", "--json")
    assert [p.name for p in tmp_path.iterdir()] == ["keep"] and list((tmp_path / "keep").iterdir()) == []


@pytest.mark.parametrize("argv", [["--verb", "cost"], ["models", "path", "--ro", "draft"],
                                  ["project", "--run", "3"], ["db", "upgrade", "--d", "x.db"]])
def test_an_option_is_named_in_full_in_every_parser(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2


@pytest.mark.parametrize(("value", "chat_ok", "completion_ok"), [
    (None, True, True), (False, True, True), (0, True, False), (True, False, False), (1, False, False),
    (-1, False, False), (2, False, False),
])
def test_logprobs_values_that_ask_for_none(value, chat_ok, completion_ok):
    """Chat's logprobs is a boolean (0 is false); a completion's is a count: 0 asks for the chosen tokens'."""
    from serving.server_schemas import APIError, ChatRequest, CompletionRequest, _unsupported

    for cls, body, ok in ((ChatRequest, {"messages": [{"role": "user", "content": "hi"}]}, chat_ok),
                          (CompletionRequest, {"prompt": "hi"}, completion_ok)):
        req = cls(model="m", logprobs=value, **body)
        if ok:
            _unsupported(req)
        else:
            with pytest.raises(APIError, match="logprobs is not supported"):
                _unsupported(req)
