"""Bodies of the v1 scheduler calls, as JSON-ready dicts (field names are scheduler.proto's).

Pure functions, one per call type, so that what goes on the wire is written in one place and can be
checked without a master. The client adds `framework_id` to every call but SUBSCRIBE's first one.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any

Json = dict[str, Any]

WEEK_SECONDS = 7 * 24 * 3600.0


def value(v: str) -> Json:
    """Mesos ID messages (FrameworkID, OfferID, TaskID, AgentID, ExecutorID) are `{"value": ...}`."""
    return {"value": v}


def framework_info(
    *,
    name: str,
    user: str,
    framework_id: str | None,
    failover_timeout: float = WEEK_SECONDS,
    roles: Iterable[str] = (),
    hostname: str | None = None,
    principal: str = "",
) -> Json:
    """A checkpointing framework that the master keeps (tasks included) for `failover_timeout` after it leaves;
    `principal` is the one it authenticates as (a master checks that they agree)."""
    info: Json = {"name": name, "user": user, "checkpoint": True, "failover_timeout": float(failover_timeout)}
    if principal:
        info["principal"] = principal
    roles = list(roles)
    if roles:  # offered what is reserved for them too, refined reservations included (`carve` copies both formats)
        info["roles"] = roles
        info["capabilities"] = [{"type": "MULTI_ROLE"}, {"type": "RESERVATION_REFINEMENT"}]
    if hostname:
        info["hostname"] = hostname
    if framework_id:
        info["id"] = value(framework_id)
    return info


def role_problem(role: str) -> str | None:
    """Why the master would refuse `role` as a framework's role (its rules, `roles::validate`); None if valid."""
    if role == "*":
        return None
    if role.startswith("/") or role.endswith("/") or "//" in role or not role:
        return "a role is components joined by single slashes, with none at either end"
    for component in role.split("/"):
        if component in (".", "..", "*"):
            return f"a role cannot have {component!r} as a component"
        if component.startswith("-"):
            return f"a role component cannot start with a dash ({component!r})"
        if any(c.isspace() or c == "\b" for c in component):
            return f"a role cannot contain whitespace or backspace ({component!r})"
    return None


def subscribe(info: Mapping[str, Any]) -> Json:
    call: Json = {"type": "SUBSCRIBE", "subscribe": {"framework_info": dict(info)}}
    if "id" in info:
        call["framework_id"] = dict(info["id"])
    return call


def filters(refuse_seconds: float | None) -> Json:
    return {} if refuse_seconds is None else {"filters": {"refuse_seconds": float(refuse_seconds)}}


def launch(task_infos: Iterable[Mapping[str, Any]]) -> Json:
    """An ACCEPT operation starting tasks (each with its own command or executor)."""
    return {"type": "LAUNCH", "launch": {"task_infos": [dict(t) for t in task_infos]}}


def launch_group(executor: Mapping[str, Any], tasks: Iterable[Mapping[str, Any]]) -> Json:
    """An ACCEPT operation starting tasks together under one executor (all or none start)."""
    return {
        "type": "LAUNCH_GROUP",
        "launch_group": {"executor": dict(executor), "task_group": {"tasks": [dict(t) for t in tasks]}},
    }


def accept(offer_ids: Iterable[str], operations: Iterable[Mapping[str, Any]], refuse_seconds: float | None) -> Json:
    """Accept offers (from one agent) with operations; what the operations leave unused is declined."""
    body: Json = {"offer_ids": [value(o) for o in offer_ids], "operations": [dict(op) for op in operations]}
    return {"type": "ACCEPT", "accept": body | filters(refuse_seconds)}


def decline(offer_ids: Iterable[str], refuse_seconds: float | None) -> Json:
    """Give offers back; the master will not re-offer those resources to us for `refuse_seconds`."""
    return {"type": "DECLINE", "decline": {"offer_ids": [value(o) for o in offer_ids]} | filters(refuse_seconds)}


def kill(task_id: str, agent_id: str | None = None) -> Json:
    body: Json = {"task_id": value(task_id)}
    if agent_id:
        body["agent_id"] = value(agent_id)
    return {"type": "KILL", "kill": body}


def revive(roles: Iterable[str] = ()) -> Json:
    """Clear our refuse filters and resume offers (for `roles`, or all of ours)."""
    roles = list(roles)
    return {"type": "REVIVE", "revive": {"roles": roles}} if roles else {"type": "REVIVE"}


def suppress(roles: Iterable[str] = ()) -> Json:
    """Stop offers (for `roles`, or all of ours) until REVIVE."""
    roles = list(roles)
    return {"type": "SUPPRESS", "suppress": {"roles": roles}} if roles else {"type": "SUPPRESS"}


def reconcile(tasks: Iterable[tuple[str, str | None]] = ()) -> Json:
    """Ask for the latest state of (task_id, agent_id) pairs; no pairs means every task the master knows of ours."""
    listed = [{"task_id": value(t)} | ({"agent_id": value(a)} if a else {}) for t, a in tasks]
    return {"type": "RECONCILE", "reconcile": {"tasks": listed}}


def acknowledge(agent_id: str, task_id: str, uuid: str) -> Json:
    """Acknowledge a status update (`uuid` as received: base64 text), so the agent stops re-sending it."""
    return {
        "type": "ACKNOWLEDGE",
        "acknowledge": {"agent_id": value(agent_id), "task_id": value(task_id), "uuid": uuid},
    }


def message(agent_id: str, executor_id: str, data: bytes) -> Json:
    """Opaque bytes for one of our executors (the master relays them; delivery is not guaranteed)."""
    return {
        "type": "MESSAGE",
        "message": {
            "agent_id": value(agent_id),
            "executor_id": value(executor_id),
            "data": base64.b64encode(data).decode("ascii"),
        },
    }


def teardown() -> Json:
    """Remove the framework: the master kills all its tasks and forgets it."""
    return {"type": "TEARDOWN"}
