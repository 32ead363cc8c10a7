"""Nodes an operator takes out of service (Slurm's DRAIN): no job starts there any more, the jobs
running there finish, and `resume` gives the node back.

Why this shape: a drained node is held back whole by the rule that already holds back what other
frameworks take of a Mesos agent (`nodes._shared`): what it has free leaves the core's pool at
the next pass, and what its running jobs hold is owed, cut from their ends. The core is told
which running jobs' ends give back less (`Scheduler.withhold`), so no backfill reservation
counts on a drained node's cores. Drains are in the state file: a restarted daemon keeps its
nodes drained, with their reasons. Only an operator drains or resumes (with per-user tokens,
`api.operators`), as only root runs `scontrol update state=drain`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from cosched.daemon.identity import Caller
from cosched.daemon.store import Store
from cosched.daemon.submissions import Forbidden, Rejected
from cosched.errors import CoschedError
from cosched.model import Allocation, Cluster, Job, JobState
from cosched.reporting.report import shortened

if TYPE_CHECKING:
    from cosched.daemon.ends import End
    from cosched.daemon.service import Daemon

log = logging.getLogger("cosched.daemon")

KEY = "drained_nodes"
"""The state file's meta key: node -> Drain, as JSON."""
MAX_REASON = 200
BY_DAEMON = "cosched"
"""Who drained a node the daemon drained itself (`faulty`)."""


class NoSuchNode(CoschedError):
    """A node number outside the cluster."""


class NotDrained(CoschedError):
    """`resume` of a node that is in service."""


@dataclass(frozen=True)
class Drain:
    reason: str
    since: float
    by: str
    """Who drained it ('' without user tokens)."""
    host: str = ""
    """The machine drained: on Mesos the node's agent's hostname ('' on one host, whose nodes are
    parts of it). A Mesos node is whichever agent holds it, so the drain follows the machine."""


def load(store: Store, nodes: int) -> dict[int, Drain]:
    """The drained nodes the state file holds, of the `nodes` the cluster has now. Draining a node
    is how an operator empties it before taking it out of `cluster.nodes`: its drain then names a
    node the core has not, and every pass failed on it (an operator's walkthrough). It is
    forgotten, with a line, in the file too. A drained Mesos agent's waits for `follow`, once the
    agents are known: it may hold another node now."""
    saved = store.get_meta(KEY) or {}
    drained = {int(node): Drain(**fields) for node, fields in saved.items()}
    gone = sorted(n for n, entry in drained.items() if n >= nodes and not entry.host)
    for node in gone:
        log.warning(
            "node %d was drained (%s) and is no longer in the cluster (%d nodes): its drain is forgotten",
            node,
            drained.pop(node).reason,
            nodes,
        )
    if gone:  # in the file too: kept, it came back with the node once `nodes` was raised again
        with store.transaction() as db:
            store.set_meta(db, KEY, _stored(drained))
    return drained


def hosts(store: Store) -> frozenset[str]:
    """The machines drained (Mesos agents' hostnames), from the state file: an agent being taken
    out must not be the one a mapping of the nodes anew keeps (`MesosBackend`'s `put_last`)."""
    saved = store.get_meta(KEY) or {}
    return frozenset(str(fields.get("host", "")) for fields in saved.values()) - {""}


def follow(daemon: Daemon) -> None:
    """Under `lock`, at the start and when nodes changed: each drain of a machine goes to the node that
    machine holds now, and one whose machine holds none is forgotten, with a line. A drain held a
    node number: a spare agent that took the node of a drained one that went away was drained in
    its place, and a mapping anew with fewer nodes moved it onto another machine (a walkthrough)."""
    names = [status.name for status in daemon.backend.node_status()]
    if not names:  # one host: its nodes are parts of it, not machines
        return
    followed: dict[int, Drain] = {}
    for node, entry in sorted(daemon.drained.items()):
        if not entry.host:  # drained before drains named their machine
            if node < len(names):
                followed[node] = entry
            continue
        if entry.host in names:
            followed[names.index(entry.host)] = entry
            continue
        now = f"agent {names[node]} holds node {node} now" if node < len(names) and names[node] else "it is gone"
        log.warning("the drain of agent %s (%s) is forgotten: it holds no node (%s)", entry.host, entry.reason, now)
    if followed != daemon.drained:
        for node, entry in followed.items():
            if daemon.drained.get(node) != entry:
                log.info("node %d is drained: agent %s holds it (%s)", node, entry.host, entry.reason)
        _save(daemon, followed)


def _host_of(daemon: Daemon, node: int) -> str:
    """The machine behind `node`: a Mesos agent's hostname, '' on one host."""
    names = [status.name for status in daemon.backend.node_status()]
    return names[node] if node < len(names) else ""


def drain(daemon: Daemon, node: int, reason: str, caller: Caller) -> Drain:
    """Take `node` out of service from the next pass on; draining it again replaces the reason."""
    _check(daemon, node, caller, "drain")
    reason = reason.strip()
    if not reason or len(reason) > MAX_REASON or not reason.isprintable():
        raise Rejected("reason", f"say why, in 1 to {MAX_REASON} printable characters")
    with daemon.lock:
        entry = Drain(reason, daemon.clock(), caller.user, _host_of(daemon, node))
        _save(daemon, {**daemon.drained, node: entry})
    log.warning("node %d drained%s: %s", node, f" by {caller.user}" if caller.user else "", reason)
    return entry


def resume(daemon: Daemon, node: int, caller: Caller) -> Drain:
    """Give a drained node back to the core at the next pass; the drain it ends."""
    _check(daemon, node, caller, "resume")
    with daemon.lock:
        entry = daemon.drained.get(node)
        if entry is None:
            raise NotDrained(f"node {node} is not drained")
        _save(daemon, {n: d for n, d in daemon.drained.items() if n != node})
    log.warning(
        "node %d resumed%s (drained since %.0f: %s)",
        node,
        f" by {caller.user}" if caller.user else "",
        entry.since,
        entry.reason,
    )
    return entry


def faulty(daemon: Daemon, ended: list[End]) -> None:
    """Under `lock`: drain each node whose machine could not start a run at all (a Mesos agent whose
    engine cannot be reached), as Slurm drains a node a launch failed on. Else first fit sent the
    requeued job, and every later one, back there until each had lost `MAX_LOST_RUNS` runs and
    failed. Only an operator resumes it, once the machine is mended."""
    for end in ended:
        for node in end.faulty_nodes:
            if node not in daemon.drained:
                detail = end.reason.rsplit("could not start: ", 1)[-1]  # the machine's words, not the layers
                why = f"job {end.job.id} could not start there: {detail}"
                entry = Drain(shortened(why, MAX_REASON), daemon.clock(), BY_DAEMON, _host_of(daemon, node))
                _save(daemon, {**daemon.drained, node: entry})
                log.warning("node %d drained by cosched: %s", node, why)  # whole


def _check(daemon: Daemon, node: int, caller: Caller, verb: str) -> None:
    if not 0 <= node < daemon.cluster.nodes:
        raise NoSuchNode(f"node {node}: no such node (the cluster has nodes 0 to {daemon.cluster.nodes - 1})")
    if not caller.operator:
        raise Forbidden(f"node {node}: only an operator may {verb} a node, not {caller.user}")


def _stored(drained: dict[int, Drain]) -> dict[str, Any]:
    return {str(node): asdict(entry) for node, entry in sorted(drained.items())}


def _save(daemon: Daemon, drained: dict[int, Drain]) -> None:
    """Under `lock`: the state file first, then memory (a failed write changes nothing)."""
    with daemon.store.transaction() as db:
        daemon.store.set_meta(db, KEY, _stored(drained))
    daemon.drained = drained


def withheld(daemon: Daemon) -> dict[int, int]:
    """Running job -> the units of it on drained nodes, which its end will not give back."""
    if not daemon.drained:
        return {}
    cluster = daemon.cluster
    out = {}
    for job in daemon.core.jobs.values():
        if job.state is JobState.RUNNING and (units := _units_on(job, daemon.drained, cluster)):
            out[job.id] = units
    return out


def _units_on(job: Job, nodes: dict[int, Any], cluster: Cluster) -> int:
    if cluster.allocation is Allocation.NODE:
        return sum(1 for node, cores in job.slots if cores and node in nodes)
    return sum(cores for node, cores in job.slots if node in nodes)


def row(daemon: Daemon, node: int, busy: bool) -> dict[str, Any] | None:
    """A node's drain for `/v1/nodes`: reason, since, by, and whether jobs still run there (draining)
    or none does (drained); None for a node in service."""
    entry = daemon.drained.get(node)
    if entry is None:
        return None
    return {**asdict(entry), "state": "draining" if busy else "drained"}
