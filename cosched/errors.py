"""One exception tree, so the CLI can turn any of them into one clear line."""


class CoschedError(Exception):
    """Base of every error cosched raises on purpose."""


class ConfigError(CoschedError, ValueError):
    """A bad setting: unknown policy name, impossible cluster, bad option value."""


class TraceError(CoschedError, ValueError):
    """A trace that cannot be read: missing file, malformed line, bad header."""


class SchedulingError(CoschedError, RuntimeError):
    """The core was asked to do something impossible (a bug or a bad backend)."""
