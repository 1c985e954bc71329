"""The one base of every error waypost raises on purpose.

A ``WaypostError`` is a user's mistake or a fault waypost recognised (a
config that can't be used, a root that can't be reached, a manifest it
won't trust); its message is one line that names the file, key or path and
what to do, and the CLI prints just that line. Any other exception reaching
the CLI is a bug in waypost and shows its traceback.

The classes deriving from it keep their other base where callers catch them
by it (``ConfigError`` is still a ``ValueError``, ``Unrecorded`` an
``OSError``, ``StorageError`` a ``RuntimeError``).
"""


class WaypostError(Exception):
    """An error waypost raises on purpose; its message is the one line to show."""


class ConfigError(WaypostError, ValueError):
    """The config cannot be used; the message says where and why."""
