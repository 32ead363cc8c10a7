"""What the scheduler client tells the framework: one method per event, all optional.

The client calls these from its event thread, one at a time, in stream order. An exception raised here is
logged and swallowed: a bug in handling one event must never tear the framework (and its tasks) down,
which is what pymesos does. Status updates are acknowledged after `on_update` returns, raised or not,
unless it returned False.
"""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]


class EventHandler:
    """Subclass and override what you need; the defaults ignore the event."""

    def on_subscribed(self, framework_id: str, subscribed: Json) -> None:
        """(Re-)subscribed; `subscribed` is the SUBSCRIBED payload (heartbeat interval, master info)."""

    def on_offers(self, offers: list[Json]) -> None:
        """New offers (Offer messages as JSON). Accept or decline each; holding them starves others."""

    def on_rescind(self, offer_id: str) -> None:
        """An offer is no longer valid (agent gone, or the master took it back)."""

    def on_update(self, status: Json) -> bool | None:
        """A TaskStatus: from an agent or a reconciliation answer. The client acknowledges it when
        this returns, unless it returns False: then the handler acknowledges it itself
        (`SchedulerClient.acknowledge`) once it has kept what the update says (until then the
        master keeps the task and the agent sends the update again, also to a restarted framework)."""

    def on_message(self, agent_id: str, executor_id: str, data: bytes) -> None:
        """Bytes one of our executors sent."""

    def on_failure(self, failure: Json) -> None:
        """An agent was removed or an executor ended (`agent_id`, optional `executor_id` and `status`)."""

    def on_disconnected(self, reason: str) -> None:
        """The stream was lost (the client re-subscribes on its own); calls fail until `on_subscribed`."""

    def on_error(self, message: str) -> None:
        """The master sent ERROR: the framework is refused (removed, bad info). The client has stopped."""

    def on_other(self, event: Json) -> None:
        """Any other event type (INVERSE_OFFERS, UPDATE_OPERATION_STATUS, ...), whole."""
