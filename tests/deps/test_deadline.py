"""A restore ends at its deadline, whatever the store does, and leaves nothing behind:
a fetch that hangs is left to itself, and the extracting child's cleanup is not cut
short by the stop the deadline sends."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer import asuser
from bootseer.asuser import UserChild, UserChildError
from bootseer.deps import archive
from bootseer.deps.restore import RestoreRequest, restore
from bootseer.errors import StepError
from bootseer.store import Store
from tests.waiting import wait_until

from .conftest import USER_A, needs_root
from .test_steps import captured_elsewhere

pytestmark = pytest.mark.root


def temporaries(scratch: Path) -> list[str]:
    return [p.name for p in scratch.iterdir() if p.name.startswith(".env.bootseer-")]


def test_a_restore_ends_at_its_deadline_while_a_fetch_still_hangs(
    scratch: Path, store: Store
) -> None:
    """A fetch that never returns (a store that accepts and never answers) does not hold
    the restore: it fails at its deadline, the fetch left behind, nothing left on disk.
    The hook runner abandons a step at its deadline, but the step's own flow (the
    prefix lock, its phase rows) waits for restore() to return."""
    needs_root()
    m = captured_elsewhere(scratch, store)
    release = threading.Event()
    asked = threading.Event()

    def via(key: str, offset: int, length: int, sha: str) -> None:
        asked.set()
        release.wait()  # hangs until the test ends: no deadline of its own
        return None

    req = RestoreRequest(prefix=str(scratch / "env"), uid=USER_A, gid=USER_A, timeout=1.0)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            restore(store, m, req, via=via)
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        wait_until(asked.is_set, "the first frame asked for")
        wait_until(lambda: not t.is_alive(), "restore() returning while its fetch hangs")
        assert not release.is_set()
        assert len(failed) == 1 and isinstance(failed[0], StepError), failed
        assert "deadline" in str(failed[0])
        assert not (scratch / "env").exists()
        assert not temporaries(scratch)
    finally:
        release.set()


def test_the_stop_at_the_deadline_does_not_cut_the_cleanup_short(scratch: Path) -> None:
    """The stream ends (the restore gave up) and the deadline's SIGTERM arrives as the
    child begins to remove its temporary directory: the removal still completes.
    (Seen once in three runs of the test above before the stop was held.)"""

    def work(in_fd: int | None, _out: int | None) -> object:
        assert in_fd is not None
        real = shutil.rmtree

        def stopped_rmtree(path: str, ignore_errors: bool = False) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # the deadline's stop, as cleanup begins
            real(path, ignore_errors=ignore_errors)

        shutil.rmtree = stopped_rmtree  # type: ignore[assignment]  # in the child only
        return archive.extract_snapshot(
            in_fd, str(scratch / "env"), [], raw_bytes=0, link_roots=[], max_bytes=1, max_files=1
        )

    child = UserChild.start(os.getuid(), os.getgid(), work, feed=True)
    child.close_stdin()  # an empty stream: a broken archive, so the child cleans up
    with pytest.raises(UserChildError, match="stopped by signal"):
        child.result(timeout=30)
    assert not temporaries(scratch) and not (scratch / "env").exists()


def test_a_child_unwinding_on_its_own_is_not_stopped_at_the_deadline(
    scratch: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails at once; the child, told by the stream's end, cleans up slowly
    (a slow disk) past the restore's deadline. The deadline's stop is not sent into
    that cleanup (it cut it short, leaving the temporary directory: seen in a full run,
    where the frames ran out of time at the very moment the stop was due)."""
    needs_root()
    m = captured_elsewhere(scratch, store)
    real = asuser.stop_held

    @contextlib.contextmanager
    def slow_cleanup() -> Iterator[None]:
        time.sleep(3)  # the child's disk is slow: allowed in a unit test (runs in the child)
        with real():
            yield

    monkeypatch.setattr(archive, "stop_held", slow_cleanup)  # the forked child's copy

    def via(key: str, offset: int, length: int, sha: str) -> None:
        raise OSError("the store is down")

    req = RestoreRequest(prefix=str(scratch / "env"), uid=USER_A, gid=USER_A, timeout=1.0)
    with pytest.raises(StepError, match="the store is down"):
        restore(store, m, req, via=via)
    assert not (scratch / "env").exists()
    assert not temporaries(scratch)
