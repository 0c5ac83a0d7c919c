"""bootseer.errors.describe: an error message never loses its cause's."""

from __future__ import annotations

import concurrent.futures as cf
import queue

import pytest

from bootseer.errors import StepError, describe


def test_a_message_is_kept_as_it_is() -> None:
    assert describe(StepError("no image at /x")) == "no image at /x"
    assert describe(OSError(13, "Permission denied", "/x")) == "[Errno 13] Permission denied: '/x'"
    assert describe(ValueError("bad"), named=True) == "ValueError: bad"


def test_a_timeout_without_a_message_says_it_timed_out_and_after_how_long() -> None:
    fut: cf.Future[bytes] = cf.Future()
    with pytest.raises(TimeoutError) as got:
        fut.result(timeout=0.01)
    assert str(got.value) == ""  # what the agent's peer service once passed on as is
    assert describe(got.value) == "timed out (TimeoutError)"
    assert describe(got.value, after=60.0) == "timed out after 60 s (TimeoutError)"
    assert describe(got.value, after=0.25) == "timed out after 0.2 s (TimeoutError)"
    assert describe(got.value, named=True) == "timed out (TimeoutError)"


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (ConnectionResetError(), "connection lost (ConnectionResetError)"),
        (EOFError(), "ended early (EOFError)"),
        (KeyboardInterrupt(), "interrupted (KeyboardInterrupt)"),
        (AssertionError(), "an internal check failed (AssertionError)"),
        (queue.Empty(), "Empty, without a message"),
        (OSError(), "OSError, without a message"),
    ],
)
def test_an_exception_without_a_message_is_named_and_explained(
    exc: BaseException, said: str
) -> None:
    assert describe(exc) == said
    assert describe(exc, after=5) == said  # only a timeout has an "after"
