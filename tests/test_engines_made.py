"""telemetry.db.engines_made watches the SQLite engines made while its block runs. Its watch list removed a block's
watch with list.remove, which matches by equality, and two WeakSets holding the same engines are equal: a nested
block's exit removed the enclosing block's watch (engines made after it went unwatched, and the outer exit raised
`ValueError: list.remove(x): x not in list`), and one thread's exit could remove another thread's watch."""

from __future__ import annotations

import threading

from telemetry import db


def test_nested_blocks_each_remove_their_own_watch(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with db.engines_made() as outer:
        with db.engines_made() as inner:
            first = db.make_engine(url)
        assert first in outer and first in inner
        second = db.make_engine(url)  # after the inner block: still the outer one's
        assert second in outer and second not in inner
    assert all(w is not outer and w is not inner for w in db._WATCHES)
    first.dispose()
    second.dispose()


def test_a_thread_leaving_its_block_keeps_another_threads_watch(tmp_path):
    url = f"sqlite:///{tmp_path / 'b.db'}"
    both_in, b_in, a_left = threading.Barrier(2), threading.Event(), threading.Event()
    seen: dict[str, object] = {}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            if name == "a":  # b's watch listed first: list.remove matched it for a's
                assert b_in.wait(timeout=30)
            with db.engines_made() as made:
                b_in.set()
                seen[name + "-first"] = db.make_engine(url)
                both_in.wait(timeout=30)  # each watch now holds both engines: equal
                if name == "a":
                    return
                assert a_left.wait(timeout=30)
                later = db.make_engine(url)
                seen["b-later-watched"] = later in made
                later.dispose()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            if name == "a":
                a_left.set()

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert seen["b-later-watched"] is True
    for key in ("a-first", "b-first"):
        seen[key].dispose()
