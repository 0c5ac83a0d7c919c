"""Do a piece of work with the job user's rights, not root's.

The prolog and epilog run as root, but everything they do inside a user's files
(hashing key files, reading the prefix for a capture, extracting a snapshot) must be
limited to what that user may do: a user naming ``/etc/shadow`` as a key file, or
swapping a directory in the prefix for a symlink to ``/root``, must learn and reach
nothing. Rather than re-implement the kernel's permission checks, the work runs in a
forked child that has dropped to the user's uid, gid and groups; the kernel then
refuses what the user may not do.

The child is forked, not exec'd: the job user may not be able to run bootseer's
interpreter (it may live under a directory only root can enter), and a fork needs no
second start-up. The child touches no lock another thread could hold (no logging, no
buffered stdio, no new imports: callers import what the work needs first) and leaves
with ``os._exit``. It outlives no parent: when the process that forked it dies (a prolog
killed at Slurm's ``PrologEpilogTimeout``), the kernel stops it as :meth:`terminate`
does (``PR_SET_PDEATHSIG``), and it unwinds, removing what it was writing, rather than
go on alone (an orphaned restore went on extracting into its temporary directory).

    >>> child = UserChild.start(os.getuid(), os.getgid(), lambda i, o: 6 * 7)
    >>> child.result(timeout=10)
    42
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from bootseer import jsonlimits
from bootseer.errors import BootseerError, describe

Work = Callable[[int | None, int | None], Any]
MAX_RESULT = 256 << 20  # a file list of a million entries fits
PR_SET_PDEATHSIG = 1  # prctl(2)
_libc: ctypes.CDLL | None = None


def _prctl() -> Callable[..., int]:
    """libc's ``prctl``, looked up in the parent: the child may not load anything."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc.prctl  # type: ignore[no-any-return]


class UserChildError(BootseerError):
    """The work failed in the child (the message is the child's), or the child died."""


def user_groups(user: str, gid: int) -> list[int]:
    """The user's supplementary groups (read in the parent: NSS is not fork-safe)."""
    try:
        return sorted(set(os.getgrouplist(user, gid)))
    except (OSError, KeyError):
        return [gid]


class UserChild:
    """A forked child running ``work(stdin_fd, stdout_fd)`` as ``uid``/``gid``.

    With ``feed`` the parent writes a stream to the child (:attr:`stdin`); with
    ``drain`` it reads one from it (:attr:`stdout`). The work's return value (anything
    JSON can carry) comes back through :meth:`result`; an exception in the work
    becomes a :class:`UserChildError` carrying its message.
    """

    def __init__(self, pid: int, stdin: int | None, stdout: int | None, result_fd: int) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self._result_fd = result_fd
        self._status: int | None = None

    @classmethod
    def start(
        cls,
        uid: int,
        gid: int,
        work: Work,
        *,
        groups: Sequence[int] | None = None,
        feed: bool = False,
        drain: bool = False,
    ) -> UserChild:
        if os.geteuid() != 0 and os.geteuid() != uid:
            raise UserChildError(f"cannot act as uid {uid}: not root and not that user")
        groups = list(groups) if groups is not None else [gid]
        in_r, in_w = os.pipe() if feed else (None, None)
        out_r, out_w = os.pipe() if drain else (None, None)
        res_r, res_w = os.pipe()
        prctl, parent = _prctl(), os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, reported through the pipe
            _child(
                uid,
                gid,
                groups,
                work,
                in_r,
                out_w,
                res_w,
                close=[fd for fd in (in_w, out_r, res_r) if fd is not None],
                bind_to_parent=lambda: _stop_with(parent, prctl),
            )
        for fd in (in_r, out_w, res_w):
            if fd is not None:
                os.close(fd)
        return cls(pid, in_w, out_r, res_r)

    def close_stdin(self) -> None:
        if self.stdin is not None:
            os.close(self.stdin)
            self.stdin = None

    def close_stdout(self) -> None:
        if self.stdout is not None:
            os.close(self.stdout)
            self.stdout = None

    def result(self, timeout: float) -> Any:
        """Wait for the child's answer; past ``timeout`` seconds the child is killed."""
        self.close_stdin()
        deadline = time.monotonic() + timeout
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._result_fd], [], [], left)[0]:
                    self.kill()
                    raise UserChildError(f"no answer within {timeout:.0f}s; child killed")
                chunk = os.read(self._result_fd, 1 << 20)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_RESULT:
                    self.kill()
                    raise UserChildError("answer too large; child killed")
                chunks.append(chunk)
        finally:
            os.close(self._result_fd)
            self.close_stdout()
            self._reap()
        try:
            answer = jsonlimits.loads(b"".join(chunks), max_bytes=MAX_RESULT, what="answer")
        except ValueError:
            raise UserChildError(f"child died without an answer (status {self._status})") from None
        if "error" in answer:
            raise UserChildError(str(answer["error"]))
        return answer.get("ok")

    def terminate(self, grace: float = 5.0) -> None:
        """Ask the child to stop (SIGTERM: it unwinds, so a restore removes its temporary
        directory), and kill it if it has not ended ``grace`` seconds later."""
        if self._status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            later = threading.Timer(grace, self.kill)
            later.daemon = True
            later.start()

    def kill(self) -> None:
        if self._status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _reap(self) -> None:
        if self._status is None:
            _, self._status = os.waitpid(self.pid, 0)


def _stop(signum: int, frame: object) -> None:  # pragma: no cover - in the child
    raise SystemExit(f"stopped by signal {signum} (past its deadline)")


@contextlib.contextmanager
def stop_held() -> Iterator[None]:
    """Hold :meth:`UserChild.terminate`'s SIGTERM while the work cleans up: a stop that
    arrives then (the deadline's, just after the stream ended) would otherwise cut the
    cleanup short and leave its temporary files. It is delivered, and unwinds, after."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _stop_with(parent: int, prctl: Callable[..., int]) -> None:  # pragma: no cover
    """In the child: SIGTERM when the thread that forked it ends (with it, the parent
    process; :class:`UserChild` is waited for where it was started). Set after the uid
    change, which clears it; a parent already gone by then is a stop now."""
    if prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:
        raise SystemExit("the parent ended before the work began")


def _child(
    uid: int,
    gid: int,
    groups: list[int],
    work: Work,
    in_fd: int | None,
    out_fd: int | None,
    res_fd: int,
    close: list[int],
    bind_to_parent: Callable[[], None],
) -> None:  # pragma: no cover
    answer: dict[str, Any]
    try:
        for fd in close:
            os.close(fd)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, _stop)  # terminate(): unwind, cleaning up on the way
        if os.geteuid() == 0 and uid != 0:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            if os.geteuid() != uid:
                raise PermissionError("could not drop to the job user's uid")
        bind_to_parent()
        os.umask(0o022)
        answer = {"ok": work(in_fd, out_fd)}
    except BaseException as exc:  # the parent reports it; the child must never unwind
        msg = describe(exc, named=not isinstance(exc, BootseerError))
        answer = {"error": msg}
    try:
        if out_fd is not None:
            os.close(out_fd)
        try:
            data = json.dumps(answer).encode()
        except (TypeError, ValueError) as exc:
            data = json.dumps({"error": f"unreportable answer: {exc}"}).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(res_fd, view) :]
    finally:
        os._exit(0)
