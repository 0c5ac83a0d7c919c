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
