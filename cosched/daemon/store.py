"""The daemon's durable state: one SQLite file in WAL mode.

Why SQLite and why "write first": the daemon may be killed at any instant.
Every fact is committed *before* the action it describes is taken (a job is
`launching`, with its cpuset and quota, before its container is created; a
quota change is logged before Docker is asked), so a restarted daemon can
compare the store with what Docker reports and finish or undo each half-done
step (see `reconcile`). WAL with `synchronous=NORMAL` survives the process
being killed at any point; a power loss may lose the last commits, which
`synchronous=FULL` (the `durable_power` option) trades speed to avoid.

Each thread gets its own connection: the API's threads accept submissions
while the scheduling thread works, and WAL lets readers and one writer
proceed together.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from cosched.errors import ConfigError, CoschedError

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workflows (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    submitted REAL NOT NULL,
    state TEXT NOT NULL,
    failed_stage TEXT,
    user TEXT NOT NULL DEFAULT '',
    to_come INTEGER NOT NULL DEFAULT 0  -- stages not submitted yet (count_live)
);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    submit REAL NOT NULL,
    start REAL,
    end REAL,
    slots TEXT,
    cpus TEXT,
    quota REAL,
    host INTEGER NOT NULL DEFAULT -1,
    container TEXT,
    exit_code INTEGER,
    reason TEXT,
    log_tail TEXT,
    cancel INTEGER NOT NULL DEFAULT 0,
    launches INTEGER NOT NULL DEFAULT 0,  -- runs begun: the last one's number (begin_run)
    workflow INTEGER REFERENCES workflows(id),
    stage TEXT,
    user TEXT NOT NULL DEFAULT '',
    held INTEGER NOT NULL DEFAULT 0,
    cpu_seconds REAL,
    requeue TEXT,
    lost_runs INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_workflow ON jobs(workflow);
CREATE TABLE IF NOT EXISTS quotas (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    job_id INTEGER NOT NULL,
    cpus REAL NOT NULL,
    applied REAL
);
CREATE TABLE IF NOT EXISTS charges (
    job_id INTEGER NOT NULL,
    cpus REAL NOT NULL,
    since REAL NOT NULL,
    until REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS charges_job ON charges(job_id);
CREATE TABLE IF NOT EXISTS decisions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    guest INTEGER NOT NULL,
    host INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_guest ON decisions(guest);
CREATE INDEX IF NOT EXISTS decisions_host ON decisions(host);
CREATE TABLE IF NOT EXISTS requests (
    user TEXT NOT NULL,
    key TEXT NOT NULL,
    digest TEXT NOT NULL,
    answer TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (user, key)
);
CREATE INDEX IF NOT EXISTS requests_at ON requests(at);
"""

ADDED_COLUMNS = {
    ("jobs", "user"): "TEXT NOT NULL DEFAULT ''",
    ("workflows", "user"): "TEXT NOT NULL DEFAULT ''",
    ("jobs", "held"): "INTEGER NOT NULL DEFAULT 0",
    ("jobs", "cpu_seconds"): "REAL",
    ("jobs", "requeue"): "TEXT",
    ("jobs", "lost_runs"): "INTEGER NOT NULL DEFAULT 0",
    ("workflows", "to_come"): "INTEGER NOT NULL DEFAULT 0",
}
"""Columns newer than the first schema, added to a state file an older daemon wrote (its rows get the default)."""

REQUESTS_KEPT = 86400.0
"""Seconds a submission's `Idempotency-Key` answers a retry (a day, as payment APIs keep theirs)."""

LIVE = ("pending", "launching", "running")
_DEPENDED_ON = (
    "SELECT t FROM (SELECT json_extract(d.value, '$.{target}') AS t FROM jobs j, json_each(j.spec, '$.after') d"
    f" WHERE j.state IN {LIVE!r} UNION SELECT json_extract(d.value, '$.{{target}}')"
    " FROM workflows w, json_each(w.spec, '$.after') d WHERE w.state = 'running') WHERE t IS NOT NULL"
)
"""The jobs or workflows (`target`) named in the dependencies of live jobs and running workflows."""
FINAL = ("done", "failed", "cancelled")
_IS_LIVE = f"state IN ({', '.join('?' * len(LIVE))})"
"""A job row's condition of being live, with `LIVE` as its parameters."""
_IS_FINAL = f"state IN ({', '.join('?' * len(FINAL))})"
"""A job row's condition of having ended, with `FINAL` as its parameters."""


_NEEDED = (
    "seq > (SELECT COALESCE(MAX(seq), 0) FROM decisions) - ?"
    " OR guest IN (SELECT id FROM jobs WHERE state IN ('pending', 'launching', 'running'))"
    " OR host IN (SELECT id FROM jobs WHERE state IN ('pending', 'launching', 'running'))"
    " OR (json_extract(body, '$.loss') IS NULL AND json_extract(body, '$.host_runtime') IS NOT NULL"
    "     AND json_extract(body, '$.executed') AND json_extract(body, '$.fraction') > 0"
    "     AND COALESCE(json_extract(body, '$.note'), '') = '')"
)
"""The decisions a restarted daemon needs (one parameter: how many of the last to keep in any case).
The last clause: a lending whose lender ended and that is still to be scored; one with a note
(its lender failed or was cancelled, unscored) is settled, as `ASAx.restore` reads it, and was
reloaded, and kept from the purge, for ever."""

DECISIONS_KEPT = 256
"""Lending decisions a daemon keeps in memory and reloads at start (the store keeps all; `explain` reads them here)."""


class StateError(CoschedError):
    """The state file cannot be written or read, or is no longer the file the daemon opened."""


class Store:
    """Typed access to the state file; every write inside `transaction()`."""

    def __init__(self, path: str | Path, *, durable_power: bool = False) -> None:
        self.path = Path(path)
        self._sync = "FULL" if durable_power else "NORMAL"
        self._local = threading.local()
        self._refuse_a_lost_file()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._keep_private()
            self._make_or_upgrade()
            self._identity = self._file_identity()
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"state file {self.path} is not usable: {exc}") from None

    def _keep_private(self) -> None:
        """The state file, its WAL and shared memory: the owner's alone (0600), made so or made so now.

        It holds every job's environment (tokens, passwords a workflow needs) and log
        tail, so other users of the host must not read it. The directory is left as the
        operator made it (it may be shared); SQLite gives the WAL and shared-memory files
        the mode of the database file, and files an older daemon left readable are fixed.
        """
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        for path in (
            self.path,
            self.path.with_name(self.path.name + "-wal"),
            self.path.with_name(self.path.name + "-shm"),
        ):
            with suppress(FileNotFoundError):
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # a link's target is not ours
                try:
                    if os.fstat(fd).st_mode & 0o077:
                        os.fchmod(fd, 0o600)
                finally:
                    os.close(fd)

    def _make_or_upgrade(self) -> None:
        """The schema made, or an older file upgraded, in one transaction: killed between the
        tables' creation and the charges' back-fill, a start found `charges` there, took the file
        for an upgraded one and never back-filled it (fair-share lost its users' history)."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            self._upgrade(charged="charges" in tables or "jobs" not in tables)
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    def _upgrade(self, charged: bool) -> None:
        """Bring a state file from an older daemon up to this schema, in place, keeping every row.

        A file from before charges were saved (`charged` False) gets one per ended job's last run,
        at its cores: fair-share's counts, once, without the lendings' shifts between jobs.
        """
        conn = self._conn()
        if not charged:
            conn.execute(
                "INSERT INTO charges(job_id, cpus, since, until) SELECT id, json_extract(spec, '$.cores'), start,"
                f' "end" FROM jobs WHERE {_IS_FINAL} AND start IS NOT NULL AND "end" > start',
                FINAL,
            )
        for (table, column), declaration in ADDED_COLUMNS.items():
            present = {row["name"] for row in conn.execute(f"PRAGMA table_info({table})")}
            if column not in present:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
                if column == "to_come":
                    conn.execute(
                        "UPDATE workflows SET to_come = MAX(0, json_array_length(spec, '$.stages')"
                        " - (SELECT COUNT(*) FROM jobs WHERE jobs.workflow = workflows.id)) WHERE state = 'running'"
                    )
        for seq, body in list(conn.execute("SELECT seq, body FROM decisions WHERE NOT json_valid(body)")):
            try:  # written by a daemon before `strict_json`: `Infinity` where a lender had nothing left to do
                conn.execute("UPDATE decisions SET body = ? WHERE seq = ?", (strict_json(json.loads(body)), seq))
            except ValueError:
                raise StateError(f"lending decision {seq} in the state file is not JSON: {body[:80]!r}") from None
        conn.execute("CREATE INDEX IF NOT EXISTS jobs_user ON jobs(user, state)")  # a user's live jobs, counted
        conn.execute('CREATE INDEX IF NOT EXISTS jobs_end ON jobs("end")')  # the history, by when jobs ended
        conn.execute("CREATE INDEX IF NOT EXISTS workflows_state ON workflows(state, user)")  # their stages to come

    def _refuse_a_lost_file(self) -> None:
        """A missing state file beside its own WAL or a rescued copy was lost, not never made.

        Starting afresh there would forget every accepted job (and SQLite could
        replay the old WAL into the new file): the operator decides instead.
        """
        if self.path.exists():
            return
        wal = self.path.with_name(self.path.name + "-wal")
        rescued = sorted(self.path.parent.glob(self.path.name + ".rescued-*"))
        if wal.exists() or rescued:
            found = str(rescued[-1]) if rescued else str(wal)
            raise ConfigError(
                f"state file {self.path} is missing but {found} is there (was it deleted under a running daemon?): "
                f"put the rescued copy back as {self.path.name} and delete {wal.name} and "
                f"{self.path.name}-shm, or delete them all to start afresh"
            )

    def _file_identity(self) -> tuple[int, int]:
        info = os.stat(self.path)
        return info.st_dev, info.st_ino

    def check(self) -> None:
        """StateError if the state file was deleted or replaced since it was opened.

        SQLite keeps writing to the open (now unlinked) file, so without this
        check a daemon would accept jobs that no restart will ever see.
        """
        try:
            identity = self._file_identity()
        except FileNotFoundError:
            raise StateError(f"state file {self.path} was deleted while the daemon ran") from None
        except OSError as exc:
            raise StateError(f"state file {self.path} cannot be checked: {exc.strerror}") from None
        if identity != self._identity:
            raise StateError(f"state file {self.path} was replaced by another file while the daemon ran")

    def probe(self) -> None:
        """One small write: StateError if the file still cannot take one."""
        with self.transaction() as db:
            self.set_meta(db, "probed", time.time())

    def rescue(self) -> Path:
        """A consistent copy of what the open connection still sees, beside the lost file."""
        target = self.path.with_name(f"{self.path.name}.rescued-{time.strftime('%Y%m%dT%H%M%S')}")
        destination = sqlite3.connect(target)
        try:
            self._conn().backup(destination)
        finally:
            destination.close()
        return target

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._sync}")
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: all of it is on disk when the block ends, or none of it.

        A database error (read-only file, full disk, lock held too long) is a
        StateError naming the file and the cause.
        """
        try:
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StateError(f"state file {self.path}: cannot write: {exc}") from None
        try:
            yield conn
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback(conn)
            raise StateError(f"state file {self.path}: cannot write: {exc}") from None
        except BaseException:
            _rollback(conn)
            raise

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- meta ---------------------------------------------------------------
    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self._conn().execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_meta(self, db: sqlite3.Connection, key: str, value: Any) -> None:
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, json.dumps(value)))

    # -- jobs ---------------------------------------------------------------
    def add_job(
        self,
        db: sqlite3.Connection,
        spec: dict[str, Any],
        submit: float,
        workflow: int | None = None,
        stage: str | None = None,
        user: str = "",
    ) -> int:
        cursor = db.execute(
            "INSERT INTO jobs(spec, state, submit, workflow, stage, user) VALUES (?, 'pending', ?, ?, ?, ?)",
            (json.dumps(spec), submit, workflow, stage, user),
        )
        if workflow is not None:  # one of its stages to come is here
            db.execute("UPDATE workflows SET to_come = MAX(0, to_come - 1) WHERE id = ?", (workflow,))
        return int(cursor.lastrowid or 0)

    def update_job(self, db: sqlite3.Connection, job_id: int, **columns: Any) -> None:
        for key in ("slots", "cpus"):
            if key in columns and not isinstance(columns[key], str | None):
                columns[key] = json.dumps(columns[key])
        names = ", ".join(f"{name} = ?" for name in columns)
        db.execute(f"UPDATE jobs SET {names} WHERE id = ?", (*columns.values(), job_id))

    def begin_run(self, db: sqlite3.Connection, job_id: int) -> int:
        """The number of the run a launch begins (`launches`, counted in its `launching` row's
        transaction). Each run's container carries it, so a restart tells the run the store began
        last from what an earlier run left (a requeued run whose removal a kill cut short)."""
        row = db.execute("UPDATE jobs SET launches = launches + 1 WHERE id = ? RETURNING launches", (job_id,))
        return int(row.fetchone()[0])

    def run_of(self, job_id: int) -> int:
        """The number of the job's last run begun (`begin_run`)."""
        row = self._conn().execute("SELECT launches FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return int(row[0]) if row is not None else 0

    def set_walltime(self, db: sqlite3.Connection, job_id: int, walltime: float) -> None:
        """A job's walltime in its stored spec: a restarted daemon kills it at this one."""
        db.execute("UPDATE jobs SET spec = json_set(spec, '$.walltime', ?) WHERE id = ?", (walltime, job_id))

    def job(self, job_id: int) -> dict[str, Any] | None:
        row = self._conn().execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job_row(row) if row is not None else None

    def jobs(self, states: tuple[str, ...] | None = None, workflow: int | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM jobs"
        args: list[Any] = []
        where: list[str] = []
        if states:
            where.append(f"state IN ({', '.join('?' * len(states))})")
            args.extend(states)
        if workflow is not None:
            where.append("workflow = ?")
            args.append(workflow)
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [_job_row(row) for row in self._conn().execute(sql + " ORDER BY id", args)]

    def count_live(self, db: sqlite3.Connection, user: str | None = None) -> int:
        """Jobs queued or running, and the stages running workflows have yet to submit (of `user`
        only, if given), read inside the caller's transaction.

        Why the stages to come: a workflow is accepted only with room for all its stages
        (`submissions.check_room`), but submits each once its predecessors succeed. Counting only
        those submitted gave the rest of that room away: five workflows of one stage fanning out to
        five fit a cap of 10 and became 25 jobs. A failed or cancelled workflow submits no more
        stages and so holds no more room. A workflow's `to_come` is kept by `add_workflow` and
        `add_job`: counting its stages from its stored spec read every running workflow's spec (190
        KB for an array of 1,024) at each submission.
        """
        mine, args = ("", ()) if user is None else (" AND user = ?", (user,))
        jobs = db.execute(f"SELECT COUNT(*) FROM jobs WHERE {_IS_LIVE}{mine}", (*LIVE, *args)).fetchone()[0]
        to_come = db.execute(
            f"SELECT COALESCE(SUM(to_come), 0) FROM workflows WHERE state = 'running'{mine}", args
        ).fetchone()[0]
        return int(jobs) + int(to_come)

    def answered(self, user: str, key: str, now: float, db: sqlite3.Connection | None = None) -> tuple[str, Any] | None:
        """(digest, answer) of `user`'s submission sent with the `Idempotency-Key` `key`, if one was
        accepted in the last `REQUESTS_KEPT` seconds (`remember_answer`); read in `db`'s transaction
        if given, else as last committed."""
        row = (
            (db or self._conn())
            .execute(
                "SELECT digest, answer FROM requests WHERE user = ? AND key = ? AND at >= ?",
                (user, key, now - REQUESTS_KEPT),
            )
            .fetchone()
        )
        return None if row is None else (str(row[0]), json.loads(row[1]))

    def remember_answer(
        self, db: sqlite3.Connection, user: str, key: str, digest: str, answer: Any, now: float
    ) -> None:
        """In the submission's own transaction: what it was answered, kept `REQUESTS_KEPT` seconds."""
        db.execute("DELETE FROM requests WHERE at < ?", (now - REQUESTS_KEPT,))
        db.execute(
            "INSERT INTO requests(user, key, digest, answer, at) VALUES (?, ?, ?, ?, ?)",
            (user, key, digest, json.dumps(answer), now),
        )

    def states(self, db: sqlite3.Connection, job_ids: Iterable[int]) -> dict[int, str]:
        """The state of each of these jobs still in the file, read inside the caller's transaction."""
        return dict(_in_chunks(db, "SELECT id, state FROM jobs WHERE id IN ({})", job_ids))

    def earlier_twins_live(self, db: sqlite3.Connection, job_ids: Iterable[int]) -> set[int]:
        """Those of these jobs an earlier job of the same user and name is queued or running before
        (a singleton dependency's wait), read inside the caller's transaction."""
        live = ", ".join(repr(state) for state in LIVE)
        sql = (
            "SELECT j.id FROM jobs j WHERE j.id IN ({}) AND EXISTS (SELECT 1 FROM jobs k"
            f" WHERE k.state IN ({live}) AND k.id < j.id AND k.user = j.user"
            " AND json_extract(k.spec, '$.name') = json_extract(j.spec, '$.name'))"
        )
        return {row[0] for row in _in_chunks(db, sql, job_ids)}

    def workflow_states(self, db: sqlite3.Connection, workflow_ids: Iterable[int]) -> dict[int, str]:
        """Each workflow's state as a job's: 'running' while any of its stages is queued or running
        (a failed workflow's other stages run on), else 'done' or 'failed'."""
        sql = (
            "SELECT id, CASE WHEN state = 'running' OR EXISTS (SELECT 1 FROM jobs WHERE jobs.workflow = workflows.id"
            f" AND jobs.state IN ({', '.join(repr(state) for state in LIVE)})) THEN 'running' ELSE state END"
            " FROM workflows WHERE id IN ({})"
        )
        return dict(_in_chunks(db, sql, workflow_ids))

    def owners(self) -> dict[int, str]:
        """The user of every live job that has one (the queue's USER column)."""
        rows = self._conn().execute(f"SELECT id, user FROM jobs WHERE user != '' AND {_IS_LIVE}", LIVE)
        return {job_id: user for job_id, user in rows}

    def ended(
        self, since: float, until: float, user: str | None = None, state: str | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        """Jobs that ended in [since, until), oldest end first, at most `limit` (of `user`, in `state`)."""
        sql = 'SELECT * FROM jobs WHERE "end" >= ? AND "end" < ? AND ' + ("state = ?" if state else _IS_FINAL)
        args: list[Any] = [since, until, *((state,) if state else FINAL)]
        if user is not None:
            sql += " AND user = ?"
            args.append(user)
        rows = self._conn().execute(sql + ' ORDER BY "end", id LIMIT ?', (*args, limit))
        return [_job_row(row) for row in rows]

    def charge(self, db: sqlite3.Connection, charged: Iterable[tuple[int, float, float, float]]) -> None:
        """What a pass found its jobs ran, with what quota (`Scheduler.charged`: job id, CPUs, since, until)."""
        db.executemany(
            "INSERT INTO charges(job_id, cpus, since, until) VALUES (?, ?, ?, ?)",
            [row for row in charged if row[3] > row[2]],
        )

    def charges_since(self, since: float) -> list[tuple[int, str, float, float, float]]:
        """(job id, user, CPUs, since, until) of every charge that ended at `since` or later."""
        rows = self._conn().execute(
            "SELECT c.job_id, j.user, c.cpus, c.since, c.until FROM charges c JOIN jobs j ON j.id = c.job_id"
            " WHERE c.until >= ?",
            (since,),
        )
        return [(job_id, user, float(cpus), float(a), float(b)) for job_id, user, cpus, a, b in rows]

    def last_charged(self, job_ids: Iterable[int]) -> dict[int, float]:
        """Each of these jobs' latest charge's end, for those charged at all."""
        sql = "SELECT job_id, MAX(until) FROM charges WHERE job_id IN ({}) GROUP BY job_id"
        return {job_id: float(until) for job_id, until in _in_chunks(self._conn(), sql, job_ids)}

    def purge_ended(self, before: float, batch: int = 5000) -> int:
        """Delete the jobs that ended before `before` (epoch s), with their quota log; how many.

        Why: the state file keeps every job's environment and log tail, and grows with the
        daemon's history. A workflow's jobs go only once the workflow is over and every one
        of them ended before `before` (its stages' rows are what it released), and the
        workflow goes with its last job. A job or workflow a live job or workflow depends on stays:
        a dependency is judged again from the file (a restart, a workflow's later stage), and one
        whose target is gone is never met. Lending decisions stay: they are what ASAx learned
        from (`purge_decisions`). `batch` jobs a transaction, so submissions wait for one batch at most.
        """
        final = ", ".join(f"'{state}'" for state in FINAL)
        purgeable = (
            f'SELECT id FROM jobs WHERE state IN ({final}) AND "end" < ? AND (workflow IS NULL OR workflow IN ('
            "SELECT w.id FROM workflows w WHERE w.state != 'running' AND NOT EXISTS (SELECT 1 FROM jobs j"
            f' WHERE j.workflow = w.id AND (j.state NOT IN ({final}) OR j."end" IS NULL OR j."end" >= ?))))'
            f" AND id NOT IN ({_DEPENDED_ON.format(target='job')}) LIMIT ?"
        )
        total = 0
        while True:
            with self.transaction() as db:
                ids = [row[0] for row in db.execute(purgeable, (before, before, batch))]
                marks = ", ".join("?" * len(ids))
                db.execute(f"DELETE FROM quotas WHERE job_id IN ({marks})", ids)
                db.execute(f"DELETE FROM charges WHERE job_id IN ({marks})", ids)
                db.execute(f"DELETE FROM jobs WHERE id IN ({marks})", ids)
                db.execute(
                    "DELETE FROM workflows WHERE state != 'running'"
                    " AND NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.workflow = workflows.id)"
                    f" AND id NOT IN ({_DEPENDED_ON.format(target='workflow')})"
                )
            total += len(ids)
            if len(ids) < batch:
                return total

    # -- workflows ----------------------------------------------------------
    def add_workflow(
        self, db: sqlite3.Connection, name: str, spec: dict[str, Any], submitted: float, user: str = ""
    ) -> int:
        cursor = db.execute(
            "INSERT INTO workflows(name, spec, submitted, state, user, to_come) VALUES (?, ?, ?, 'running', ?, ?)",
            (name, json.dumps(spec), submitted, user, len(spec.get("stages") or ())),
        )
        return int(cursor.lastrowid or 0)

    def update_workflow(
        self, db: sqlite3.Connection, workflow_id: int, state: str, failed_stage: str | None = None
    ) -> None:
        db.execute("UPDATE workflows SET state = ?, failed_stage = ? WHERE id = ?", (state, failed_stage, workflow_id))

    def stop_workflow(self, db: sqlite3.Connection, workflow_id: int, state: str, stage: str) -> None:
        """A workflow failed or cancelled by `stage`, unless an earlier stage already stopped it (that
        one stays named)."""
        db.execute(
            "UPDATE workflows SET state = ?, failed_stage = ? WHERE id = ? AND state NOT IN ('failed', 'cancelled')",
            (state, stage, workflow_id),
        )

    def workflow_ids(self, state: str) -> list[int]:
        return [row[0] for row in self._conn().execute("SELECT id FROM workflows WHERE state = ?", (state,))]

    def workflow(self, workflow_id: int) -> dict[str, Any] | None:
        row = self._conn().execute("SELECT * FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
        if row is None:
            return None
        record = dict(row)
        record["spec"] = json.loads(record["spec"])
        return record

    # -- quota log ----------------------------------------------------------
    def log_quota(self, db: sqlite3.Connection, job_id: int, cpus: float, at: float) -> int:
        cursor = db.execute("INSERT INTO quotas(at, job_id, cpus) VALUES (?, ?, ?)", (at, job_id, cpus))
        return int(cursor.lastrowid or 0)

    def quotas_applied(self, db: sqlite3.Connection, applied: list[tuple[int, float]]) -> None:
        """When each logged quota change (by its seq) reached the cgroup."""
        db.executemany("UPDATE quotas SET applied = ? WHERE seq = ?", [(at, seq) for seq, at in applied])

    def quota_changes(self, job_id: int) -> list[dict[str, Any]]:
        rows = self._conn().execute("SELECT * FROM quotas WHERE job_id = ? ORDER BY seq", (job_id,))
        return [dict(row) for row in rows]

    # -- lending decisions --------------------------------------------------
    def save_decision(self, db: sqlite3.Connection, seq: int, body: dict[str, Any]) -> None:
        """A decision as strict JSON: SQLite's JSON functions (`_NEEDED`) refuse Python's `Infinity`,
        and one such row made every restart fail (a lender's `N/N` progress, Hp = +inf, in a helper's
        audit), so a number JSON cannot hold is written as its name ("inf")."""
        db.execute(
            "INSERT OR REPLACE INTO decisions(seq, guest, host, body) VALUES (?, ?, ?, ?)",
            (seq, body["guest"], body["host"], strict_json(body)),
        )

    def decisions_needed(self, recent: int) -> list[dict[str, Any]]:
        """What a restarted daemon needs of its decisions, in order: the last `recent`, every
        one about a job not finished yet (a loss to resolve, a pair not to ask again), and
        every lending whose lender ended before its kind's runtime alone was known (scored
        when it is)."""
        rows = self._conn().execute(f"SELECT body FROM decisions WHERE {_NEEDED} ORDER BY seq", (recent,))
        return [json.loads(row[0]) for row in rows]

    def purge_decisions(self, before: float, recent: int, batch: int = 5000) -> int:
        """Delete the lending decisions made before `before` (epoch s) that a restarted daemon does
        not need (`decisions_needed` with `recent`); how many.

        Why: every lending adds one, so the file grows with the daemon's history. They are what
        ASAx learned from and what `cosched experts fit` reads, so they go only when the operator
        says (`daemon.keep_decisions_days`); the weights learned from them stay."""
        total = 0
        while True:
            with self.transaction() as db:
                removed = db.execute(
                    "DELETE FROM decisions WHERE seq IN (SELECT seq FROM decisions WHERE"
                    f" json_extract(body, '$.time') < ? AND NOT ({_NEEDED}) LIMIT ?)",
                    (before, recent, batch),
                ).rowcount
            total += removed
            if removed < batch:
                return total

    def decisions(self, job_id: int | None = None) -> list[dict[str, Any]]:
        if job_id is None:
            rows = self._conn().execute("SELECT body FROM decisions ORDER BY seq")
        else:
            rows = self._conn().execute(
                "SELECT body FROM decisions WHERE guest = ? OR host = ? ORDER BY seq", (job_id, job_id)
            )
        return [json.loads(row[0]) for row in rows]


def _job_row(row: sqlite3.Row) -> dict[str, Any]:
    record = dict(row)
    record["spec"] = json.loads(record["spec"])
    for key in ("slots", "cpus"):
        if record[key] is not None:
            record[key] = json.loads(record[key])
    return record


def _in_chunks(db: sqlite3.Connection, sql: str, ids: Iterable[int], size: int = 500) -> Iterator[tuple[Any, ...]]:
    """Rows of `sql` (one `IN ({})` of ids), a chunk of ids at a time: SQLite caps a statement's parameters."""
    unique = sorted(set(ids))
    for at in range(0, len(unique), size):
        chunk = unique[at : at + size]
        yield from db.execute(sql.format(", ".join("?" * len(chunk))), chunk)


def strict_json(value: Any) -> str:
    """`value` as JSON any reader takes: a float JSON has no number for (inf, nan) as its name."""
    return json.dumps(_named(value), allow_nan=False)


def _named(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _named(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_named(item) for item in value]
    return value


def _rollback(conn: sqlite3.Connection) -> None:
    with suppress(sqlite3.Error):  # no transaction left to undo: SQLite rolled it back itself
        conn.execute("ROLLBACK")
