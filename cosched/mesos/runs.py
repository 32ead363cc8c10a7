"""A job's run on Mesos as its tasks' status updates tell it. Pure: updates and time in, verdicts out.

A run is one launch of one job: a task per agent its slots span (a gang), each with an executor
of its own. The rules here decide, for the daemon, whether a run still runs, was ended by the
job (an exit code, or our KILL), or was lost to its machines (an agent gone, an executor
killed): a lost run's job is queued again, so telling the two apart is what keeps a job from
failing for its machine's sake, and from running twice. Their unit tests need no cluster.

- A terminal update from our executor is the job's own end (TASK_FAILED with its exit code,
  or `could not start`), except TASK_KILLED the framework did not ask for (the executor removed
  its container on its way out): lost. One it asked for says so (`asked`), so a daemon restarted
  before it recorded a walltime kill's end does not take it for a lost run and run the job again.
- A terminal state the agent or the master made (the executor died, the agent is gone) is
  lost. While the agent is there, a killed executor's container may still run (Docker runs
  it): such a task waits for a `sweep` of its agent before it counts as lost, unless the sweep
  found its container ended on its own: then it ended as its exit code says. An agent the
  master lost may only be cut off (frozen, partitioned) with its executor and container running
  on: its task waits `fence_wait` (the `fence` its executor stops its jobs after, with a margin)
  before it counts as lost, and is live again if the agent comes back meanwhile. Counted lost
  at once, a partition of 20 s ran the job twice for 20 s (a helper's run on a real master).
- A terminal state known only from reconciliation (the master's summary, no exit code) waits
  `RECONCILED_GRACE` for the agent's own update, which comes again until acknowledged.
- A gang is whole or nothing: when a part is lost or failed, the live parts are killed; the
  run is lost if a part was lost (or never heard of), else it ended as its failed part did.
- A gang's parts are held (TASK_STARTING: made, not started) until every part is; then each is
  told to start (`to_start`). A gang that never started and never can start whole (a part never
  launched, or ended unstarted) is `created`, as a container made and never started: a restarted
  daemon removes it and queues the job again, which never ran (the daemon died between two
  agents' ACCEPTs).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

RECONCILED_GRACE = 15.0
"""Seconds a terminal state known only from reconciliation waits for the agent's own update."""

LIVE = frozenset({"TASK_STAGING", "TASK_STARTING", "TASK_RUNNING", "TASK_KILLING"})
GONE = frozenset(
    {"TASK_LOST", "TASK_UNREACHABLE", "TASK_GONE", "TASK_GONE_BY_OPERATOR", "TASK_DROPPED", "TASK_UNKNOWN"}
)
HELD = frozenset({"TASK_STAGING", "TASK_STARTING"})
"""States of a gang's part that has not started: our executor holds it until told (`to_start`)."""
AGENT_GONE = frozenset({"REASON_AGENT_REMOVED", "REASON_SLAVE_REMOVED", "REASON_AGENT_REMOVED_BY_OPERATOR"})
"""Reasons of a lost task that say its agent was removed."""

Outcome = Literal["live", "ended", "lost", "sweep", "fence"]

FENCE_MARGIN = 30.0
"""Seconds added to an executor's fence before its lost agent's task counts as lost: the executor
notices a silent agent by a report that fails (one per sample interval, each given 10 s), and its
watch may be held up by another such call before it stops the job."""


def own_end(data: Mapping[str, Any]) -> tuple[str, str]:
    """(state, message) of a task whose container ended on its own, by its end's `data` (exit code,
    oom): whether its executor collected it, or a sweep found it ended (`Task.found_ended`)."""
    if data["exit_code"] == 0:
        return "TASK_FINISHED", ""
    return "TASK_FAILED", "out of memory" if data["oom"] else f"exit code {data['exit_code']}"


def fence_wait(fence: float) -> float:
    """How long a task of an agent the master lost waits before it counts as lost."""
    return fence + FENCE_MARGIN


_TASK = re.compile(r"^(cosched-job-(\d+)(?:-r(\d+))?(?:-[0-9a-f]+)?)-(\d+)of(\d+)-(\d+)c$")
"""Handles made before they were the run's alone carry a random suffix; they still parse."""


class TaskName(NamedTuple):
    """What a task id says: whose run it is, which part of how many, and its cores."""

    job_id: int
    handle: str
    part: int
    parts: int
    cores: int
    run: int | None = None
    """The job's run (`Store.begin_run`); None in a handle made before runs were numbered."""


def new_handle(job_id: int, run: int) -> str:
    """A run's handle: each launch of a job is a new run (`Store.begin_run`, committed before it), so
    a late update of an old one is told apart; the run's number in it tells a restarted daemon which
    one the state file began last. Nothing random in it: a restarted daemon names the tasks of a
    launch it recorded and never saw the end of (`MesosBackend.expect_launch`)."""
    return f"cosched-job-{job_id}-r{run}"


def part_id(handle: str, part: int, parts: int, cores: int) -> str:
    """Part, part count and cores in the id: a restarted daemon rebuilds a gang from reconciliation alone."""
    return f"{handle}-{part}of{parts}-{cores}c"


def parse_task(task: str) -> TaskName | None:
    match = _TASK.match(task)
    if match is None:
        return None
    run = int(match[3]) if match[3] is not None else None
    return TaskName(int(match[2]), match[1], int(match[4]), int(match[5]), int(match[6]), run)


@dataclass
class Task:
    id: str
    job_id: int
    agent_id: str
    cores: int
    state: str = "TASK_STAGING"
    message: str = ""
    reason: str = ""
    source: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    reconciled: float | None = None
    """When a terminal state came from reconciliation only (no exit code yet)."""
    quota: float | None = None
    """What the executor last read from the cgroup."""
    usage: dict[str, Any] | None = None
    ran: bool = False
    """It was TASK_RUNNING once."""
    killed: bool = False
    """We asked for its end."""
    swept: bool = False
    """A sweep of its agent ran after it ended: nothing of it runs on."""
    ack: tuple[str, str] | None = None
    """(agent, uuid) of its terminal update, acknowledged once the daemon recorded the end."""
    executor_gone: bool = False
    """The master said its executor terminated (FAILURE): it holds nothing on its agent any more."""
    size: tuple[float, float] | None = None
    """(cpus, MiB) it holds on its agent with its executor; None when known only from reconciliation
    until the daemon tells its job's size (`MesosBackend.size`)."""
    stopped: float | None = None
    """When an update first said it no longer runs (the daemon's monotonic clock)."""
    learnt: float = 0.0
    """When an update first told of it, for a task this daemon did not launch (0: launched here)."""
    found: bool = False
    """Its end was found by a sweep (`found_ended`): the job's own, whatever the agent says."""
    told: float | None = None
    """When the framework last told it, a held part, to start (monotonic)."""

    def apply(self, status: Mapping[str, Any], now: float) -> None:
        """A status update; reconciliation's summary of a state we know better is ignored."""
        if self.found:  # the agent's word (executor terminated), which it resends until acknowledged
            return
        reconciled = status.get("reason") == "REASON_RECONCILIATION"
        if reconciled and self.state not in LIVE and self.reconciled is None:
            return
        self.state = status["state"]
        self.stopped = None if self.state in LIVE else self.stopped if self.stopped is not None else now
        self.ran = self.ran or self.state == "TASK_RUNNING"
        self.message = status.get("message", "")
        self.reason = status.get("reason", "")
        self.source = status.get("source", "")
        self.agent_id = status.get("agent_id", {}).get("value", "") or self.agent_id
        self.reconciled = now if reconciled and self.state not in LIVE else None
        if status.get("data"):
            try:
                self.data.update(json.loads(base64.b64decode(status["data"])))
            except (ValueError, binascii.Error):
                self.message = self.message or "undecodable status data"

    def found_ended(self, data: Mapping[str, Any]) -> None:
        """Its container had ended on its own while its executor was dead, as a sweep found it: the
        job's end, as its executor would have told it (a job that finished then ran again)."""
        self.state, self.message = own_end(data)
        self.source, self.reason, self.reconciled = "SOURCE_EXECUTOR", "", None
        self.data.update(data)
        self.found = True

    def outcome(self, agent_gone: bool, now: float, fence_wait: float = 0.0) -> Outcome:
        """live, ended (by the job, or by our kill), lost (not by the job), sweep (lost once a
        sweep of its agent shows nothing of it runs on) or fence (lost once `fence_wait` s have
        passed since its agent was lost: its executor has stopped it by then)."""
        state = self.state
        if state in LIVE:
            return "live"
        if self.reconciled is not None and state not in GONE:
            return "live" if now - self.reconciled < RECONCILED_GRACE else "ended"
        if state in ("TASK_FINISHED", "TASK_ERROR") or self.killed:
            return "ended"
        if state == "TASK_DROPPED":  # never delivered: its executor never started
            return "lost"
        if self.source == "SOURCE_EXECUTOR":  # a kill the framework asked for, in this daemon's life or before
            asked = state == "TASK_KILLED" and self.data.get("asked") is True
            return "ended" if state == "TASK_FAILED" or asked else "lost"  # else our executor removed what it ran
        if self.swept:
            return "lost"
        if not agent_gone:
            return "sweep"
        waited = now - (self.stopped if self.stopped is not None else now)
        return "lost" if waited >= fence_wait else "fence"


class RunState(NamedTuple):
    state: str
    """running, exited, lost, or created: a gang that never started (ContainerInfo's words)."""
    note: str
    kill: list[Task]
    """Live parts of a broken gang, to kill."""
    sweep: list[Task]
    """Parts waiting for a sweep of their agent."""


class StartFailure(NamedTuple):
    verdict: Literal["refused", "lost", "settling"]
    failed: tuple[Task, ...]
    """Its parts that failed before they ran."""
    settling: tuple[Task, ...] = ()
    """Of them, those that may still run (`Run.start_failure`)."""

    @property
    def why(self) -> str:
        first = self.failed[0]
        return f"{first.state}: {first.message or first.reason or 'no message'}"


@dataclass
class Run:
    """One launch of one job: a task per agent of its slots."""

    handle: str
    job_id: int
    parts: int
    tasks: dict[int, Task] = field(default_factory=dict)
    run: int | None = None
    """The job's run it is (`TaskName.run`)."""
    told: float | None = None
    """When its held parts were first told to start (monotonic): from then on each part's executor
    decides, and says, whether it started (`JobPayload.hold`)."""

    def share(self, task: Task) -> float:
        """The task's part of the job's quota: its cores over the run's."""
        total = sum(t.cores for t in self.tasks.values())
        return task.cores / total if total else 1.0

    def state(
        self, agent_gone: Callable[[str], bool], now: float, names: Mapping[str, str], fence_wait: float = 0.0
    ) -> RunState:
        if self.never_started():
            return RunState("created", "its gang never started whole", [], [])
        outcomes = {part: task.outcome(agent_gone(task.agent_id), now, fence_wait) for part, task in self.tasks.items()}
        missing = self.parts - len(self.tasks)  # parts the master never heard of
        live = [t for p, t in self.tasks.items() if outcomes[p] == "live"]
        broken = missing > 0 or any(o in ("lost", "sweep", "fence") for o in outcomes.values())
        broken = broken or any(o == "ended" and self.tasks[p].state != "TASK_FINISHED" for p, o in outcomes.items())
        if live:
            return RunState("running", "", [t for t in live if not t.killed] if broken else [], [])
        waiting = [t for p, t in self.tasks.items() if outcomes[p] == "sweep"]
        if waiting:
            return RunState("running", "waiting for a sweep of its agent", [], waiting)
        fencing = [t for p, t in self.tasks.items() if outcomes[p] == "fence"]
        if fencing:
            where = names.get(fencing[0].agent_id, fencing[0].agent_id)
            return RunState("running", f"agent {where} lost: waiting for its executor to stop the job", [], [])
        lost = [t for p, t in self.tasks.items() if outcomes[p] == "lost"]
        if lost:
            first = lost[0]
            where = names.get(first.agent_id, first.agent_id)
            return RunState("lost", f"{first.state} on {where}: {first.message or first.reason or '-'}", [], [])
        if missing:
            return RunState("lost", "a part was never launched", [], [])
        return RunState("exited", "", [], [])

    def never_started(self) -> bool:
        """A gang none of whose parts ran and that can never be whole: a part never reached its agent
        (the daemon died, or an ACCEPT failed, before it), or one ended unstarted (`withheld`). None
        of it started: `go` is said only once every part is held. One whose parts are all there,
        held or on their way, is adopted instead, and its parts told to start once all are held."""
        tasks = self.tasks.values()
        return (
            self.parts > 1
            and not any(t.ran for t in tasks)
            and all(t.state in HELD or t.data.get("withheld") is True for t in tasks)
            and (len(self.tasks) < self.parts or any(t.state not in HELD for t in tasks))
        )

    def holding(self) -> bool:
        """A part of it is held: made, not started, waiting to be told (TASK_STARTING)."""
        return any(not t.ran and t.state == "TASK_STARTING" for t in self.tasks.values())

    def to_start(self) -> list[Task]:
        """Its held parts, once every part is held or has run and none is being killed: the gang is
        whole. Parts that ran may have ended since: the others are told all the same (each told
        again until it runs: a framework message may be lost)."""
        tasks = self.tasks.values()
        if len(self.tasks) < self.parts or any(t.killed or not (t.ran or t.state == "TASK_STARTING") for t in tasks):
            return []
        return [t for t in tasks if not t.ran]

    def start_failure(self, outcome: Callable[[Task], Outcome]) -> StartFailure | None:
        """While the run starts: None while no part has failed before it ran. A part that failed may
        still run: its agent lost but its fence not yet past (cut off, not dead), or its executor
        killed with its container perhaps started and its agent not yet swept. Given up at once, the
        job went elsewhere beside that copy; so the run waits (`settling`) until each is settled."""
        failed = [t for t in self.tasks.values() if t.state not in LIVE and not t.ran]
        if not failed:
            return None
        outcomes = [outcome(t) for t in failed]
        if all(o == "ended" for o in outcomes):
            return StartFailure("refused", tuple(failed))  # the job itself (its image, its task), not the machines
        settling = tuple(t for t, o in zip(failed, outcomes, strict=True) if o in ("fence", "sweep"))
        return StartFailure("settling" if settling else "lost", tuple(failed), settling)

    def exit(self) -> tuple[int, float, float, bool, float | None]:
        """(code, started, finished, oom, CPU seconds): the part that ended on its own (the others were
        killed for it); CPU seconds of every part, as its executor last sampled it (None if none did)."""
        tasks = list(self.tasks.values())
        own = [t for t in tasks if not t.killed] or tasks
        failed = [t for t in own if t.state != "TASK_FINISHED"]
        first = failed[0] if failed else own[0]
        code = first.data.get("exit_code")
        if code is None:
            code = 0 if first.state == "TASK_FINISHED" else 137 if first.state == "TASK_KILLED" else -1
        started = min((float(t.data.get("started", 0.0)) for t in tasks), default=0.0)
        finished = max((float(t.data.get("finished") or 0.0) for t in tasks), default=0.0)
        sampled = [float(t.data["cpu_seconds"]) for t in tasks if t.data.get("cpu_seconds") is not None]
        cpu_seconds = sum(sampled) if sampled else None
        return int(code), started, finished, any(bool(t.data.get("oom")) for t in tasks), cpu_seconds

    def logs(self) -> str:
        parts = sorted(self.tasks.items())
        if len(parts) == 1:
            task = parts[0][1]
            return str(task.data.get("log_tail") or task.message)
        return "\n".join(f"[part {p}] {t.data.get('log_tail') or t.message}" for p, t in parts)

    def usage(self, quota: float) -> tuple[float, float, int, int] | None:
        """(cpu over quota, fullest memory, tasks done, tasks) over its parts; None until each reported
        under its share of `quota`. An executor samples every few seconds: its last sample may be
        from before a quota change, of a job that no longer is (a host that lent since, a guest whose
        host left), and ASAx judges a job only on a sample under its current quota."""
        parts = [(self.share(t), t.usage) for t in self.tasks.values()]
        if not parts or any(usage is None for _, usage in parts):
            return None
        if any(abs(float(u.get("quota", share * quota)) - share * quota) > 1e-3 for share, u in parts if u):
            return None
        used = [(share, u) for share, u in parts if u is not None]
        return (
            sum(share * float(u["cpu"]) for share, u in used),
            max(float(u["mem"]) for _, u in used),
            sum(int(u["done"]) for _, u in used),
            sum(int(u["total"]) for _, u in used),
        )
