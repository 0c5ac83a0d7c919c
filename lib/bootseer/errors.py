"""The exceptions bootseer raises on purpose.

Every message says what failed and what to check, so a cluster admin reading a
node's log can act on it without the source at hand.
"""

from __future__ import annotations


class BootseerError(Exception):
    """Base of every error bootseer raises on purpose."""


class ConfigError(BootseerError):
    """The site config is missing, unreadable or has a bad value (the message names the key)."""


class OptionError(BootseerError):
    """A job option (--bootseer*) has a value outside its documented syntax."""


class ContextError(BootseerError):
    """The Slurm environment lacks something a hook needs (job id, user, node)."""


class StoreError(BootseerError):
    """A store could not be reached, or an object in it is missing or damaged."""


class StepError(BootseerError):
    """A prolog/epilog step failed in a way it could explain."""


class ManifestError(StoreError):
    """A stored manifest or record (an image's, a snapshot's, a checkpoint file's) is
    missing, malformed, over a limit, or disagrees with what it describes."""


class QuotaExceeded(BootseerError):
    """Storing more would take a scope (a user, an account) past its site quota; the
    message says who holds how much and what frees room. Each technique raises its own
    kind (:class:`bootseer.ckpt.errors.CkptQuotaExceeded`,
    :class:`bootseer.deps.capture.SnapshotQuotaExceeded`); this catches both."""
