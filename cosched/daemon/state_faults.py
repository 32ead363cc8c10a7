"""The state file failing under a running daemon (disk full, read-only, deleted or replaced), and the way back.

Why its own module: a job accepted must never be lost, so while the state file
cannot be written the pass stops before acting on what it could not record, and
submissions are refused (`submissions`). Once a write succeeds again, the daemon
is rebuilt from the store as a restart would (`Daemon.rebuild`): the store holds
nothing that was not done. What each fault looks like: docs/daemon-faults.md.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cosched.daemon.store import StateError

if TYPE_CHECKING:
    from cosched.daemon.service import Daemon

log = logging.getLogger("cosched.daemon")


def usable(daemon: Daemon) -> bool:
    """False while the state file is lost or cannot be written.

    A pass that could not write its decisions has stepped the core all the
    same; once a write succeeds again, core and daemon are rebuilt from the
    store, which holds nothing that was not done: before the next pass, as
    after any failed pass (`scheduling._rebuilt`, which waits for launches
    under way without holding the lock the API needs).
    """
    try:
        daemon.store.check()
        if daemon.state_problem:
            daemon.store.probe()
            log.warning("state file %s is writable again; rebuilding from it", daemon.store.path)
            daemon.rebuild_due, daemon.retry_at = True, 0.0
            daemon.state_problem = ""
    except StateError as exc:
        failed(daemon, exc)
        return False
    return True


def failed(daemon: Daemon, exc: StateError) -> None:
    problem = str(exc)
    if daemon.state_problem.startswith(problem):
        return
    if "deleted" in problem or "replaced" in problem:
        try:
            problem += f"; what it held is copied to {daemon.store.rescue()}: put that back and restart"
        except Exception as rescue_failed:  # reported, never raised: the cause matters more
            problem += f"; no copy could be made ({rescue_failed})"
    daemon.state_problem = problem
    log.error("%s; scheduling and submissions stop until it is fixed", problem)
