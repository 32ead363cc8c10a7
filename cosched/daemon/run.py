"""`cosched daemon`: open the state, bind the port, reach Docker, then serve until SIGTERM.

The checks run in the order an operator fixes them, each failing with one line:
a bad config key, a port in use (checked before the state file is created, so
a refused start leaves nothing behind), a state directory another daemon holds,
a state directory that cannot be written, an engine that does not answer. The
periodic work (scheduling pass, usage sampling, review of walltimes and quotas,
reconciliation with Docker) runs on APScheduler in background threads; the HTTP
API runs on uvicorn in the main thread, which turns SIGTERM and SIGINT into a
graceful stop. Running containers are left running: the next start adopts them.
"""

from __future__ import annotations

import faulthandler
import fcntl
import logging
import math
import os
import signal
import socket
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import uvicorn
from apscheduler.schedulers.background import BackgroundScheduler

from cosched.daemon import journal, tls
from cosched.daemon.api import create_app
from cosched.daemon.config import DaemonConfig
from cosched.daemon.http_protocol import guarded_protocol
from cosched.daemon.sandbox import state_dir_problem
from cosched.daemon.service import Daemon
from cosched.errors import ConfigError

log = logging.getLogger("cosched.daemon")


def bind(host: str, port: int) -> socket.socket:
    """The API's listening socket, made here so that a taken port is a clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # without it every keep-alive response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} (port in use? set api.port)"
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def hold_state_dir(state_dir: Path) -> int | None:
    """Lock the state directory for this daemon's life (the descriptor returned; the kernel lets
    go when the process ends, however it ends). A second daemon on one state directory (another
    config, another port) adopted the first one's containers and recorded each job that ended
    under the other as failed, `container disappeared`: it is refused with one line instead.

    The lock is a file only the daemon's user may open: any user who could read the directory
    could lock the directory itself and keep the daemon from starting again. A directory another
    user could replace is refused first (`sandbox.state_dir_problem`). None when the directory
    cannot be made or opened: the state file's own check names that."""
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    if problem := state_dir_problem(os.path.abspath(state_dir)):
        raise ConfigError(f"daemon.state_dir {problem}")
    try:
        fd = os.open(state_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"state directory {state_dir} is in use by another cosched daemon: stop that one, "
            "or give this one a daemon.state_dir of its own"
        ) from None
    except OSError:  # a file system without locks: nothing to refuse on
        pass
    return fd


def _stopping(sig: int, frame: object) -> None:
    log.info("cosched daemon stopping (%s)", signal.Signals(sig).name)


def periodic(daemon: Daemon) -> BackgroundScheduler:
    """The periodic jobs, never overlapping themselves, skipped rather than queued when late."""
    intervals = daemon.config.intervals
    scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None})
    now = datetime.now()
    passes = _passes(daemon, scheduler, intervals.schedule)
    scheduler.add_job(passes, "interval", seconds=intervals.schedule, id="schedule", next_run_time=now)
    scheduler.add_job(daemon.sample, "interval", seconds=intervals.sample, id="sample", next_run_time=now)
    # At once too: a restart kills what passed its walltime, or was asked to run again, while it was down.
    scheduler.add_job(daemon.review, "interval", seconds=intervals.review, id="review", next_run_time=now)
    scheduler.add_job(daemon.reconcile, "interval", seconds=intervals.reconcile, id="reconcile")
    if daemon.config.daemon.keep_ended_days > 0 or daemon.config.daemon.keep_decisions_days > 0:
        scheduler.add_job(daemon.purge, "interval", hours=1, id="purge", next_run_time=now)
    return scheduler


def _passes(daemon: Daemon, scheduler: BackgroundScheduler, every: float) -> Callable[[], None]:
    """The scheduling pass, and another at the time the core asked for (`Decision.wake_at`: a held
    job's begin, a latest start, a placement window's end) when that comes before the next regular
    one, as replay steps at it: with `intervals.schedule` at 30 s, a begin was kept up to 30 s late."""

    def run() -> None:
        daemon.schedule()
        # Taken, not read: a pass that stops before the core's step (the engine or the state file
        # down, a rebuild waiting) asks for nothing, and a time read again and again was a pass
        # scheduled at once, again and again (the review measured 7,270 in 1.2 s).
        at, daemon.wake_at = daemon.wake_at, math.inf
        if at - daemon.clock() < every:  # (inf: none asked for)
            when = datetime.fromtimestamp(at)
            scheduler.add_job(run, "date", run_date=when, id="wake", replace_existing=True)

    return run


def serve(config: DaemonConfig) -> None:
    journal.log_to_stderr()
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    # A fatal signal (SIGBUS when SQLite's shared-memory file is truncated under it) then
    # prints where every thread was instead of ending the daemon without a word.
    faulthandler.enable()
    https = tls.server_context(config.api)  # before anything: a bad key file stops it with nothing bound
    sock = bind(config.api.host, config.api.port)  # before the state file: a taken port leaves nothing behind
    held = None
    try:
        held = hold_state_dir(config.state_dir)
        daemon = Daemon(config)
        app = create_app(daemon)  # before the start: a bad api.key_file stops it with nothing launched
    except BaseException:
        sock.close()
        if held is not None:
            os.close(held)
        raise
    daemon.start()
    scheduler = periodic(daemon)
    scheduler.start()
    log.info(
        "cosched daemon %s: %d node(s) x %d cores, API on %s://%s:%d, state in %s",
        daemon.instance,
        daemon.cluster.nodes,
        daemon.cluster.cores_per_node,
        "https" if https is not None else "http",
        config.api.host,
        config.api.port,
        config.state_dir,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            http=guarded_protocol(config.api.header_timeout, config.api.max_connections, https),
            log_level="warning",
            log_config=None,  # its lines through the daemon's handler: printable (`journal.PrintableLines`)
            access_log=False,
            lifespan="off",
            # Over HTTPS asyncio's own loop: uvloop (0.23) starts reading a new connection after
            # its protocol's connection_made even when that paused it, so the ClientHello went to
            # the protocol instead of the handshake it starts (`http_protocol`).
            loop="auto" if https is None else "asyncio",
        )
    )
    # uvicorn turns SIGTERM/SIGINT into a graceful shutdown, then raises the signal again with
    # the handler that was there before it: with the default one the process would die of it
    # (-15) before the stop below. A no-op handler makes that re-raise harmless: exit 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stopping)
    try:
        server.run(sockets=[sock])
    finally:
        scheduler.shutdown(wait=True)
        daemon.close()
        if held is not None:
            os.close(held)
        log.info("cosched daemon stopped; running containers keep running")
