"""A Mesos v1 HTTP scheduler client: one subscription kept alive, events to a handler, calls from any thread.

What it guarantees (docs/mesos.md has the list): SUBSCRIBE with checkpointing and a long failover timeout,
re-using the FrameworkID it was given (and handing a new one to `on_framework_id` to persist), so a
restarted framework keeps its tasks; `Mesos-Stream-Id` on every call; handler exceptions logged, never
fatal; every status update with a uuid acknowledged; implicit reconciliation after each subscription and
every `reconcile_interval`; a watchdog that drops a stream silent for `watchdog_heartbeats` heartbeat
intervals and re-subscribes; several masters and 307 redirects to the leader; backoff with jitter on 503
and connection errors; an ERROR event stops the client with a one-line `failure`. TEARDOWN is only ever
sent by `teardown()`.
"""

from __future__ import annotations

import base64
import getpass
import http.client
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cosched.mesos import calls
from cosched.mesos.backoff import Backoff
from cosched.mesos.errors import CallError, MesosError, NotSubscribed, RecordIOError
from cosched.mesos.handler import EventHandler
from cosched.mesos.masters import (
    DiscoveryFailed,
    Master,
    ZooKeeperGroup,
    follow_location,
    parse_masters,
    parse_zookeeper,
    zookeeper_masters,
)
from cosched.mesos.recordio import RecordIODecoder
from cosched.mesos.transport import EventStream, Redirected, Unavailable, basic_auth, open_stream, post_call

log = logging.getLogger(__name__)

Json = dict[str, Any]


@dataclass
class SchedulerConfig:
    """How the client talks to the masters; the defaults suit a production framework."""

    masters: str | list[str]
    name: str = "cosched"
    user: str = ""
    """Unix user the tasks run as (empty: the user running the client)."""
    roles: tuple[str, ...] = ()
    failover_timeout: float = calls.WEEK_SECONDS
    """How long the master keeps our tasks after we leave without TEARDOWN."""
    watchdog_heartbeats: float = 3.0
    """Drop the stream when no event came for this many heartbeat intervals."""
    first_event_timeout: float = 30.0
    """Silence allowed on a new stream before SUBSCRIBED tells the heartbeat interval."""
    reconcile_interval: float = 600.0
    connect_timeout: float = 5.0
    call_timeout: float = 10.0
    call_attempts: int = 3
    """Tries of one call on 503 / connection errors before CallError."""
    backoff_base: float = 0.5
    backoff_cap: float = 30.0
    principal: str = ""
    """With `secret`: HTTP basic authentication on every call, for a master that authenticates frameworks."""
    secret: str = field(default="", repr=False)


class SchedulerClient:
    """Keeps one framework subscribed to the leading master until `stop()`, `teardown()` or an ERROR event."""

    def __init__(
        self,
        config: SchedulerConfig,
        handler: EventHandler,
        *,
        framework_id: str | None = None,
        on_framework_id: Callable[[str], None] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.config = config
        self.handler = handler
        group = parse_zookeeper(config.masters) if isinstance(config.masters, str) else None
        self.group: ZooKeeperGroup | None = group
        """zk://: the masters are read from ZooKeeper before the first subscription and after each failure."""
        self.masters: list[Master] = [] if group else parse_masters(config.masters)
        self._on_framework_id = on_framework_id
        self._backoff = backoff or Backoff(config.backoff_base, config.backoff_cap)
        self._user = config.user or getpass.getuser()
        self._auth = basic_auth(config.principal, config.secret) if config.principal else None

        self._lock = threading.Lock()
        self._framework_id = framework_id or None
        self._master: Master | None = self.masters[0] if self.masters else None
        self._stream: EventStream | None = None
        self._stream_id: str | None = None
        self._heartbeat: float | None = None

        self._stopping = threading.Event()
        self._leaving = threading.Event()
        self._subscribed = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: str | None = None
        self.last_problem: str | None = None
        """The last retryable failure to subscribe (a master unreachable, starting, or without a leader)."""
        """One line saying why the client stopped on its own (ERROR event, SUBSCRIBE refused)."""
        self.subscriptions = 0
        """SUBSCRIBED events received so far (a re-subscription adds one)."""
        self.handler_errors = 0

    # -- life cycle ---------------------------------------------------------------------------------------

    def start(self) -> SchedulerClient:
        if self._thread is not None:
            raise MesosError("scheduler client already started")
        self._thread = threading.Thread(target=self._run, name="mesos-scheduler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Leave without TEARDOWN: the master keeps our tasks for `failover_timeout` for a re-subscription."""
        self._stopping.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.interrupt()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def wait_subscribed(self, timeout: float) -> bool:
        """True once subscribed (now or within `timeout`), False on timeout or when the client stopped."""
        deadline = time.monotonic() + timeout
        while not self._subscribed.is_set():
            if self._stopping.is_set() or time.monotonic() >= deadline:
                return False
            self._subscribed.wait(min(0.05, max(deadline - time.monotonic(), 0)))
        return True

    def wait_stopped(self, timeout: float) -> bool:
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def framework_id(self) -> str | None:
        with self._lock:
            return self._framework_id

    @property
    def master(self) -> Master | None:
        """The master subscribed to (or tried last; None before ZooKeeper named one)."""
        with self._lock:
            return self._master

    @property
    def subscribed(self) -> bool:
        return self._subscribed.is_set()

    # -- calls (any thread) ---------------------------------------------------------------------------------

    def accept(
        self, offer_ids: Iterable[str], operations: Iterable[Mapping[str, Any]], refuse_seconds: float | None = None
    ) -> None:
        """Use offers (of one agent) for LAUNCH / LAUNCH_GROUP operations (`calls.launch`, `calls.launch_group`)."""
        self.call(calls.accept(offer_ids, operations, refuse_seconds))

    def decline(self, offer_ids: Iterable[str], refuse_seconds: float | None = 120.0) -> None:
        self.call(calls.decline(offer_ids, refuse_seconds))

    def kill(self, task_id: str, agent_id: str | None = None) -> None:
        self.call(calls.kill(task_id, agent_id))

    def revive(self, roles: Iterable[str] = ()) -> None:
        self.call(calls.revive(roles))

    def suppress(self, roles: Iterable[str] = ()) -> None:
        self.call(calls.suppress(roles))

    def reconcile(self, tasks: Iterable[tuple[str, str | None]] = ()) -> None:
        """Explicit for (task_id, agent_id) pairs; implicit (all our tasks) without."""
        self.call(calls.reconcile(tasks))

    def acknowledge(self, agent_id: str, task_id: str, uuid: str) -> None:
        self.call(calls.acknowledge(agent_id, task_id, uuid))

    def message(self, agent_id: str, executor_id: str, data: bytes) -> None:
        self.call(calls.message(agent_id, executor_id, data))

    def teardown(self) -> None:
        """Remove the framework: the master KILLS ALL ITS TASKS and forgets its id. Then stop."""
        self._leaving.set()  # the master ends the stream on TEARDOWN: do not re-subscribe (it would get ERROR)
        try:
            self.call(calls.teardown())
        finally:
            self.stop()

    def call(self, call: Json) -> None:
        """Send one call on the current subscription, retrying 503 / connection errors with backoff.

        Raises NotSubscribed when no subscription is open, CallError when the master refuses the call,
        moved leadership (307), or stayed unreachable for `call_attempts` tries.
        """
        for attempt in range(self.config.call_attempts):
            with self._lock:
                master, stream_id, framework_id = self._master, self._stream_id, self._framework_id
            if stream_id is None or framework_id is None or master is None:
                raise NotSubscribed(f"{call['type']}: not subscribed to a Mesos master")
            body = dict(call, framework_id=calls.value(framework_id))
            try:
                post_call(master, body, stream_id, self.config.call_timeout, auth=self._auth)
                return
            except Redirected as exc:
                raise CallError(f"{call['type']}: {exc}") from None
            except Unavailable as exc:
                if attempt + 1 >= self.config.call_attempts:
                    raise CallError(f"{call['type']}: {exc} ({attempt + 1} tries)") from None
                if self._stopping.wait(self._backoff.delay(attempt)):
                    raise NotSubscribed(f"{call['type']}: the client is stopping") from None

    # -- the event thread ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._keep_subscribed()
        except Exception as exc:  # a bug here must stop the client visibly, not kill its thread silently
            log.exception("the Mesos scheduler client crashed")
            self._fail(f"the Mesos scheduler client crashed: {type(exc).__name__}: {exc}")

    def _keep_subscribed(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                stream = self._subscribe()
            except Redirected as exc:
                try:
                    leader = follow_location(exc.location, exc.master)
                except MesosError as bad:
                    self._fail(str(bad))
                    return
                log.info("%s", exc)
                with self._lock:
                    self._master = leader
                failures += 1
                if failures > 1 and self._stopping.wait(self._backoff.delay(failures - 2)):
                    return
                continue
            except Unavailable as exc:
                log.warning("%s; retrying", exc)
                self.last_problem = str(exc)
                self._try_next_master()
                if self._stopping.wait(self._backoff.delay(failures)):
                    return
                failures += 1
                continue
            except CallError as exc:
                self._fail(str(exc))
                return
            reason, got_subscribed = self._read(stream)
            with self._lock:
                self._stream = None
                self._stream_id = None
            self._subscribed.clear()
            stream.close()
            if self._stopping.is_set() or self._leaving.is_set():
                return
            log.warning("mesos event stream from %s lost: %s; re-subscribing", stream.master, reason)
            self._dispatch(self.handler.on_disconnected, reason)
            failures = 0 if got_subscribed else failures + 1
            if failures and self._stopping.wait(self._backoff.delay(failures - 1)):
                return

    def _try_next_master(self) -> None:
        """After a failure, the next configured master (from the first when a redirect target failed);
        with ZooKeeper, whichever it names at the next try."""
        with self._lock:
            if self.group is not None:
                self._master = None
            elif self._master in self.masters:
                self._master = self.masters[(self.masters.index(self._master) + 1) % len(self.masters)]
            else:
                self._master = self.masters[0]

    def _discover(self) -> Master:
        """The leader ZooKeeper names now (Unavailable if it names none: retried with backoff)."""
        assert self.group is not None
        try:
            masters = zookeeper_masters(self.group, self.config.connect_timeout)
        except DiscoveryFailed as exc:
            raise Unavailable(str(exc)) from None
        log.info("ZooKeeper %s names %d master(s), the leader %s", self.group, len(masters), masters[0])
        with self._lock:
            self.masters, self._master = masters, masters[0]
        return masters[0]

    def _subscribe(self) -> EventStream:
        with self._lock:
            master, framework_id = self._master, self._framework_id
        if master is None:
            master = self._discover()
        info = calls.framework_info(
            name=self.config.name,
            user=self._user,
            framework_id=framework_id,
            failover_timeout=self.config.failover_timeout,
            roles=self.config.roles,
            principal=self.config.principal,
        )
        stream = open_stream(master, calls.subscribe(info), self.config.connect_timeout, auth=self._auth)
        with self._lock:
            self._stream = stream
            self._heartbeat = None
        if self._stopping.is_set():  # stop() ran between open_stream and publishing the stream
            stream.interrupt()
        return stream

    def _read(self, stream: EventStream) -> tuple[str, bool]:
        """Dispatch events until the stream ends; return why it ended and whether it got SUBSCRIBED."""
        decoder = RecordIODecoder()
        got_subscribed = False
        last_event = time.monotonic()
        next_reconcile = float("inf")
        while not self._stopping.is_set():
            allowed = self._silence_allowed()
            left = last_event + allowed - time.monotonic()
            if left <= 0:
                return f"no event for {allowed:.1f} s (watchdog)", got_subscribed
            try:
                data = stream.read(left)
            except TimeoutError:
                return f"no event for {allowed:.1f} s (watchdog)", got_subscribed
            except (OSError, ValueError, http.client.HTTPException) as exc:  # ValueError: read after close
                return f"connection broken: {type(exc).__name__}: {exc}", got_subscribed
            if not data:
                return "the master closed the stream", got_subscribed
            try:
                records = decoder.feed(data)
            except RecordIOError as exc:
                return str(exc), got_subscribed
            for record in records:
                try:
                    event = json.loads(record)
                    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                        raise ValueError("not an object with a type")
                except ValueError as exc:
                    return f"bad event {record[:80]!r}: {exc}", got_subscribed
                last_event = time.monotonic()
                if event["type"] == "SUBSCRIBED":
                    got_subscribed = True
                    next_reconcile = time.monotonic()
                if event["type"] == "ERROR":
                    message = " ".join(str(event.get("error", {}).get("message", "")).split()) or "no message"
                    self._fail(f"mesos master {stream.master} sent ERROR: {message}")
                    self._dispatch(self.handler.on_error, message)
                    return "ERROR", got_subscribed
                try:
                    self._handle(event, stream)
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    log.warning("malformed %s event ignored (%s: %s)", event["type"], type(exc).__name__, exc)
            if time.monotonic() >= next_reconcile:
                next_reconcile = time.monotonic() + self.config.reconcile_interval
                self._try_call(calls.reconcile())
        return "stopped", got_subscribed

    def _silence_allowed(self) -> float:
        with self._lock:
            heartbeat = self._heartbeat
        if heartbeat is None:
            return self.config.first_event_timeout
        return self.config.watchdog_heartbeats * heartbeat

    def _handle(self, event: Json, stream: EventStream) -> None:
        kind = event["type"]
        payload = event.get(kind.lower(), {})
        if kind == "SUBSCRIBED":
            self._on_subscribed(payload, stream)
        elif kind == "HEARTBEAT":
            pass
        elif kind == "OFFERS":
            self._dispatch(self.handler.on_offers, list(payload.get("offers", [])))
        elif kind == "RESCIND":
            self._dispatch(self.handler.on_rescind, payload.get("offer_id", {}).get("value", ""))
        elif kind == "UPDATE":
            status = payload.get("status", {})
            keep = self._dispatch(self.handler.on_update, status)
            if status.get("uuid") and keep is not False:
                self._try_call(
                    calls.acknowledge(status["agent_id"]["value"], status["task_id"]["value"], status["uuid"])
                )
        elif kind == "MESSAGE":
            data = base64.b64decode(payload.get("data", ""))
            self._dispatch(self.handler.on_message, payload["agent_id"]["value"], payload["executor_id"]["value"], data)
        elif kind == "FAILURE":
            self._dispatch(self.handler.on_failure, payload)
        else:
            self._dispatch(self.handler.on_other, event)

    def _on_subscribed(self, payload: Json, stream: EventStream) -> None:
        framework_id = payload["framework_id"]["value"]
        with self._lock:
            known = self._framework_id
            self._framework_id = framework_id
            self._stream_id = stream.stream_id
            self._heartbeat = float(payload.get("heartbeat_interval_seconds", 15.0))
        self.subscriptions += 1
        self._subscribed.set()
        log.info(
            "subscribed to %s as framework %s in role %s (heartbeat %.1f s)",
            stream.master,
            framework_id,
            ", ".join(self.config.roles) or "*",
            self._heartbeat,
        )
        if framework_id != known and self._on_framework_id is not None:
            self._dispatch(self._on_framework_id, framework_id)
        self._dispatch(self.handler.on_subscribed, framework_id, payload)

    def _dispatch(self, method: Callable[..., Any], *args: Any) -> Any:
        try:
            return method(*args)
        except Exception:
            self.handler_errors += 1
            log.exception("mesos event handler %s raised (ignored, the framework keeps running)", method.__name__)
            return None

    def _try_call(self, call: Json) -> None:
        """A call the event thread makes on its own (ACKNOWLEDGE, RECONCILE): failures are logged only."""
        try:
            self.call(call)
        except MesosError as exc:
            log.warning("%s", exc)

    def _fail(self, message: str) -> None:
        self.failure = message
        log.error("%s; the Mesos scheduler client stops", message)
        self._stopping.set()
