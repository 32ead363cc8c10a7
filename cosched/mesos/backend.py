"""The daemon's hands on a Mesos cluster: jobs as tasks of the cosched executor, agents as nodes.

It answers the calls the daemon makes of any backend (`cosched/daemon/backend.py`) from what
Mesos tells a framework. A job's run is one task of the cosched executor per agent its slots
span (`cosched/mesos/executor.py`), started whole or not at all; its handle names the run.
Ends come in terminal status updates with the exit code and log tail; quota changes go to the
executors as MESSAGEs and come back as the value the cgroup shows; usage arrives every few s.

Why the core's nodes are agents and offers only carry its launches out: the core decides which
job starts and where (its placement policy), in replay and here alike, so the offers cannot
decide it again. An offer is where a launch finds its agent's resources. `OfferBook` holds an
offer only while a launch waits for its agent, declines the rest with a refuse filter so other
frameworks may use them, SUPPRESSes while nothing waits and REVIVEs (rate-limited) when
something does. What other frameworks hold of an agent reaches the core as information, not
as a placement: each offer of an agent, with what our tasks there hold, says the agent's room
for cosched (`cosched/mesos/shares.py`); `others_hold` turns it into the cores and MiB of the
node the core must hold back, which the daemon rescinds from the node's free resources and
offers again when they are given back (`cosched/daemon/nodes.py`).

Runs lost, not ended by their job, come back as `lost` (the daemon requeues the job): an agent
removed (FAILURE, or a task gone with it), no offer from the agent in `launch_timeout` (its node
is taken out of the core's until it offers room for that launch: a race, since the core places
only on what the agent's last offers left), a gang part that could not start, an executor
killed. A killed executor may leave its containers running on its agent: the run counts as lost
only after a new executor there removed them (`jobs.sweep_task`), so a job never runs twice.
A guest's task asks Mesos for memory and a token 0.01 CPU; its CPU is the quota the core lent.
Terminal updates are acknowledged only once the daemon has recorded the end (`remove`), so one
that a killed daemon never recorded is sent again to the next.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cosched.core.events import Slots
from cosched.daemon.backend import NodeStatus
from cosched.daemon.config import DockerSection
from cosched.daemon.docker_backend import (
    LIVE_LOG_BYTES,
    ContainerInfo,
    EngineUnavailable,
    Exit,
    LaunchRefused,
    QuotaMismatch,
    RunLost,
    Sample,
)
from cosched.daemon.identity import read_secret_file
from cosched.errors import ConfigError
from cosched.mesos import calls, jobs, shares
from cosched.mesos.carve import carve
from cosched.mesos.errors import MesosError, NotSubscribed
from cosched.mesos.handler import EventHandler
from cosched.mesos.offer_book import Accept, Decline, Demand, Need, OfferBook, Revive, Suppress
from cosched.mesos.offers import Offer, parse_offer
from cosched.mesos.runs import (
    AGENT_GONE,
    GONE,
    LIVE,
    Outcome,
    Run,
    StartFailure,
    Task,
    fence_wait,
    new_handle,
    parse_task,
    part_id,
)
from cosched.mesos.scheduler import SchedulerClient, SchedulerConfig

if TYPE_CHECKING:
    from cosched.daemon.metrics import DaemonMetrics

log = logging.getLogger("cosched.mesos")


ASK_FIRST = 5.0
"""Seconds before the master is asked again for expected tasks it has not answered for (`expect`)."""
ASK_MOST = 60.0
"""The longest wait between two such asks."""
REREGISTER_GRACE = 600.0
"""Seconds an expected task's "gone" answer, given without its agent, is passed over: a Mesos
master's `agent_reregister_timeout` (10 min), after which it calls an agent not back unreachable."""


class NoAnswer(MesosError):
    """An executor did not answer a message in time (`MesosBackend._ask`)."""


GUEST_CPUS = 0.01
"""What a guest's task asks Mesos for: the least a task may hold (its CPU is its host's)."""
MESSAGE_RESEND = 3.0
"""Seconds before an unanswered message to an executor (a quota, a request for output) is sent again."""
HOLD_BEYOND = 60.0
"""Seconds a gang's held part waits for its `go` beyond `launch_timeout`: a restarted daemon's start
(the saved agents' offers, 10 s at most, then reconciliation, 10 s) and its recovery come first."""
LOG_TIMEOUT = 10.0
"""Seconds `cosched logs` waits for a running job's executors to send its output."""
_SWEEP = "cosched-sweep-"
_TOLD_ALL = "cosched-reconciled-"
"""Task ids of no task: the master's answer for one marks the end of a reconciliation (`_settle`)."""
SWEEP_RETRY_MOST = 60.0
"""Seconds at most between a sweep's tries, which double from one (an agent that kept refusing one
had a sandbox made every second)."""
EXECUTOR_DEAD = 3
"""Sweeps in a row whose executor died before it said anything: the cosched executor does not start
on that agent (not installed for `mesos.executor_command`, a broken Python). Nothing of ours can
run there: its tasks are lost, and its node is drained as faulty, naming the cause."""
KNOWN_AGENTS_GRACE = 10.0
"""Seconds a restarted daemon waits for the agents it knows before it starts without the absent ones
(live agents offer within the master's first allocations, about a second)."""

EXECUTOR_GRACE = 30.0
"""Seconds an executor whose run was forgotten counts as alive on its agent without the FAILURE that
says it left (it leaves once its tasks' ends are acknowledged, within a second or two)."""

FORGOTTEN = 100_000
"""Ended runs remembered, so that a late update of one is known for a stray (a few MB)."""


@dataclass
class MesosSettings:
    masters: str | list[str]
    name: str = "cosched"
    user: str = "root"
    executor_command: str = jobs.EXECUTOR_COMMAND
    launch_timeout: float = 30.0
    """Seconds a launch may wait for its agents' offers, and then for TASK_RUNNING."""
    quota_timeout: float = 15.0
    failover_timeout: float = calls.WEEK_SECONDS
    hold_timeout: float = 10.0
    refuse_seconds: float = 120.0
    revive_interval: float = 1.0
    watchdog_heartbeats: float = 3.0
    """A stream silent for this many heartbeat intervals is dropped and subscribed again."""
    principal: str = ""
    """With `secret`: the principal the framework authenticates as (a master with framework authentication)."""
    secret: str = field(default="", repr=False)
    order_by: tuple[str, ...] = ()
    """Agent attributes the nodes are numbered by at the first start (then hostname): with a
    fat-tree, the agents of one switch are consecutive nodes, as the core's topology counts them."""
    role: str = ""
    """The role the framework subscribes in ('' or '*': the default role): it is then offered what is
    reserved for that role too, and its tasks name the reservations they use (`carve`)."""
    job_settings: DockerSection = field(default_factory=DockerSection)
    """The daemon's [docker] table: every agent's executor runs jobs as its user, with its limits
    and data roots (storage every agent mounts at the same path)."""
    sample_interval: float = 2.0
    """The daemon's `intervals.sample`: how often each executor reports its job's usage."""
    fence: float = 60.0
    """Seconds an executor keeps its jobs running while its agent answers nothing; a lost agent's
    jobs run elsewhere only `runs.fence_wait(fence)` after the master said so (`Task.outcome`)."""


def read_secret(path: str) -> str:
    """The framework's secret from its file (the whole file, less a final newline): a file, not the
    config, so that the config can be readable by all and the secret by the daemon's user alone
    (`identity.read_secret_file`: with it, a local user could subscribe as this framework)."""
    try:
        secret = read_secret_file(Path(path), "mesos.secret_file").decode("utf-8").rstrip("\n")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config key mesos.secret_file: cannot read {path}: {exc}") from None
    if not secret:
        raise ConfigError(f"config key mesos.secret_file: {path} is empty")
    return secret


@dataclass
class _Launch:
    """A run from the launch call until its ACCEPTs are sent (or it is given up)."""

    run: Run
    infos: dict[str, list[dict[str, Any]]]
    """TaskInfos by agent, until their ACCEPT is sent."""
    demand: Demand | None
    """While it waits for offers."""
    requested: float
    offered: float = 0.0
    """When the last offer it was launched on arrived (monotonic)."""
    had_room: set[str] = field(default_factory=set)
    """Agents whose held offers had room for its task there at some time while it waited."""
    failure: str = ""


@dataclass
class _Sweep:
    task_id: str
    agent_id: str
    killed: list[str]
    """The tasks (each its own executor) whose containers it removes."""
    info: dict[str, Any]
    demand: Demand | None
    requested: float
    not_before: float = 0.0
    tries: int = 0
    """Tries that failed before this one (the next waits twice as long)."""
    dead_starts: int = 0
    """Of them, those in a row whose executor terminated before it said anything (`EXECUTOR_DEAD`)."""
    found: dict[str, Any] = field(default_factory=dict)
    """Ends that tries before this one found (`jobs.swept_ends`): a try that failed may have removed
    those containers already, and the next would not find them."""


class MesosBackend(EventHandler):
    """Backend of a daemon whose cluster is `nodes` Mesos agents."""

    def __init__(
        self,
        settings: MesosSettings,
        nodes: int,
        *,
        framework_id: str | None = None,
        on_framework_id: Callable[[str], None] | None = None,
        metrics: DaemonMetrics | None = None,
        node_hosts: Sequence[str] = (),
        on_nodes: Callable[[list[str]], None] | None = None,
        put_last: Collection[str] = (),
    ) -> None:
        """`node_hosts` are the nodes' hostnames an earlier run saved (through `on_nodes`): with them,
        the daemon starts without the agents that do not offer, their nodes down until they do.
        `put_last`: hostnames of drained machines, which nodes mapped anew take only for want of
        others (lowering `cluster.nodes` after draining the machines taken out kept one of them)."""
        self.settings = settings
        self.nodes = nodes
        self.put_last = frozenset(put_last)
        self.metrics = metrics
        self._on_nodes = on_nodes
        self.client = SchedulerClient(
            SchedulerConfig(
                masters=settings.masters,
                name=settings.name,
                user=settings.user,
                failover_timeout=settings.failover_timeout,
                watchdog_heartbeats=settings.watchdog_heartbeats,
                principal=settings.principal,
                secret=settings.secret,
                roles=(settings.role,) if settings.role not in ("", "*") else (),
            ),
            self,
            framework_id=framework_id,
            on_framework_id=on_framework_id,
        )
        self.cond = threading.Condition()
        self.book = OfferBook(
            hold_timeout=settings.hold_timeout,
            refuse_seconds=settings.refuse_seconds,
            revive_interval=settings.revive_interval,
        )
        self.hostnames: dict[str, str] = {}
        """Agent id -> hostname, of the agents that offered."""
        self.attributes: dict[str, tuple[tuple[str, str], ...]] = {}
        """Agent id -> its attributes, as its last offer told them."""
        self.node_hosts: list[str] = []
        """Hostnames by node: the first `nodes` agents that offered, in hostname order, at the first
        start; the saved ones at every later start."""
        self.agents: list[str] = []
        """Agent ids by node ('' until it offers; an agent that comes back under its hostname takes
        its node again)."""
        self.down: set[int] = set()
        self.wanted: dict[int, Need] = {}
        """Down nodes taken out because their agent had no room for a launch: what that launch needed there.
        Such a node comes back once its agent offers room for it, not at its first offer. The core
        places only on what the agent's last offers left (`others_hold`), so this is a race (others
        took more after an offer we declined, while our offers were filtered or suppressed); the rule
        keeps the core from trying the same launch there again, each try holding a pass for
        `launch_timeout`, should the executors' overhead be counted short (guests' token CPUs)."""
        self.beyond: set[str] = set()
        """Agents declined for an hour as beyond the cluster's nodes: a REVIVE brings their offers back."""
        self.rooms: dict[str, shares.Room] = {}
        """Agent id -> what cosched could hold there (offered + its own tasks), as its last offers showed:
        the agent less what other frameworks hold (`cosched/mesos/shares.py`, `others_hold`)."""
        self._rooms_learnt: dict[str, float] = {}
        """When each agent's room was learnt (monotonic)."""
        self._unsized: set[str] = set()
        """Runs known from reconciliation whose tasks' sizes the daemon has not told yet (`size`)."""
        self._leaving: dict[str, tuple[str, float]] = {}
        """Executors of forgotten runs (the id is the task's) not yet said gone: agent, since when (monotonic).
        Each holds 0.05 CPU and 64 MiB of its agent until the master's FAILURE for it."""
        self.changes: list[tuple[int, bool]] = []
        self.runs: dict[str, Run] = {}
        self.launches: dict[str, _Launch] = {}
        """Runs whose ACCEPTs are not all sent yet, by handle."""
        self.sweeps: dict[str, _Sweep] = {}
        self.gone_names: dict[str, str] = {}
        """Agent id -> hostname of agents whose node another took: a lost run there names the machine
        (it named the agent's id, an operator's walkthrough)."""
        self.dead_executors: dict[str, str] = {}
        """Agent -> why the cosched executor does not start there (`EXECUTOR_DEAD`), until a sweep or
        a task of ours runs there."""
        """Sweeps wanted, by agent."""
        self.latencies: deque[tuple[float, float]] = deque(maxlen=10_000)
        """(launch, offer-to-launch) seconds of recent launches, for the benchmark."""
        self.declined = 0
        self._claimed: set[str] = set()
        """Runs this process launched or the daemon adopted; after recovery any other one is a stray."""
        self._forgotten: dict[str, None] = {}
        """Runs whose end was recorded or that were given up, oldest first (a late update of one is a stray)."""
        self._unanswered: dict[str, int] = {}
        """Tasks of runs the state file records running (`expect`) that the master has not told of,
        or told only as gone: asked for by name (task id -> its node) until it says they run or ended."""
        self._told_agents: frozenset[str] = frozenset()
        """Agents that had offered when the start's reconciliation began: the master told all they hold."""
        self._next_ask = (0.0, ASK_FIRST)
        """When to ask for them next (monotonic), and the wait after that."""
        self._recovered = False
        self._marker = ""
        """The task id whose reconciliation answer `_settle` waits for; '' once answered."""
        self._held: set[str] = set()
        """Runs of which a part said it is held (`JobPayload.hold`): told to start once whole (`_tell_go`)."""
        self._queued = 0
        self._dirty = False
        self._quota_answers: dict[str, tuple[float | None, str]] = {}
        self._quota_asks: dict[str, int] = {}
        """Task -> the number of its latest quota change (`jobs.quota_message`), whose answer alone is
        waited for: the wall clock's nanoseconds, or one more than the last."""
        self._log_answers: dict[str, str] = {}
        self._started = False
        self._closing = False
        self._offers_thread: threading.Thread | None = None
        self._mapping = True
        """Until the agents are known: offers keep coming (no SUPPRESS) while those that came are declined, not
        held (an agent is known by its first offer; holding them would keep them from other frameworks, and a
        master with an offer timeout rescinds them)."""
        if node_hosts and len(node_hosts) == nodes:
            self.node_hosts, self.agents = list(node_hosts), [""] * nodes
        elif node_hosts:
            log.warning("%d nodes were saved, the cluster has %d: the nodes are mapped anew", len(node_hosts), nodes)

    # -- the connection ----------------------------------------------------------
    def connect(self, timeout: float = 30.0) -> None:
        """Subscribe, learn the agents from their offers and the tasks from reconciliation."""
        if not self._started:
            self.client.start()
            self._started = True
        if not self.client.wait_subscribed(timeout):
            raise EngineUnavailable(
                f"cannot reach a Mesos master at {self.settings.masters}: "
                f"{self.client.failure or self.client.last_problem or 'no answer'}"
            )
        try:  # refuse filters an earlier run of this framework set would keep agents away
            self.client.revive()
        except MesosError as exc:
            log.warning("REVIVE: %s", exc)
        if self._offers_thread is None:  # offers are declined while the agents are learnt from them
            self._offers_thread = threading.Thread(target=self._offer_loop, name="mesos-offers", daemon=True)
            self._offers_thread.start()
        with self.cond:
            first = not self.node_hosts
            if first:
                self._map_nodes(timeout)
            else:
                self._wait_known_agents(min(timeout, KNOWN_AGENTS_GRACE))
            self._mapping = False
            self._dirty = True
            self.cond.notify_all()
            hosts = list(self.node_hosts)
        if first and self._on_nodes is not None:  # saved outside the lock: the store has its own
            self._on_nodes(hosts)
        self._settle()

    def _map_nodes(self, timeout: float) -> None:
        """Under the lock, at the first start: the nodes are the first `nodes` agents that offer, in
        the order of their `order_by` attributes, then hostname (saved, so that a later start knows
        them without waiting for all). Nodes no agent offered for in `timeout` s are down, each taken
        by the next new agent that offers."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            # enough agents, none of them drained: the first to offer may be a machine being retired
            in_service = [a for a, host in self.hostnames.items() if host not in self.put_last]
            if len(in_service) >= self.nodes:
                break
            self.cond.wait(left)
        if not self.hostnames:
            raise EngineUnavailable(f"Mesos offered no agent in {timeout:.0f} s; the cluster has {self.nodes}")
        # machines being drained out are taken last (a drain follows its machine: `drain.follow`)
        chosen = sorted(self.hostnames, key=lambda agent: (self.hostnames[agent] in self.put_last, self._place(agent)))
        present = sorted(chosen[: self.nodes], key=self._place)
        missing = self.nodes - len(present)
        self.agents = present + [""] * missing
        self.node_hosts = [self.hostnames[a] for a in present] + [""] * missing
        if self.settings.order_by:
            log.info("nodes by %s: %s", ", ".join(self.settings.order_by), self._runs_of(present))
        for node in range(len(present), self.nodes):
            log.warning(
                "Mesos offered %d agent(s) in %.0f s; the cluster has %d: node %d is down until a new agent offers",
                len(present),
                timeout,
                self.nodes,
                node,
            )
            self.down.add(node)
            self.changes.append((node, False))

    def _place(self, agent: str) -> tuple[Any, ...]:
        """An agent's place in the node order: its `order_by` attributes (numbers in them compared as
        numbers, so s9 comes before s10; an agent without one first), then its hostname."""
        attributes = dict(self.attributes.get(agent, ()))
        keys = tuple(_natural(attributes.get(name, "")) for name in self.settings.order_by)
        return (*keys, _natural(self.hostnames[agent]), agent)

    def _runs_of(self, agents: list[str]) -> str:
        """Consecutive nodes of the same `order_by` attributes, for the log: 'nodes 0-3 rack=r1, ...'."""
        runs: list[tuple[int, int, str]] = []
        for node, agent in enumerate(agents):
            attributes = dict(self.attributes.get(agent, ()))
            label = " ".join(f"{name}={attributes.get(name, '?')}" for name in self.settings.order_by)
            if runs and runs[-1][2] == label:
                runs[-1] = (runs[-1][0], node, label)
            else:
                runs.append((node, node, label))
        return "; ".join(f"node{'s' if a != b else ''} {a}{f'-{b}' if a != b else ''} {label}" for a, b, label in runs)

    def _wait_known_agents(self, grace: float) -> None:
        """Under the lock, at a later start: wait `grace` s at most for the saved agents to offer; a node
        whose agent did not is down (nothing starts there; its runs end as their tasks' states say)
        until it offers."""
        deadline = time.monotonic() + grace
        while "" in self.agents and (left := deadline - time.monotonic()) > 0:
            self.cond.wait(left)
        for node, agent in enumerate(self.agents):
            if not agent and node not in self.down:
                log.warning(
                    "agent %s (node %d) made no offer in %.0f s: the daemon starts without it, the node is down "
                    "until it offers",
                    self.node_hosts[node] or "(none yet)",
                    node,
                    grace,
                )
                self.down.add(node)
                self.changes.append((node, False))

    def _settle(self, limit: float = 10.0) -> None:
        """Wait until reconciliation has told every task the master knows: recovery adopts each run
        started, those the state file does not name yet (a launch cut short) too.

        Implicit reconciliation's answers have no end, but the master sends them at once and answers
        calls in order. So an implicit RECONCILE is followed by an explicit one for a task that never
        was (`_TOLD_ALL`, on an agent that offered, so that the master answers it at once): its
        answer comes after all the others. Why not wait for a quiet second, as before: any wake-up
        in it (an offer) ended the wait; a job whose launch a SIGKILL cut short, and whose task the
        master told of just after, was queued again and ran twice (CI at c5adcd6)."""
        marker = f"{_TOLD_ALL}{uuid.uuid4().hex[:12]}"
        with self.cond:
            self._marker = marker
            # an agent the master knows, so that it answers at once (without one, not while agents re-register)
            agent = next((a for a in self.agents if a), None) or next(iter(self.hostnames), None)
            offered = frozenset(self.hostnames)  # registered: reconciliation tells all they hold
        try:
            self.client.reconcile()
            self.client.reconcile([(marker, agent)])
        except MesosError as exc:
            log.warning("RECONCILE: %s; the daemon starts on what reconciliation told", exc)
            return
        with self.cond:
            if not self.cond.wait_for(lambda: self._marker != marker, limit):
                log.warning("the master did not finish reconciling in %.0f s: the daemon starts on what it told", limit)
                return
            self._told_agents = offered  # only once it told all: else each launch is asked for (`expect_launch`)

    @property
    def framework_id(self) -> str | None:
        return self.client.framework_id

    def ping(self) -> bool:
        return self.client.subscribed

    def has_image(self, name: str) -> bool:
        """The agents' engines cannot be asked from here: a missing image fails its task at launch."""
        return True

    def close(self) -> None:
        """Leave without TEARDOWN: the tasks run on, for the next start to find."""
        with self.cond:
            self._closing = True
            self.cond.notify_all()
        self.client.stop()
        if self._offers_thread is not None:
            self._offers_thread.join(5.0)

    # -- events (the client's thread) -------------------------------------------
    def on_subscribed(self, framework_id: str, subscribed: dict[str, Any]) -> None:
        with self.cond:
            self.book.resubscribed()
            self._dirty = True
            self.cond.notify_all()

    def on_offers(self, offers: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        surplus = []
        hosts = None
        with self.cond:
            offered: set[str] = set()
            for raw in offers:
                offer = parse_offer(raw, now)
                node = self._node_of_host(offer.hostname)
                if node is None and offer.agent_id not in self.hostnames:
                    node = self._free_node()
                    if node is not None:  # this agent is that node from now on
                        self._take(node, offer.hostname)
                        hosts = list(self.node_hosts)
                beyond = self.node_hosts or len(self.hostnames) >= self.nodes
                if node is None and beyond and offer.agent_id not in self.hostnames:
                    surplus.append(offer.id)  # an agent beyond the cluster's nodes
                    if offer.agent_id not in self.beyond:
                        log.warning(
                            "agent %s is beyond the cluster's nodes (%d): its offers are declined for an hour, "
                            "or until a node's agent is gone",
                            offer.hostname,
                            self.nodes,
                        )
                        self.beyond.add(offer.agent_id)
                    continue
                self.hostnames[offer.agent_id] = offer.hostname
                self.attributes[offer.agent_id] = offer.attributes
                self.beyond.discard(offer.agent_id)
                if node is not None and self.agents[node] != offer.agent_id:
                    if self.agents[node]:
                        log.warning("agent %s is now %s (node %d)", offer.hostname, offer.agent_id, node)
                    self.agents[node] = offer.agent_id
                self.book.add([offer])
                offered.add(offer.agent_id)
                if node is not None and node in self.down and self._back(node, offer.agent_id):
                    log.warning("agent %s (node %d) offers again: back in the cluster", offer.hostname, node)
                    self.down.discard(node)
                    self.wanted.pop(node, None)
                    self.changes.append((node, True))
            self._learn_rooms(offered)
            self._dirty = True
            self.cond.notify_all()
        if hosts is not None and self._on_nodes is not None:
            self._on_nodes(hosts)
        if surplus:
            self._decline(surplus, 3600.0)

    def on_rescind(self, offer_id: str) -> None:
        with self.cond:
            self.book.rescind(offer_id)

    def on_failure(self, failure: dict[str, Any]) -> None:
        agent = failure.get("agent_id", {}).get("value", "")
        executor = failure.get("executor_id", {}).get("value", "")
        if executor:  # an executor's end: its tasks' updates say what happened; it holds nothing now
            with self.cond:
                self._leaving.pop(executor, None)
                name = parse_task(executor)
                run = None if name is None else self.runs.get(name.handle)
                task = None if run is None or name is None else run.tasks.get(name.part)
                if task is not None and task.id == executor:
                    task.executor_gone = True
            return
        if not agent:
            return
        with self.cond:
            self._agent_lost(agent, "removed by the master")

    def _agent_lost(self, agent: str, why: str) -> None:
        """Under the lock: its offers are void, its node leaves the core (free for a new agent to
        take), its tasks are lost."""
        self.book.agent_lost(agent)
        self.beyond.discard(agent)
        self.rooms.pop(agent, None)  # learnt again from its next offer
        self._rooms_learnt.pop(agent, None)
        for executor in [e for e, (where, _) in self._leaving.items() if where == agent]:
            del self._leaving[executor]
        self._node_down(agent, why)
        node = self._node_of_agent(agent)
        if node is not None:
            self.wanted.pop(node, None)  # down for want of room before, gone now
            if self.beyond:  # one of them may take the node: their offers, filtered for an hour, come back
                self.book.revive_soon()

    def _node_down(self, agent: str, why: str, wanted: Need | None = None) -> None:
        """Under the lock: the agent's node leaves the core until the agent offers again (with room
        for `wanted`, a launch it had no room for)."""
        node = self._node_of_agent(agent)
        if node is not None and node not in self.down:
            log.warning("agent %s (node %d) %s: its jobs are queued again", self.hostnames.get(agent, agent), node, why)
            self.down.add(node)
            self.changes.append((node, False))
            if wanted is not None:
                self.wanted[node] = wanted
        self.sweeps.pop(agent, None)
        self.cond.notify_all()

    def on_update(self, status: dict[str, Any]) -> bool | None:
        task_id = status["task_id"]["value"]
        if task_id.startswith(_SWEEP):
            self._sweep_update(status)
            return None
        if task_id.startswith(_TOLD_ALL):
            with self.cond:
                if task_id == self._marker:  # an earlier start's marker answered late is passed over
                    self._marker = ""
                self.cond.notify_all()
            return None
        name = parse_task(task_id)
        if name is None:
            return None
        state = status["state"]
        stray = keep = False
        with self.cond:
            if name.handle in self._forgotten:
                stray = state in LIVE
                run = None
            else:
                run = self.runs.get(name.handle)
                if run is None:  # learned from reconciliation or a resent update
                    run = self.runs[name.handle] = Run(name.handle, name.job_id, name.parts, run=name.run)
                    stray = self._recovered and state in LIVE
            if run is not None:
                task = run.tasks.get(name.part)
                if task is None:
                    agent = status.get("agent_id", {}).get("value", "")
                    task = run.tasks[name.part] = Task(task_id, name.job_id, agent, name.cores, learnt=time.monotonic())
                    if state in LIVE:  # its size (cores, memory, guest) is the daemon's to tell
                        self._unsized.add(name.handle)
                if not self._agentless_answer(task, status):
                    task.apply(status, time.monotonic())
                if state not in GONE:  # the master knows where it stands
                    self._unanswered.pop(task_id, None)
                if state == "TASK_RUNNING":  # our executor starts there (again)
                    self.dead_executors.pop(task.agent_id, None)
                if state == "TASK_STARTING" and run.parts > 1:
                    self._held.add(run.handle)
                if state in GONE and status.get("reason") in AGENT_GONE:
                    self._agent_lost(task.agent_id, f"lost ({status.get('reason')})")
                keep = state not in LIVE and bool(status.get("uuid")) and not stray
                if keep:
                    task.ack = (status["agent_id"]["value"], status["uuid"])
            self._dirty = True
            self.cond.notify_all()
        if stray:
            log.warning("killing task %s: its job runs elsewhere or was requeued", task_id)
            self._kill_task(task_id, status.get("agent_id", {}).get("value"))
        return False if keep else None

    def on_message(self, agent_id: str, executor_id: str, data: bytes) -> None:
        try:
            body = jobs.parse_message(data)
        except jobs.BadPayload as exc:
            log.warning("message from executor %s: %s", executor_id, exc)
            return
        with self.cond:
            if body["type"] == "quota_applied":
                ask = body.get("ask")  # None from an executor that numbers none
                if ask is None or ask >= self._quota_asks.get(body["task"], 0):  # else the answer to an older one
                    self._quota_answers[body["task"]] = (body.get("cpus"), body.get("error", ""))
            elif body["type"] == "log":
                self._log_answers[body["task"]] = str(body.get("text", ""))
            elif body["type"] == "usage":
                usage = body.get("tasks", {})
                for run in self.runs.values():
                    for task in run.tasks.values():
                        if task.id in usage:
                            task.usage = usage[task.id]
            self.cond.notify_all()

    # -- offers (their own thread) ----------------------------------------------------
    def _offer_loop(self) -> None:
        """Decide on held offers whenever something changed, and every second for the hold timeout."""
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self._dirty or self._closing, timeout=1.0)
                if self._closing:
                    return
                self._dirty = False
                try:
                    work = self._offer_round(time.monotonic())
                except Exception:  # a bug here must not stop every later launch
                    log.exception("deciding on offers failed")
                    continue
            for call in work:
                call()

    def _offer_round(self, now: float) -> list[Callable[[], None]]:
        """Under the lock: the book's decision on the waiting launches, as calls to make after it."""
        for sweep in list(self.sweeps.values()):
            if now - sweep.requested > self.settings.launch_timeout:
                log.warning(
                    "no sweep of agent %s in time: containers of its killed executor may run on", sweep.agent_id
                )
                self._swept(sweep.agent_id)
        demands = [launch.demand for launch in self.launches.values() if launch.demand is not None]
        for demand in demands:
            self.launches[demand.key].had_room.update(need.agent_id for need in demand.needs if self._room(need))
        demands += [s.demand for s in self.sweeps.values() if s.demand is not None and now >= s.not_before]
        held = {offer.id: offer for offer in self.book.held}
        actions = self.book.decide(demands, self._queued, now, watching=bool(self.down) or self._mapping)
        if self.metrics is not None:
            self.metrics.offers_held.set(len(self.book.held))
        work: list[Callable[[], None]] = self._ask_unanswered(now) + self._tell_go(now)
        for action in actions:
            if isinstance(action, Accept):
                work.append(self._accept_call(action, [held[o] for o in action.offer_ids]))
            elif isinstance(action, Decline):
                work.append(partial(self._decline, list(action.offer_ids), action.refuse_seconds))
            elif isinstance(action, Suppress):
                work.append(lambda: self._flow(self.client.suppress, "SUPPRESS"))
            elif isinstance(action, Revive):
                work.append(lambda: self._flow(self.client.revive, "REVIVE"))
        return work

    def _ask_unanswered(self, now: float) -> list[Callable[[], None]]:
        """Under the lock: the RECONCILE naming the expected tasks the master has not answered for, when
        due (first after `ASK_FIRST` s, then twice as long each time, up to `ASK_MOST`). A master answers
        nothing for a task whose agent is still re-registering (a failover), so the ask is repeated."""
        for task in list(self._unanswered):
            name = parse_task(task)
            if name is None or name.handle not in self.runs:  # its end recorded, or given up
                del self._unanswered[task]
        due, wait = self._next_ask
        if not self._unanswered or now < due:
            return []
        self._next_ask = (now + wait, min(wait * 2, ASK_MOST))
        asked = [(task, self._agent_at(node) or None) for task, node in sorted(self._unanswered.items())]
        return [partial(self._reconcile, asked)]

    def _tell_go(self, now: float) -> list[Callable[[], None]]:
        """Under the lock: `go` for the held parts of the runs that are whole (`Run.to_start`), this
        daemon's (a restarted one adopts a run of which a part ran, and tells the others; it removes
        one of which none did), each said again every `MESSAGE_RESEND` s until it runs."""
        work: list[Callable[[], None]] = []
        for handle in list(self._held):
            run = self.runs.get(handle)
            if run is None or not run.holding():
                self._held.discard(handle)
                continue
            if handle not in self._claimed:
                continue
            for task in run.to_start():
                if task.told is None or now - task.told >= MESSAGE_RESEND:
                    run.told = run.told or now
                    task.told = now
                    work.append(partial(self._go, task.id, task.agent_id))
        return work

    def _go(self, task_id: str, agent: str) -> None:
        """Tell a held part to start; a call that fails is made again at a later round."""
        try:
            self.client.message(agent, task_id, jobs.go_message(task_id))  # its executor is named as it
        except MesosError as exc:
            log.warning("telling task %s to start: %s", task_id, exc)

    def _agent_at(self, node: int) -> str:
        """Under the lock: the agent id of `node` ('' while no agent offered for it since the start)."""
        return self.agents[node] if 0 <= node < len(self.agents) else ""

    def _agentless_answer(self, task: Task, status: dict[str, Any]) -> bool:
        """Under the lock: a "gone" answer for an expected task asked for without its agent (none
        offered for its node since the start), to be passed over for `REREGISTER_GRACE` s.

        Why: asked without an agent, a master answers TASK_LOST for a task it does not know, even
        one whose agent is on its way back after a failover (it holds back its answer only when
        told the agent): the job was queued again while it ran there. Asked again once the agent
        offers, with its id, the answer is the master's word."""
        node = self._unanswered.get(task.id)
        return (
            node is not None
            and status.get("state") in GONE
            and not status.get("agent_id", {}).get("value")
            and not self._agent_at(node)
            and time.monotonic() - task.learnt < REREGISTER_GRACE
        )

    def _reconcile(self, tasks: list[tuple[str, str | None]]) -> None:
        try:
            self.client.reconcile(tasks)
        except MesosError as exc:  # asked again at the next due round
            log.warning("RECONCILE of %d task(s) the master has not answered for: %s", len(tasks), exc)

    def _accept_call(self, accept: Accept, offers: list[Offer]) -> Callable[[], None]:
        """Take the launches' TaskInfos for this agent out of their runs now (under the lock), their
        resources cut from the accepted offers' pieces (`carve`)."""
        offered = max(offer.received_at for offer in offers)
        infos: list[dict[str, Any]] = []
        launches: list[_Launch] = []
        for key in accept.launches:
            launch = self.launches.get(key)
            if launch is not None:
                infos += launch.infos.pop(accept.agent_id, [])
                launch.offered = max(launch.offered, offered)
                launch.demand = None
                launches.append(launch)
            elif (sweep := self.sweeps.get(accept.agent_id)) is not None and sweep.task_id == key:
                infos.append(sweep.info)
                sweep.demand = None

        def fail(why: str) -> None:
            with self.cond:
                for launch in launches:
                    launch.failure = f"ACCEPT on agent {self.hostnames.get(accept.agent_id)} failed: {why}"
                self.cond.notify_all()

        try:
            infos = carve(offers, infos)
        except MesosError as exc:
            fail(str(exc))  # the lock is ours already (reentrant)
            return partial(self._decline, list(accept.offer_ids), self.book.expired_refuse_seconds)

        def call() -> None:
            try:
                self.client.accept(list(accept.offer_ids), [calls.launch(infos)], refuse_seconds=0)
            except MesosError as exc:
                fail(str(exc))

        return call

    def _decline(self, offer_ids: list[str], refuse_seconds: float) -> None:
        try:
            self.client.decline(offer_ids, refuse_seconds=refuse_seconds)
        except MesosError as exc:
            log.warning("declining offers: %s", exc)
            return
        self.declined += len(offer_ids)
        if self.metrics is not None:
            self.metrics.offers_declined.inc(len(offer_ids))

    def _flow(self, call: Callable[[], None], name: str) -> None:
        try:
            call()
        except MesosError as exc:
            # Not subscribed: the subscription logs why, and the call is tried again at each round
            # until it is (it was a warning a second, its name twice, while a master was elected).
            text = str(exc) if str(exc).startswith(name) else f"{name}: {exc}"
            log.log(logging.DEBUG if isinstance(exc, NotSubscribed) else logging.WARNING, "%s", text)
            with self.cond:
                self.book.resubscribed()  # try again at the next round
        else:
            log.info("%s sent", name)

    def queued(self, jobs: int) -> None:
        with self.cond:
            if not self._recovered:
                self._recovered = True  # the daemon's first pass: recovery adopted what it wanted
                strays = [
                    (t.id, t.agent_id)
                    for handle, run in self.runs.items()
                    if handle not in self._claimed
                    for t in run.tasks.values()
                    if t.state in LIVE
                ]
            else:
                strays = []
            if jobs != self._queued:
                self._queued = jobs
                self._dirty = True
                self.cond.notify_all()
        for task_id, agent in strays:
            log.warning("killing task %s: no job of the state file runs as it", task_id)
            self._kill_task(task_id, agent)

    # -- nodes ------------------------------------------------------------------------
    def _free_node(self) -> int | None:
        """Under the lock: the node a new agent takes: one no agent had yet, else one whose agent is
        gone (down, and not for want of room: an agent that another framework fills is alive and
        keeps its node). So a machine replaced, or back under another hostname, is a node again."""
        if "" in self.node_hosts:
            return self.node_hosts.index("")
        gone = sorted(node for node in self.down if node not in self.wanted)
        return gone[0] if gone else None

    def _take(self, node: int, hostname: str) -> None:
        """Under the lock: `hostname`'s agent is `node` now; the agent it had, if it comes back, is beyond
        the cluster's nodes (its offers declined) and its runs end as their tasks' states say."""
        before = self.node_hosts[node]
        log.warning("agent %s takes node %d%s", hostname, node, f" (its agent {before} is gone)" if before else "")
        if self.agents[node]:
            self.gone_names[self.agents[node]] = before  # its runs' ends still name the machine
            self.hostnames.pop(self.agents[node], None)
            self.agents[node] = ""
        self.node_hosts[node] = hostname

    def _node_of_host(self, hostname: str) -> int | None:
        return self.node_hosts.index(hostname) if hostname in self.node_hosts else None

    def _node_of_agent(self, agent: str) -> int | None:
        return self.agents.index(agent) if agent in self.agents else None

    def nodes_changed(self) -> list[tuple[int, bool]]:
        with self.cond:
            changes, self.changes = self.changes, []
        return changes

    # -- agents shared with other frameworks ---------------------------------------------
    def _learn_rooms(self, agents: set[str]) -> None:
        """Under the lock, after offers of `agents` arrived: each one's room, the offers of it we hold
        plus what our tasks there hold (a launch still waiting for offers holds nothing yet; one
        accepted does, even before its first update). A task of unknown size keeps the room it had."""
        if not agents:
            return
        ours: dict[str, list[tuple[float, float] | None]] = {agent: [] for agent in agents}
        for run in self.runs.values():
            launch = self.launches.get(run.handle)
            for task in run.tasks.values():
                sizes = ours.get(task.agent_id)
                if sizes is None or (launch is not None and task.agent_id in launch.infos):
                    continue
                if task.state in LIVE:
                    sizes.append(task.size)
                elif self._executor_alive(task):  # it leaves once the end is acknowledged
                    sizes.append((jobs.EXECUTOR_CPUS, jobs.EXECUTOR_MEM))
        now = time.monotonic()
        for executor, (agent, since) in list(self._leaving.items()):
            if now - since > EXECUTOR_GRACE:
                del self._leaving[executor]
            elif agent in ours:
                ours[agent].append((jobs.EXECUTOR_CPUS, jobs.EXECUTOR_MEM))
        for sweep in self.sweeps.values():
            if sweep.agent_id in ours and sweep.demand is None:
                ours[sweep.agent_id].append(shares.task_size(jobs.SWEEP_CPUS, int(jobs.SWEEP_MEM)))
        held: dict[str, list[Any]] = {agent: [] for agent in agents}
        for offer in self.book.held:
            if offer.agent_id in held:
                held[offer.agent_id].append(offer)
        for agent in agents:
            room = shares.room(held[agent], ours[agent])
            if room is not None:
                self.rooms[agent] = room
                self._rooms_learnt[agent] = time.monotonic()

    @staticmethod
    def _executor_alive(task: Task) -> bool:
        """Whether an ended task's executor may still hold its share of the agent (no FAILURE yet)."""
        return not task.executor_gone and task.state not in GONE and task.state != "TASK_ERROR"

    def _executors_leave(self, tasks: list[Task]) -> None:
        """Under the lock: a run forgotten; its executors still count until they are said gone."""
        now = time.monotonic()
        for task in tasks:
            if task.agent_id and self._executor_alive(task):
                self._leaving[task.id] = (task.agent_id, now)

    def others_hold(self, cores: int, memory: int) -> dict[int, tuple[int, int]]:
        """Per node up whose agent offered, what the core must hold back of its `cores` cores and
        `memory` MiB: what other frameworks hold of the agent (or the agent lacks), as its last
        offers showed. Nodes with nothing to hold back are left out."""
        out: dict[int, tuple[int, int]] = {}
        with self.cond:
            for node, agent in enumerate(self.agents):
                room = self.rooms.get(agent) if agent and node not in self.down else None
                if room is not None and any(held := shares.held_back(room, cores, memory)):
                    out[node] = held
        return out

    def unsized(self) -> list[tuple[str, int]]:
        """(handle, job id) of runs known from reconciliation whose sizes the daemon has not told."""
        with self.cond:
            if not self._unsized:
                return []
            self._unsized = {
                handle
                for handle in self._unsized
                if (run := self.runs.get(handle)) is not None
                and any(task.size is None and task.state in LIVE for task in run.tasks.values())
            }
            return [(handle, self.runs[handle].job_id) for handle in sorted(self._unsized)]

    def size(self, handle: str, memory_mib: int, guest: bool) -> None:
        """A run known from reconciliation is the daemon's job of `memory_mib` MiB (a guest if
        `guest`): its tasks hold what a launch of it would ask for, as the launch computes it."""
        with self.cond:
            self._unsized.discard(handle)
            run = self.runs.get(handle)
            if run is None:
                return
            for task in run.tasks.values():
                if task.size is None:
                    cpus = GUEST_CPUS if guest else float(task.cores)
                    task.size = shares.task_size(cpus, math.ceil(memory_mib * run.share(task)))
                    self._count_in_room(task, task.size)

    def _count_in_room(self, task: Task, size: tuple[float, float]) -> None:
        """Under the lock: a task the agent's room was learnt without (an offer came before
        reconciliation told of it, after a restart) is counted in once its size is known. Left out,
        what it holds read as other frameworks' until that agent's next offer, which a suppressed
        framework may not see for long (a helper saw `other frameworks hold 1 core`)."""
        learnt = self._rooms_learnt.get(task.agent_id)
        room = self.rooms.get(task.agent_id)
        if task.learnt and learnt is not None and room is not None and learnt < task.learnt:
            self.rooms[task.agent_id] = shares.Room(room.cpus + size[0], room.mem + size[1])

    def node_status(self) -> list[NodeStatus]:
        with self.cond:
            return [
                NodeStatus(host, self.agents[node], node not in self.down, self.attributes.get(self.agents[node], ()))
                for node, host in enumerate(self.node_hosts)
            ]

    def waiting(self) -> dict[int, str]:
        """Launches under way, by job, with what each waits for: offers, then its tasks to run (an
        agent cut off after its offer was used; shown `RUNNING` with a start before, for 19 s in a
        helper's walkthrough); and runs with a part on a lost agent, which wait to be known stopped
        before their jobs are queued again (shown running on the node's new agent, where they never
        ran: the same walkthrough)."""
        with self.cond:
            waits = {}
            for run in self.runs.values():
                for task in run.tasks.values():
                    outcome, host = self._outcome(task), self.hostnames.get(task.agent_id, task.agent_id)
                    if outcome == "fence":
                        waits[run.job_id] = f"lost with {host}: queued again once its executor's fence has passed"
                    elif outcome == "sweep":
                        waits[run.job_id] = f"its executor on {host} ended: queued again once a sweep shows it stopped"
            for launch in self.launches.values():
                if launch.demand is not None:
                    agents, what = [n.agent_id for n in launch.demand.needs], "offers of"
                else:
                    agents, what = [t.agent_id for t in launch.run.tasks.values() if not t.ran], "its tasks to run on"
                names = sorted({self.hostnames.get(agent, agent) for agent in agents})
                if names:  # (each task running: it is recorded running at once)
                    waits[launch.run.job_id] = f"waiting for {what} {', '.join(names)}"
            return waits

    # -- jobs ----------------------------------------------------------------------
    def launch(
        self,
        job_id: int,
        spec: dict[str, Any],
        cpus: list[int],
        quota: float,
        memory_mib: int,
        *,
        slots: Slots = (),
        guest: bool = False,
        run: int = 0,
    ) -> tuple[str, float]:
        """Start the job's tasks on the agents of its slots, whole or not at all; its handle and
        start time once every task runs."""
        parts = [(node, cores) for node, cores in (slots or ((0, int(spec["cores"])),)) if cores > 0]
        handle = new_handle(job_id, run)
        job_run = Run(handle, job_id, len(parts), run=run)
        launch = _Launch(job_run, {}, None, time.monotonic())
        with self.cond:
            framework_id = self.framework_id
            if framework_id is None:
                raise EngineUnavailable("not subscribed to a Mesos master")
            total = sum(cores for _, cores in parts)
            hold = self._hold() if len(parts) > 1 else 0.0  # a gang's part waits for the others
            needs = []
            for part, (node, cores) in enumerate(parts):
                if node in self.down:
                    raise RunLost(f"agent {self.node_hosts[node]} (node {node}) is gone")
                agent = self.agents[node]
                share = cores / total
                task = Task(part_id(handle, part, len(parts), cores), job_id, agent, cores, quota=quota * share)
                memory = math.ceil(memory_mib * share)
                env = {**(spec.get("env") or {}), "COSCHED_PART": str(part), "COSCHED_PARTS": str(len(parts))}
                part_spec = {**spec, "cores": cores, "env": env}
                payload = jobs.JobPayload(job_id, part_spec, quota * share, memory, hold=hold)
                executor = self._executor_info(task.id, framework_id)
                task_cpus = GUEST_CPUS if guest else float(cores)
                name = f"cosched job {job_id}" + (f" part {part + 1}/{len(parts)}" if len(parts) > 1 else "")
                launch.infos.setdefault(agent, []).append(
                    jobs.job_task(task.id, agent, executor, payload, task_cpus, name)
                )
                need = Need(agent, *shares.task_size(task_cpus, memory))
                needs.append(need)
                task.size = (need.cpus, need.mem)
                job_run.tasks[part] = task
            launch.demand = Demand(handle, tuple(needs))
            self.runs[handle] = job_run
            self.launches[handle] = launch
            self._claimed.add(handle)
            self._dirty = True
            self.cond.notify_all()
            try:
                started = self._wait_launched(launch)
            except (RunLost, LaunchRefused, EngineUnavailable):
                self._retire(launch)
                raise
            finally:
                self.launches.pop(handle, None)
        return handle, started

    def _hold(self) -> float:
        """How long a gang's part waits, made, for its `go`: past `launch_timeout`, by which a live
        daemon gives up and kills it, for a restarted one to adopt it and say `go` (`HOLD_BEYOND`)."""
        return self.settings.launch_timeout + HOLD_BEYOND

    def _room(self, need: Need) -> bool:
        """Under the lock: whether the held offers of `need`'s agent have room for it."""
        held = [o for o in self.book.held if o.agent_id == need.agent_id]
        return sum(o.cpus for o in held) + 1e-9 >= need.cpus and sum(o.mem for o in held) + 1e-9 >= need.mem

    def _back(self, node: int, agent: str) -> bool:
        """Under the lock: whether a down node's agent now offers enough to be in the core again: room
        for the launch it had none for, or else a whole core (a machine back offers all it has)."""
        wanted = self.wanted.get(node)
        return self._room(Need(agent, wanted.cpus, wanted.mem) if wanted else Need(agent, 1.0, 0.0))

    def _wait_launched(self, launch: _Launch) -> float:
        """Under the lock: until every task runs; RunLost or LaunchRefused when the run cannot."""
        timeout, run = self.settings.launch_timeout, launch.run
        deadline = launch.requested + timeout
        while launch.demand is not None and not launch.failure:
            if not self.cond.wait(max(0.0, deadline - time.monotonic())) and time.monotonic() >= deadline:
                break
        if launch.failure and launch.demand is not None:  # withdrawn while it waited for offers
            launch.demand = None
            raise RunLost(launch.failure)
        if launch.demand is not None:
            needs = launch.demand.needs
            short = [n for n in needs if n.agent_id not in launch.had_room and not self._room(n)]
            launch.demand = None
            for need in short:  # gone, or its resources are someone else's: out of the core until it has room
                self._node_down(need.agent_id, f"made no offer with room in {timeout:.0f} s", wanted=need)
            hosts = ", ".join(self.hostnames.get(n.agent_id, n.agent_id) for n in short)
            raise RunLost(f"no offer of agent(s) {hosts} with room in {timeout:.0f} s")
        deadline = time.monotonic() + timeout
        while not all(t.ran for t in run.tasks.values()):
            if launch.failure:  # an ACCEPT that failed after the wait above ended: its part never comes
                raise RunLost(launch.failure)
            failure = run.start_failure(self._outcome)  # a part that never ran: the job cannot start whole
            if failure is None:
                # once told to start, each part says whether it did: given up on meanwhile, a part
                # told first could start and a short one finish before the KILL came (a review)
                limit = deadline if run.told is None else max(deadline, run.told + self._hold())
                if not self.cond.wait(max(0.0, limit - time.monotonic())) and time.monotonic() >= limit:
                    raise RunLost(f"not every task of {run.handle} running after {timeout:.0f} s")
            elif failure.verdict == "refused":
                raise LaunchRefused(failure.why)
            elif failure.verdict == "lost":
                first = failure.failed[0]
                why = self.dead_executors.get(first.agent_id) or failure.why
                raise RunLost(f"part {first.id} {why}", self._faulty_nodes(failure.failed))
            else:
                self._while_settling(run, failure)
                self.cond.wait(1.0)  # the fence's wait passes with time, a sweep with offers
        now = time.monotonic()
        self.latencies.append((now - launch.requested, now - launch.offered))
        if self.metrics is not None:
            self.metrics.offer_launch_seconds.observe(now - launch.offered)
        return max(float(t.data.get("started", 0.0)) for t in run.tasks.values())

    def _while_settling(self, run: Run, failure: StartFailure) -> None:
        """Under the lock: while failed parts that may still run settle, their agents are swept where
        that settles them, and the run's other parts are killed: it cannot start whole, and they must
        not run alone meanwhile."""
        for task in failure.settling:
            if self._outcome(task) == "sweep":
                self._want_sweep(task.agent_id)
        rest = [t for t in run.tasks.values() if t.state in LIVE and not t.killed]
        for task in rest:
            task.killed = True
        if rest:
            kills = [(t.id, t.agent_id) for t in rest]
            threading.Thread(target=self._end_tasks, args=(kills, []), daemon=True).start()

    def _retire(self, launch: _Launch) -> None:
        """Under the lock: a run given up while starting: its tasks are killed, the run forgotten."""
        run = launch.run
        launch.demand = None
        self.runs.pop(run.handle, None)
        self._forget(run)
        sent = [t for t in run.tasks.values() if t.agent_id not in launch.infos]
        self._executors_leave(sent)
        live = [(t.id, t.agent_id) for t in sent if t.state in LIVE]
        for task in run.tasks.values():
            task.killed = True
        acks = [(*t.ack, t.id) for t in run.tasks.values() if t.ack]
        threading.Thread(target=self._end_tasks, args=(live, acks), daemon=True).start()

    def _forget(self, run: Run) -> None:
        """Under the lock: the run is no one's any more; the last FORGOTTEN handles are remembered."""
        handle = run.handle
        for task in run.tasks.values():
            self._quota_asks.pop(task.id, None)
        self._claimed.discard(handle)
        self._forgotten[handle] = None
        if len(self._forgotten) > FORGOTTEN:
            del self._forgotten[next(iter(self._forgotten))]

    def _end_tasks(self, live: list[tuple[str, str]], acks: list[tuple[str, str, str]]) -> None:
        for task_id, agent in live:
            self._kill_task(task_id, agent)
        for agent, status_uuid, task_id in acks:
            self._acknowledge(agent, status_uuid, task_id)

    def _kill_task(self, task_id: str, agent: str | None) -> None:
        try:
            self.client.kill(task_id, agent)
        except MesosError as exc:
            log.warning("killing task %s: %s", task_id, exc)

    def _acknowledge(self, agent: str, status_uuid: str, task_id: str = "") -> None:
        try:
            self.client.call(calls.acknowledge(agent, task_id, status_uuid))
        except MesosError as exc:
            log.warning("acknowledging an update of task %s: %s", task_id, exc)

    # -- what a run is now ----------------------------------------------------------
    def _gone(self, agent: str) -> bool:
        """Under the lock: the agent is not (or no more) one of the core's live nodes."""
        node = self._node_of_agent(agent)
        return node is None or node in self.down

    def _executor_info(self, executor_id: str, framework_id: str) -> dict[str, Any]:
        """The ExecutorInfo of a job's or a sweep's executor, with this daemon's settings."""
        s = self.settings
        return jobs.executor_info(
            executor_id, framework_id, s.executor_command, s.job_settings, s.sample_interval, s.fence
        )

    def _faulty_nodes(self, lost: Iterable[Task]) -> tuple[int, ...]:
        """Under the lock: the nodes of `lost` tasks whose executor could not reach its engine, or
        could not start at all (`EXECUTOR_DEAD`)."""
        agents = {
            task.agent_id for task in lost if task.data.get(jobs.ENGINE_FAULT) or task.agent_id in self.dead_executors
        }
        return tuple(sorted(node for agent in agents if (node := self._node_of_agent(agent)) is not None))

    def _outcome(self, task: Task) -> Outcome:
        return task.outcome(self._gone(task.agent_id), time.monotonic(), fence_wait(self.settings.fence))

    def containers(self) -> dict[int, ContainerInfo]:
        listed: dict[int, ContainerInfo] = {}
        broken: list[Task] = []
        now = time.monotonic()
        with self.cond:
            names = {**self.gone_names, **self.hostnames}
            for run in self.runs.values():
                launch = self.launches.get(run.handle)
                if launch is not None and (launch.demand is not None or launch.infos):
                    continue  # not launched yet
                state = run.state(self._gone, now, names, fence_wait(self.settings.fence))
                for task in state.kill:
                    task.killed = True
                broken += state.kill
                if state.sweep:
                    self._want_sweep(state.sweep[0].agent_id)
                info = ContainerInfo(run.handle, run.job_id, state.state, state.note, run.run)
                other = listed.get(run.job_id)
                if other is None or self._rank(info) > self._rank(other):
                    listed[run.job_id] = info
        for task in broken:
            log.warning("killing task %s: another part of its gang ended", task.id)
            self._kill_task(task.id, task.agent_id)
        return listed

    def _rank(self, info: ContainerInfo) -> tuple[bool, int]:
        """Under the lock: which of a job's runs `containers` names: the daemon's own, then the latest."""
        return info.id in self._claimed, -1 if info.run is None else info.run

    # -- sweeps -------------------------------------------------------------------------
    def _want_sweep(
        self, agent: str, since: float | None = None, delay: float = 0.0, tries: tuple[int, int] = (0, 0)
    ) -> None:
        """Under the lock: an executor on `agent` removes what the killed executors of the tasks
        waiting for a sweep there left (again after `delay` s when a try failed; `since` is when
        sweeping them began, `tries` the `_Sweep.tries` and `dead_starts` before this one)."""
        if (agent in self.sweeps and since is None) or self.framework_id is None:
            return
        killed = [
            task.id
            for run in self.runs.values()
            for task in run.tasks.values()
            if task.agent_id == agent and self._outcome(task) == "sweep"
        ]
        task_id = f"{_SWEEP}{uuid.uuid4().hex[:12]}"
        executor = self._executor_info(task_id, self.framework_id)
        need = Need(agent, jobs.SWEEP_CPUS + jobs.EXECUTOR_CPUS, jobs.SWEEP_MEM + jobs.EXECUTOR_MEM)
        now = time.monotonic()
        info = jobs.sweep_task(task_id, agent, executor, killed)
        demand = Demand(task_id, (need,))
        self.sweeps[agent] = _Sweep(task_id, agent, killed, info, demand, since or now, now + delay, *tries)
        if since is None:
            log.info("sweeping agent %s: the executors of %s were killed", self.hostnames.get(agent), ", ".join(killed))
        self._dirty = True
        self.cond.notify_all()

    def _sweep_update(self, status: dict[str, Any]) -> None:
        agent = status.get("agent_id", {}).get("value", "")
        with self.cond:
            sweep = self.sweeps.get(agent)
            if sweep is None or sweep.task_id != status["task_id"]["value"] or status["state"] in LIVE:
                return
            if status["state"] == "TASK_FINISHED":
                self.dead_executors.pop(agent, None)
                self._swept(agent, jobs.swept_ends(status))
                return
            # e.g. the agent still tears the killed executor down; or our executor does not start there
            dead = status.get("reason") == "REASON_EXECUTOR_TERMINATED" and status.get("source") != "SOURCE_EXECUTOR"
            dead_starts = sweep.dead_starts + 1 if dead else 0
            host = self.hostnames.get(agent, agent)
            if dead_starts >= EXECUTOR_DEAD:
                self.dead_executors[agent] = (
                    f"the cosched executor does not start on agent {host} ({status.get('message') or 'terminated'}"
                    f" {dead_starts} times before it said anything): its sandbox's stderr says why; is cosched"
                    " installed for mesos.executor_command there?"
                )
                log.error("%s", self.dead_executors[agent])
                self._swept(agent)  # nothing of ours can have run there: its tasks are lost
                return
            delay = min(SWEEP_RETRY_MOST, 2.0**sweep.tries)
            why = status.get("message", "")
            log.info("sweep of agent %s ended %s (%s); again in %.0f s", host, status["state"], why, delay)
            self._want_sweep(agent, since=sweep.requested, delay=delay, tries=(sweep.tries + 1, dead_starts))
            self.sweeps[agent].found = {**sweep.found, **jobs.swept_ends(status)}

    def _swept(self, agent: str, ended: Mapping[str, Any] | None = None) -> None:
        """Under the lock: nothing of the tasks the sweep of `agent` named runs on; those whose
        container it found ended on its own (`ended`, by executor: each task's is its own id) ended so."""
        sweep = self.sweeps.pop(agent)
        ended = {**sweep.found, **(ended or {})}
        for run in self.runs.values():
            for task in run.tasks.values():
                if task.id in sweep.killed:
                    task.swept = True
                    if task.id in ended:
                        task.found_ended(ended[task.id])
        self._dirty = True
        self.cond.notify_all()

    # -- the daemon's calls on a run ---------------------------------------------------------
    def expect(self, handle: str, job_id: int, slots: Slots) -> None:
        """A run the state file records as running, whatever reconciliation told of it.

        Why: after a master failover, the master answers for no task of an agent that has not
        re-registered yet. Such a run was missing from the restarted daemon's recovery, which
        recorded its job failed while it ran on: killed as a stray once its agent came back, or,
        with a master that kept its registry, left running unknown, its core given to another
        job. Its missing tasks are now known from the handle and `slots` (as `launch` named them),
        live until the master says otherwise, and asked for by name until it does."""
        parts = [(node, cores) for node, cores in slots if cores > 0]
        name = parse_task(part_id(handle, 0, len(parts), parts[0][1])) if parts else None
        if name is None:
            return
        with self.cond:
            run = self.runs.setdefault(handle, Run(handle, job_id, len(parts), run=name.run))
            self._claimed.add(handle)  # the job's, before any other run of it reconciliation told of
            for part, (node, cores) in enumerate(parts):
                if part in run.tasks:
                    continue
                task_id = part_id(handle, part, len(parts), cores)
                task = run.tasks[part] = Task(task_id, job_id, self._agent_at(node), cores, learnt=time.monotonic())
                self._unanswered[task.id] = node
                self._unsized.add(handle)
            if self._unanswered:
                self._next_ask = (0.0, ASK_FIRST)  # at the next round
                self._dirty = True
                self.cond.notify_all()

    def expect_launch(self, job_id: int, run: int, slots: Slots) -> None:
        """A run the state file records as launching: expected as a running one is (`expect`: the
        parts reconciliation did not tell are listed, and asked for by name) where an agent of its
        slots had not offered when the start's reconciliation began, or that did not finish; under
        the handle its launch gave it (`new_handle`). Not in a rebuild: this process made every
        launch since its start, and knows each.

        Why: its ACCEPT may never have gone out (the daemon died first), and the master's silence
        says so for agents it knew then. After a master failover it knows nothing yet of an agent
        that has not re-registered: a daemon SIGKILLed mid-launch queued the job again while its
        task sat on such an agent, which ran it once back. Its cost: a launch that never went out
        is held until the master answers for the agent (its offer, or `REREGISTER_GRACE`), and is
        then a lost run."""
        handle = new_handle(job_id, run)
        with self.cond:
            if self._recovered or handle in self._forgotten:  # a rebuild: this process made every launch since
                return
            nodes = [node for node, cores in slots if cores > 0]
            if all(self._agent_at(node) in self._told_agents for node in nodes):
                return  # the master told all they hold: recovery adopts what it told, or queues the job
        log.info("job %d: its launch may be on an agent the master has not heard back from: asked for by name", job_id)
        self.expect(handle, job_id, slots)

    def adopt(self, handle: str) -> None:
        """Reconciliation told this run's state; it is the daemon's now."""
        with self.cond:
            self._claimed.add(handle)

    def exit_of(self, handle: str) -> Exit:
        """The exit of the part that ended on its own (the others were killed for it), else 137."""
        with self.cond:
            return Exit(*self.runs[handle].exit())

    def logs(self, handle: str) -> str:
        with self.cond:
            return self.runs[handle].logs()

    def withdraw(self, job_id: int) -> None:
        """Its job was cancelled while its launch waited, for offers or at a gang's start barrier:
        the launch fails at once, and its parts are killed, held ones removed unstarted. Before, the
        gang was told to start, and was killed 2 s later (a helper's walkthrough)."""
        with self.cond:
            for launch in self.launches.values():
                if launch.run.job_id == job_id and not launch.failure:
                    launch.failure = "its job was cancelled"
            self.cond.notify_all()

    def kill(self, handle: str) -> None:
        with self.cond:
            run = self.runs.get(handle)
            live = [] if run is None else [t for t in run.tasks.values() if t.state in LIVE]
            for task in live:
                task.killed = True
        for task in live:
            try:
                self.client.kill(task.id, task.agent_id)
            except MesosError as exc:
                raise EngineUnavailable(f"killing task {task.id}: {exc}") from None

    def remove(self, handle: str) -> None:
        """The end is recorded: acknowledge it (the master forgets the tasks) and forget the run."""
        with self.cond:
            run = self.runs.pop(handle, None)
            if run is None:
                return
            self._forget(run)
            self._executors_leave(list(run.tasks.values()))
            live = [(t.id, t.agent_id) for t in run.tasks.values() if t.state in LIVE]
            acks = [(*t.ack, t.id) for t in run.tasks.values() if t.ack]
        for task_id, agent in live:  # never the case after an end; a requeued run's last parts
            self._kill_task(task_id, agent)
        for agent, status_uuid, task_id in acks:
            self._acknowledge(agent, status_uuid, task_id)

    # -- quotas and usage ------------------------------------------------------------
    def set_quota(self, handle: str, cpus: float) -> None:
        """Ask the run's executors for `cpus` (split over its parts as their cores) and wait for
        the values their cgroups show (`_ask`)."""
        with self.cond:
            run = self.runs.get(handle)
            if run is None:
                return
            targets = [(t, cpus * run.share(t)) for t in run.tasks.values() if t.state in LIVE]
            for task, _ in targets:  # numbered by the clock, so that they grow across restarts too
                self._quota_asks[task.id] = max(self._quota_asks.get(task.id, 0) + 1, time.time_ns())
            asked = [(task, jobs.quota_message(task.id, want, self._quota_asks[task.id])) for task, want in targets]
        try:
            shown = self._ask(asked, self._quota_answers, self.settings.quota_timeout, "a quota change")
        except NoAnswer as exc:  # that job's agent, not the cluster: the review asks again
            raise QuotaMismatch(str(exc)) from None
        wrong = []
        with self.cond:
            for task, want in targets:
                if task.id not in shown or shown[task.id][1] == jobs.NO_SUCH_TASK:
                    continue  # ended meanwhile (a gang's part killed for another's end): the next pass collects it
                task.quota, error = shown[task.id]
                if task.quota is None or abs(task.quota - want) > 1e-3 or error:
                    wrong.append(f"task {task.id}: cgroup shows {task.quota} CPUs, expected {want:g} {error}".rstrip())
        if wrong:
            raise QuotaMismatch("; ".join(wrong))

    def live_log(self, handle: str, lines: int) -> str | None:
        """The last `lines` of each part's output, asked of its executor (`_ask`), which reads its
        engine; parts are marked as at the end (`Run.logs`)."""
        with self.cond:
            run = self.runs.get(handle)
            parts = [] if run is None else sorted((p, t) for p, t in run.tasks.items() if t.state in LIVE)
        asked = [(task, jobs.log_message(task.id, lines)) for _, task in parts]
        try:
            texts = self._ask(asked, self._log_answers, LOG_TIMEOUT, "a request for output")
        except NoAnswer:
            return None  # its machine cannot read it now: the API says so
        if len(parts) == 1:
            return str(texts.get(parts[0][1].id, ""))
        text = "".join(f"[part {p}] {texts.get(task.id, '')}" for p, task in parts)
        return text if len(text) <= LIVE_LOG_BYTES else "[...]" + text[-LIVE_LOG_BYTES:]  # a wide gang's too

    def _ask(
        self, asked: list[tuple[Task, bytes]], answers: dict[str, Any], timeout: float, what: str
    ) -> dict[str, Any]:
        """Send each task's executor its message and wait for the answers `on_message` files in
        `answers`; those of tasks that ended meanwhile are left out. NoAnswer when one is still
        missing after `timeout` s: its agent is frozen or cut off, which is that job's trouble, not
        the cluster's (taken for the engine lost, it paused every pass); EngineUnavailable when the
        master refuses the message.

        Framework messages are not reliable (the master drops one for an agent it thinks
        disconnected): each is sent again every `MESSAGE_RESEND` s until answered, so what is
        asked must be safe to do twice (a quota applied again, an output read again).
        """
        with self.cond:
            for task, _ in asked:
                answers.pop(task.id, None)
                if not task.agent_id:  # expected after a restart, its agent not back yet: no one to ask
                    raise NoAnswer(f"{what} of task {task.id}: its agent is not known yet (asked again once it is)")
        deadline = time.monotonic() + timeout
        waiting = {task.id: (task, message) for task, message in asked}
        got: dict[str, Any] = {}
        while waiting:
            for task, message in waiting.values():
                try:
                    self.client.message(task.agent_id, task.id, message)  # each task has an executor of its own
                except MesosError as exc:
                    raise EngineUnavailable(f"{what} for task {task.id}: {exc}") from None
            resend = min(deadline, time.monotonic() + MESSAGE_RESEND)
            with self.cond:
                while time.monotonic() < resend and any(
                    t not in answers and task.state in LIVE for t, (task, _) in waiting.items()
                ):
                    self.cond.wait(max(0.0, resend - time.monotonic()))
                for task_id, (task, _) in list(waiting.items()):
                    if task_id in answers:
                        got[task_id] = answers.pop(task_id)
                        del waiting[task_id]
                    elif task.state not in LIVE:
                        del waiting[task_id]
            if waiting and time.monotonic() >= deadline:
                raise NoAnswer(f"no answer to {what} of task {next(iter(waiting))} in {timeout:.0f} s")
        return got

    def verify_quota(self, handle: str, cpus: float) -> bool:
        """Against the last values the executors read from the cgroups (no call: they answer every
        change). A live part whose agent is known and whose quota was never read is a mismatch: an
        expected run's agent was not back when the restart applied the quota it decided (a lending
        that ended meanwhile gave back nothing, for the rest of the run), so the review applies it."""
        with self.cond:
            run = self.runs.get(handle)
            shown = [] if run is None else [(t, t.quota, cpus * run.share(t)) for t in run.tasks.values()]
            unread = [t.id for t, value, _ in shown if value is None and t.agent_id and t.state in LIVE]
        if unread:
            raise QuotaMismatch(f"task {unread[0]}: its cgroup's quota was never read since the restart")
        read = [(task, value, want) for task, value, want in shown if value is not None]
        if not shown or len(read) < len(shown):
            return False
        for task, value, want in read:
            if abs(value - want) > 1e-3:
                raise QuotaMismatch(f"task {task.id}: cgroup shows {value} CPUs, expected {want:g}")
        return True

    def sample(self, handle: str, quota: float, now: float) -> Sample | None:
        """Over the run's parts: CPU used over CPU granted, the fullest memory, tasks done of all."""
        with self.cond:
            run = self.runs.get(handle)
            usage = None if run is None else run.usage(quota)
        return None if usage is None else Sample(*usage)


def _natural(text: str) -> tuple[str | int, ...]:
    """`text` as a sort key in which runs of digits compare as numbers ('s9' < 's10')."""
    parts = re.split(r"(\d+)", text)
    return tuple(int(part) if index % 2 else part for index, part in enumerate(parts))
