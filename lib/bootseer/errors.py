"""The exceptions bootseer raises on purpose.

Every message says what failed and what to check, so a cluster admin reading a
node's log can act on it without the source at hand.
"""

from __future__ import annotations


class BootseerError(Exception):
    """Base of every error bootseer raises on purpose."""


class ConfigError(BootseerError):
    """The site config is missing, unreadable or has a bad value (the message names the key)."""


class NoSiteConfig(ConfigError):
    """The site config named (the default path, or ``$BOOTSEER_CONFIG``) does not exist:
    bootseer would run on the defaults, a node-local store among them."""


class OptionError(BootseerError):
    """A job option (--bootseer*) has a value outside its documented syntax."""


class ContextError(BootseerError):
    """The Slurm environment lacks something a hook needs (job id, user, node)."""


class StoreError(BootseerError):
    """A store could not be reached, or an object in it is missing or damaged."""


class StepError(BootseerError):
    """A prolog/epilog step failed in a way it could explain."""


# What an exception means when it comes without a message (a future's TimeoutError, a
# queue's Empty): its class's name alone says little in an admin's log.
_MEANINGS: tuple[tuple[type[BaseException], str], ...] = (
    (TimeoutError, "timed out"),
    (ConnectionError, "connection lost"),
    (EOFError, "ended early"),
    (KeyboardInterrupt, "interrupted"),
    (MemoryError, "out of memory"),
    (AssertionError, "an internal check failed"),
)


def describe(exc: BaseException, after: float | None = None, named: bool = False) -> str:
    """``exc``'s message, for an error message or a log line that quotes its cause.

    One without a message (``str(exc)`` is empty) says what its class means instead,
    and a timeout how long was waited (``after``, seconds) where the caller knows.
    ``named`` puts the class's name before a message: for an exception nobody raised
    on purpose, whose message alone may be a bare key or number.

    >>> describe(OSError(2, "No such file or directory"))
    '[Errno 2] No such file or directory'
    >>> describe(TimeoutError(), after=59.96)
    'timed out after 60 s (TimeoutError)'
    >>> describe(KeyError("size"), named=True)
    "KeyError: 'size'"
    >>> import queue
    >>> describe(queue.Empty())
    'Empty, without a message'
    """
    text = str(exc)
    name = type(exc).__name__
    if text:
        return f"{name}: {text}" if named else text
    meaning = next((m for kind, m in _MEANINGS if isinstance(exc, kind)), None)
    if meaning is None:
        return f"{name}, without a message"
    if after is not None and isinstance(exc, TimeoutError):
        meaning += f" after {after:.1f}".rstrip("0").rstrip(".") + " s"
    return f"{meaning} ({name})"


class ManifestError(StoreError):
    """A stored manifest or record (an image's, a snapshot's, a checkpoint file's) is
    missing, malformed, over a limit, or disagrees with what it describes."""


class QuotaExceeded(BootseerError):
    """Storing more would take a scope (a user, an account) past its site quota; the
    message says who holds how much and what frees room. Each technique raises its own
    kind (:class:`bootseer.ckpt.errors.CkptQuotaExceeded`,
    :class:`bootseer.deps.capture.SnapshotQuotaExceeded`); this catches both."""
