"""One INFO line per thing that happened to a job, in a form operators can grep.

Every line starts with `job=<id> event=<what>` followed by `key=value` pairs
(logfmt), so `journalctl -u cosched | grep 'job=42 '` tells a job's whole
story: accepted, started (where, with what quota), lent to or lent from,
killed and why, ended and how. Lines are written after the pass's
transaction committed: a line in the log is something the state file holds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cosched.core.events import Colocate, Kill, Launch, Reject, SetQuota
from cosched.daemon.docker_backend import shown_id
from cosched.model import Job, JobState

log = logging.getLogger("cosched.jobs")

LINE_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class PrintableLines(logging.Formatter):
    """Every message as one printable line: a message may carry a job's own words (an engine's
    refusal quotes the command), and an operator tails the log in a terminal. A job's escape
    sequences retitled and cleared it, and a newline could forge a line (a helper's audit).
    A traceback keeps its lines, but not a control character its exception's words may hold."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = _printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return "\n".join(_printable(line) for line in super().formatException(ei).split("\n"))


def _printable(text: str) -> str:
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def log_to_stderr() -> None:
    """The daemon's and the Mesos executor's logging: INFO and up, one printable line each."""
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableLines(LINE_FORMAT))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def _line(job_id: int, event: str, **fields: Any) -> str:
    pairs = " ".join(f"{key}={_value(value)}" for key, value in fields.items() if value is not None)
    return f"job={job_id} event={event}" + (f" {pairs}" if pairs else "")


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    text = str(value)
    # quoted (JSON escapes control characters) when it has a separator or is not all printable:
    # a value is often a job's own words, and an operator tails this log in a terminal
    plain = text.isprintable() and not any(c in text for c in ' "=\\')
    return text if text and plain else json.dumps(text)


def accepted(job_id: int, spec: Mapping[str, Any], workflow: int | None = None, user: str = "") -> None:
    log.info(
        _line(
            job_id,
            "accepted",
            user=user or None,
            workflow=workflow,
            cores=spec.get("cores"),
            walltime=spec.get("walltime"),
            image=spec.get("image"),
            app_class=spec.get("app_class"),
        )
    )


def refused(path: str, problem: str) -> None:
    """A submission refused: it has no job id, so the line names the endpoint it came to."""
    log.info(f"submission=refused path={path} reason={_value(problem)}")


def cancel_asked(job_id: int, state: str, caller: str) -> None:
    """Who asked for a job's end: an operator reading the journal can tell whose cancel it was."""
    log.info(_line(job_id, "cancel_asked", state=state, by=caller or None))


def hold_asked(job_id: int, held: bool, caller: str) -> None:
    log.info(_line(job_id, "held" if held else "released", by=caller or None))


def requeue_asked(job_id: int, caller: str) -> None:
    log.info(_line(job_id, "requeue_asked", by=caller or None))


def updated(job_id: int, walltime: float, caller: str) -> None:
    log.info(_line(job_id, "updated", walltime=walltime, by=caller or None))


def ended(job: Job, exit_code: int | None, reason: str) -> None:
    state = job.state.value if job.state is not JobState.RUNNING else "failed"
    log.info(_line(job.id, "ended", state=state, exit_code=exit_code, reason=reason or None))


def running(job_id: int, container: str) -> None:
    """Its launch finished: the engine runs it (a refused launch ends it instead, `ended`)."""
    log.info(_line(job_id, "running", container=shown_id(container)))


def requeued(job_id: int, reason: str) -> None:
    """Its run was lost to its machine, not ended by the job: it waits in the queue again."""
    log.info(_line(job_id, "requeued", reason=reason or None))


def decided(
    actions: Iterable[Any],
    cpus_of: Mapping[int, Sequence[int]],
    kill_reason: Mapping[int, str],
    cancelled: Iterable[tuple[int, str]] = (),
) -> None:
    """The pass's decisions, once they are in the state file; `cancelled`: pending jobs it cancelled, with why."""
    for job_id, reason in cancelled:
        log.info(_line(job_id, "cancelled", reason=reason))
    for action in actions:
        if isinstance(action, Launch):  # `running` once the engine has started it (`running`)
            log.info(_line(action.job.id, "launching", cpus=cpus_of.get(action.job.id), quota=action.job.quota))
        elif isinstance(action, Colocate):
            job_id = action.guest.id
            log.info(_line(job_id, "colocated", host=action.host_id, cpus=cpus_of.get(job_id), quota=action.quota))
        elif isinstance(action, SetQuota):
            log.info(_line(action.job_id, "quota", cpus=action.cpus))
        elif isinstance(action, Kill):
            log.info(_line(action.job_id, "kill", reason=kill_reason.get(action.job_id)))
        elif isinstance(action, Reject):
            log.info(_line(action.job.id, "rejected", reason=action.reason))
