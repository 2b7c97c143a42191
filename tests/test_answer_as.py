"""``unix_users.answer_as`` is the one way tunehub asks a question with a person's rights (fork,
become them, answer over a pipe, reap). Every outcome must come back as what it is: the
answer, the error the child raised (by class, for callers that tell a refused code from a
failed copy), a child that died without a word, and a drop that did not hold, so the question is
never answered with root's rights."""

from __future__ import annotations

import os

from tunehub_base.unix_users import answer_as, become

NOBODY = 65534


def test_the_answer_is_computed_as_the_person() -> None:
    answer = answer_as(lambda: become(NOBODY, NOBODY, [NOBODY], "nobody"),
                       lambda: str(os.geteuid()).encode())
    assert answer.ok and answer.data == str(NOBODY).encode()


def test_an_error_comes_back_with_its_class_and_text() -> None:
    def work() -> bytes:
        raise FileNotFoundError(2, "No such file or directory", "/nowhere/x")

    answer = answer_as(lambda: None, work)
    assert answer.error == "FileNotFoundError"
    assert answer.data == b"No such file or directory: /nowhere/x"


def test_a_failed_drop_never_runs_the_work() -> None:
    def drop() -> None:
        raise PermissionError("could not drop privileges to someone")

    answer = answer_as(drop, lambda: b"root's answer")
    assert not answer.ok and answer.error == "PermissionError"
    assert b"root's answer" not in answer.data


def test_a_child_that_dies_without_a_word_is_an_error() -> None:
    answer = answer_as(lambda: None, lambda: os._exit(3))
    assert answer.error == "ChildDied" and b"status 3" in answer.data


def test_the_drop_is_checked_to_hold() -> None:
    answer = answer_as(lambda: become(NOBODY, NOBODY, [0], "nobody"), lambda: b"as root")
    assert answer.error == "PermissionError" and b"could not drop" in answer.data
