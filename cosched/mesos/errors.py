"""The errors of the Mesos scheduler client, under cosched's one exception tree."""

from __future__ import annotations

from cosched.errors import CoschedError


class MesosError(CoschedError):
    """Base of what the Mesos client raises on purpose; its message is one line."""


class RecordIOError(MesosError, ValueError):
    """The master's event stream is not valid RecordIO (or an event is not a JSON object)."""


class CallError(MesosError, RuntimeError):
    """The master refused a call (4xx), or could not be reached after the retries."""


class NotSubscribed(CallError):
    """A call was made while no subscription is open (before SUBSCRIBED, or between reconnects)."""
