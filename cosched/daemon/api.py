"""The daemon's HTTP API (FastAPI): submissions, queries, cancellation, metrics.

FastAPI because the request models double as validation (a 422 naming the
field) and as the OpenAPI description at `/openapi.json`, which is what the
API's fuzz tests are generated from. Every error body is `{"error": "..."}`:
one line naming the problem, as everywhere else in cosched.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path as FilePath
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from cosched.daemon import drain, journal, views
from cosched.daemon.client import LOG_LINES
from cosched.daemon.docker_backend import EngineUnavailable
from cosched.daemon.http_guards import Authenticate, BodyLimit
from cosched.daemon.identity import Caller, Revocations, load_key, revocations_path
from cosched.daemon.job_actions import NotPending
from cosched.daemon.metrics import CONTENT_TYPE
from cosched.daemon.service import Daemon
from cosched.daemon.specs import JobSpec, JobUpdate, WorkflowSpec
from cosched.daemon.store import StateError
from cosched.daemon.submissions import Forbidden, Full, Rejected

# A job or workflow id: an SQLite INTEGER (a larger one cannot even be looked up).
Id = Annotated[int, Path(ge=-(1 << 63), le=(1 << 63) - 1)]
HISTORY_LIMIT = 100_000
"""Ended jobs one history answer lists at most: tens of MB of JSON, built in memory."""
# A node number (checked against the cluster by `drain`).
Node = Annotated[int, Path(ge=-(1 << 31), le=(1 << 31) - 1)]


class Submitted(BaseModel):
    id: int


class WorkflowSubmitted(BaseModel):
    id: int
    jobs: list[int]


class Cancelled(BaseModel):
    """The answer to a cancel, hold, release, requeue or update: the state the job was in."""

    id: int
    state: str


class DrainAsked(BaseModel):
    reason: str = Field(max_length=drain.MAX_REASON)


class Drained(BaseModel):
    node: int
    reason: str
    since: float
    by: str
    host: str = ""
    """The machine drained: a Mesos agent's hostname ('' on one host)."""


IdempotencyKey = Annotated[
    str,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        pattern=r"^[\x21-\x7e]+$",
        description="A submission sent again with the same key (within a day) gets the first answer,"
        " not a second job (`submissions.answered`)",
    ),
]


def create_app(daemon: Daemon) -> FastAPI:
    """The API of one daemon.

    Nothing here blocks the event loop: an endpoint that touches SQLite or the
    engine is a plain `def`, which FastAPI runs in its thread pool, and health
    is `async` and reads memory only, so it answers while a pass, the store's
    lock or a stalled engine holds every worker thread.
    """
    api = daemon.config.api
    app = FastAPI(
        title="cosched",
        version="1",
        description="HPC co-scheduler daemon: jobs and workflows in containers, CPU lent between them by ASAx.",
    )
    app.add_middleware(BodyLimit, limit=api.max_body, timeout=api.body_timeout)
    key_file = FilePath(api.key_file).expanduser() if api.key_file else None
    key = load_key(key_file) if key_file else None
    revocations = Revocations(revocations_path(key_file)) if key_file else None
    # added last: the outermost, so a request without its credential is refused before any body is read
    app.add_middleware(
        Authenticate, token=api.token, key=key, operators=frozenset(api.operators), revocations=revocations
    )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        # A misspelt key first: `cors = 1` was refused as `cores: Field required`, the typo unnamed.
        first = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0] if errors else None)
        message = _message(first or {"loc": ("body",), "msg": "invalid request"})
        if first is not None and _field(first) == "body" and "json" not in request.headers.get("content-type", ""):
            message = "body: not JSON: send a JSON object with Content-Type: application/json"
        journal.refused(request.url.path, message)
        fields = [_field(e) for e in ([first] if first else []) + [e for e in errors if e is not first]][:20]
        return JSONResponse({"error": message, "fields": fields}, status_code=422)

    @app.exception_handler(Rejected)
    async def rejected(request: Request, exc: Rejected) -> JSONResponse:
        journal.refused(request.url.path, str(exc))
        return JSONResponse({"error": str(exc), "fields": [exc.field]}, status_code=422)

    @app.exception_handler(Forbidden)
    async def forbidden(request: Request, exc: Forbidden) -> JSONResponse:
        journal.refused(request.url.path, str(exc))
        return JSONResponse({"error": str(exc)}, status_code=403)

    @app.exception_handler(drain.NoSuchNode)
    async def no_node(request: Request, exc: drain.NoSuchNode) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=404)

    @app.exception_handler(NotPending)
    async def not_pending(request: Request, exc: NotPending) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=409)

    @app.exception_handler(drain.NotDrained)
    async def not_drained(request: Request, exc: drain.NotDrained) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=409)

    @app.exception_handler(Full)
    async def full(request: Request, exc: Full) -> JSONResponse:
        journal.refused(request.url.path, str(exc))
        return JSONResponse({"error": f"{exc}: submit again later"}, status_code=429)

    @app.exception_handler(StateError)
    async def state_unusable(request: Request, exc: StateError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=503)

    @app.exception_handler(EngineUnavailable)
    async def engine_down(request: Request, exc: EngineUnavailable) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=503)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    def viewer(request: Request) -> str | None:
        """Whose jobs alone the caller may see: their own under `api.private_data` (Slurm's
        PrivateData=jobs,usage), unless an operator; None: everyone's."""
        who = caller(request)
        return who.user if api.private_data and not who.operator else None

    def only_own(request: Request, owner: str, what: str) -> None:
        """Forbidden unless the caller may see what `owner` submitted."""
        user = viewer(request)
        if user is not None and owner != user:
            raise Forbidden(f"{what}: belongs to another user; api.private_data shows each user their own only")

    def own_dependencies(request: Request, spec: JobSpec | WorkflowSpec) -> None:
        """Under `private_data` a dependency names the caller's own jobs: its verdict would tell
        another user's job's fate."""
        for dependency in spec.after:
            if dependency.kind == "singleton":
                continue  # it names only the caller's own jobs
            if dependency.job is not None:
                what, record = f"after: job {dependency.job}", daemon.store.job(dependency.job)
            else:
                what, record = f"after: workflow {dependency.workflow}", daemon.store.workflow(dependency.workflow or 0)
            if record is not None:
                only_own(request, record["user"], what)

    @app.post("/v1/jobs", status_code=201, response_model=Submitted)
    def submit_job(spec: JobSpec, request: Request, idempotency_key: IdempotencyKey = "") -> Submitted:
        # def, not async: the image lookup asks the engine and the commit may wait on SQLite's lock.
        own_dependencies(request, spec)
        return Submitted(id=daemon.submit_job(spec, caller(request).user, idempotency_key))

    @app.post("/v1/workflows", status_code=201, response_model=WorkflowSubmitted)
    def submit_workflow(
        spec: WorkflowSpec, request: Request, idempotency_key: IdempotencyKey = ""
    ) -> WorkflowSubmitted:
        own_dependencies(request, spec)
        workflow_id, jobs = daemon.submit_workflow(spec, caller(request).user, idempotency_key)
        return WorkflowSubmitted(id=workflow_id, jobs=jobs)

    @app.get("/v1/queue")
    def queue(request: Request) -> list[dict[str, Any]]:
        rows = views.queue(daemon)
        user = viewer(request)
        return rows if user is None else [row for row in rows if row["user"] == user]

    @app.get("/v1/jobs/{job_id}")
    def job(job_id: Id, request: Request) -> dict[str, Any]:
        status = views.job_status(daemon, job_id)
        if status is None:
            raise HTTPException(404, f"job {job_id}: no such job")
        only_own(request, status["user"], f"job {job_id}")
        if status["host"] is not None and views.others(daemon, status["host"], viewer(request)):
            status["host"] = None  # its lender: another user's job is theirs to see
        return status

    @app.delete("/v1/jobs/{job_id}", response_model=Cancelled)
    def cancel(job_id: Id, request: Request) -> Cancelled:
        return acted_on(job_id, daemon.cancel(job_id, caller(request)))

    @app.post("/v1/jobs/{job_id}/requeue", response_model=Cancelled)
    def requeue(job_id: Id, request: Request) -> Cancelled:
        return acted_on(job_id, daemon.requeue(job_id, caller(request)))

    @app.patch("/v1/jobs/{job_id}", response_model=Cancelled)
    def update(job_id: Id, change: JobUpdate, request: Request) -> Cancelled:
        return acted_on(job_id, daemon.update_walltime(job_id, change.walltime, caller(request)))

    @app.post("/v1/jobs/{job_id}/hold", response_model=Cancelled)
    def hold(job_id: Id, request: Request) -> Cancelled:
        return acted_on(job_id, daemon.hold(job_id, caller(request), True))

    @app.post("/v1/jobs/{job_id}/release", response_model=Cancelled)
    def release(job_id: Id, request: Request) -> Cancelled:
        return acted_on(job_id, daemon.hold(job_id, caller(request), False))

    def acted_on(job_id: int, state: str) -> Cancelled:
        """The answer to an action on a job: the state it was in ('' from the daemon: no such job, 404)."""
        if not state:
            raise HTTPException(404, f"job {job_id}: no such job")
        return Cancelled(id=job_id, state=state)

    @app.get("/v1/jobs/{job_id}/log")
    def job_log(job_id: Id, request: Request, lines: Annotated[int, Query(ge=1, le=LOG_LINES)] = 20) -> dict[str, Any]:
        """The last `lines` of a job's output: live while it runs, as `tail` of a Slurm output file."""
        record = daemon.store.job(job_id)
        if record is None:
            raise HTTPException(404, f"job {job_id}: no such job")
        only_own(request, record["user"], f"job {job_id}")
        return views.job_log(daemon, record, lines)

    @app.get("/v1/jobs/{job_id}/explain")
    def explain(job_id: Id, request: Request) -> list[dict[str, Any]]:
        record = daemon.store.job(job_id)
        if record is None:
            raise HTTPException(404, f"job {job_id}: no such job")
        only_own(request, record["user"], f"job {job_id}")
        return views.explain(daemon, job_id, viewer(request))

    @app.get("/v1/workflows/{workflow_id}")
    def workflow(workflow_id: Id, request: Request) -> dict[str, Any]:
        status = views.workflow_status(daemon, workflow_id)
        if status is None:
            raise HTTPException(404, f"workflow {workflow_id}: no such workflow")
        only_own(request, status["user"], f"workflow {workflow_id}")
        return status

    @app.get("/v1/nodes")
    def nodes(request: Request) -> list[dict[str, Any]]:
        rows = views.nodes(daemon)
        user = viewer(request)
        if user is not None:  # the nodes' cores and use stay; other users' jobs on them are not listed
            owners = daemon.store.owners()
            for row in rows:
                row["jobs"] = [job for job in row["jobs"] if owners.get(job["id"]) == user]
                for job in row["jobs"]:  # a guest's lender: another user's job is theirs to see
                    if job["host"] is not None and owners.get(job["host"]) != user:
                        job["host"] = None
        return rows

    @app.get("/v1/history")
    def history(
        request: Request,
        since: Annotated[float | None, Query(allow_inf_nan=False)] = None,
        until: Annotated[float | None, Query(allow_inf_nan=False)] = None,
        user: str | None = None,
        state: Annotated[str | None, Query(pattern="^(done|failed|cancelled)$")] = None,
        limit: Annotated[int, Query(ge=1, le=HISTORY_LIMIT)] = 1000,
    ) -> list[dict[str, Any]]:
        """Jobs that ended in [since, until) (epoch seconds; default: the last day), as sacct."""
        if viewer(request) is not None:  # under private_data: the caller's own, unless they ask for another's
            if user is not None:
                only_own(request, user, f"history of {user}")
            user = viewer(request)
        now = daemon.clock()
        end = now if until is None else until
        return views.history(daemon, end - 86400 if since is None else since, end, user, state, limit)

    @app.get("/v1/shares")
    def shares(request: Request) -> list[dict[str, Any]]:
        rows = views.shares(daemon)
        if rows is None:
            queue = daemon.config.policies.queue
            raise HTTPException(409, f"queue policy {queue!r} counts no usage (shares need policies.queue = fairshare)")
        user = viewer(request)
        return rows if user is None else [row for row in rows if row["user"] == user]

    @app.post("/v1/nodes/{node}/drain", response_model=Drained)
    def drain_node(node: Node, asked: DrainAsked, request: Request) -> Drained:
        entry = drain.drain(daemon, node, asked.reason, caller(request))
        return Drained(node=node, **asdict(entry))

    @app.post("/v1/nodes/{node}/resume", response_model=Drained)
    def resume_node(node: Node, request: Request) -> Drained:
        entry = drain.resume(daemon, node, caller(request))
        return Drained(node=node, **asdict(entry))

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        # async and from memory only (no store, no lock, no engine): a probe must answer whatever they do.
        # The counts are those of the last scheduling pass.
        sample = daemon.metrics.registry.get_sample_value
        jobs = {
            "queued": sample("cosched_queue_length"),  # in the queue: what the policies order
            "pending": sample("cosched_pending_jobs"),  # and those held, or waiting for a begin or dependency
            "running": sample("cosched_running_jobs"),
        }
        return {**daemon.health(), "jobs": {state: int(count or 0) for state, count in jobs.items()}}

    @app.get("/metrics")
    def metrics(request: Request) -> Response:
        if viewer(request) is not None:  # its per-user series are every user's usage
            raise Forbidden("metrics: every user's usage; api.private_data shows them to operators only")
        return Response(daemon.metrics.render(), media_type=CONTENT_TYPE)

    return app


def caller(request: Request) -> Caller:
    """Who sent `request`, as `Authenticate` (always in front of the app) found."""
    found: Caller = request.state.caller
    return found


def _field(error: Any) -> str:
    """What a validation error is about: its location less `body`; a model-level check names its field first."""
    if error.get("type") == "json_invalid":
        return "body"  # the location's number is a character offset, not a field
    parts = [str(part) for part in error.get("loc", ()) if part != "body"]
    if len(parts) >= 2 and parts[-1] == "[key]":  # a mapping's key (an env variable's name), not a path
        return " ".join(filter(None, (".".join(parts[:-2]), f"key {parts[-2]!r}")))
    where = ".".join(parts)
    if not where and error.get("type") == "value_error":
        where = str(error.get("ctx", {}).get("error", "")).partition(": ")[0]
    return where or "body"


def _message(error: Any) -> str:
    """`<field>: <problem>`, without pydantic's "Value error, " in front of a check's own message."""
    own = error.get("ctx", {}).get("error") if error.get("type") == "value_error" else None
    if own is not None and not [part for part in error.get("loc", ()) if part != "body"]:
        return str(own)
    if own is not None:
        return f"{_field(error)}: {own}"
    if error.get("type") == "extra_forbidden":
        return f"{_field(error)}: no such field (misspelt?)"
    return f"{_field(error)}: {error.get('msg', 'invalid')}"
