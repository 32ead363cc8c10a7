"""The daemon's HTTP API (FastAPI): submissions, queries, cancellation, metrics.

FastAPI because the request models double as validation (a 422 naming the
field) and as the OpenAPI description at `/openapi.json`, which is what the
API's fuzz tests are generated from. Every error body is `{"error": "..."}`:
one line naming the problem, as everywhere else in cosched.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cosched.daemon import journal, views
from cosched.daemon.docker_backend import EngineUnavailable
from cosched.daemon.metrics import CONTENT_TYPE
from cosched.daemon.service import Daemon, Rejected
from cosched.daemon.specs import JobSpec, WorkflowSpec
from cosched.daemon.store import StateError

# A job or workflow id: an SQLite INTEGER (a larger one cannot even be looked up).
Id = Annotated[int, Path(ge=-(1 << 63), le=(1 << 63) - 1)]


class Submitted(BaseModel):
    id: int


class WorkflowSubmitted(BaseModel):
    id: int
    jobs: list[int]


class Cancelled(BaseModel):
    id: int
    state: str


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, before they are read into memory."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await _too_large(self.limit, scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge(self.limit)
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await _too_large(self.limit, scope, receive, send)


class _TooLarge(StarletteHTTPException):
    """Raised while the app reads the body; an HTTPException so FastAPI passes it on rather than making it a 400."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body: larger than the limit of {limit} bytes")


async def _too_large(limit: int, scope: Scope, receive: Receive, send: Send) -> None:
    response = JSONResponse({"error": f"request body: larger than the limit of {limit} bytes"}, status_code=413)
    await response(scope, receive, send)


def create_app(daemon: Daemon) -> FastAPI:
    """The API of one daemon."""
    token = daemon.config.api.token
    app = FastAPI(
        title="cosched",
        version="1",
        description="HPC co-scheduler daemon: jobs and workflows in containers, CPU lent between them by ASAx.",
    )
    app.add_middleware(BodyLimit, limit=daemon.config.api.max_body)

    def authorised(request: Request) -> None:
        if not token:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HTTPException(401, "missing or wrong bearer token")

    guard = [Depends(authorised)]

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
        journal.refused(request.url.path, _message(first))
        return JSONResponse(
            {"error": _message(first), "fields": [_field(e) for e in errors[:20]]},
            status_code=422,
        )

    @app.exception_handler(Rejected)
    async def rejected(request: Request, exc: Rejected) -> JSONResponse:
        journal.refused(request.url.path, str(exc))
        return JSONResponse({"error": str(exc), "fields": [exc.field]}, status_code=422)

    @app.exception_handler(StateError)
    async def state_unusable(request: Request, exc: StateError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=503)

    @app.exception_handler(EngineUnavailable)
    async def engine_down(request: Request, exc: EngineUnavailable) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=503)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.post("/v1/jobs", status_code=201, response_model=Submitted, dependencies=guard)
    async def submit_job(spec: JobSpec) -> Submitted:
        # async: a submission is a validation and one SQLite commit (well under a millisecond),
        # cheaper on the event loop than a hop to the thread pool and back.
        return Submitted(id=daemon.submit_job(spec))

    @app.post("/v1/workflows", status_code=201, response_model=WorkflowSubmitted, dependencies=guard)
    def submit_workflow(spec: WorkflowSpec) -> WorkflowSubmitted:
        workflow_id, jobs = daemon.submit_workflow(spec)
        return WorkflowSubmitted(id=workflow_id, jobs=jobs)

    @app.get("/v1/queue", dependencies=guard)
    def queue() -> list[dict[str, Any]]:
        return views.queue(daemon)

    @app.get("/v1/jobs/{job_id}", dependencies=guard)
    def job(job_id: Id) -> dict[str, Any]:
        status = views.job_status(daemon, job_id)
        if status is None:
            raise HTTPException(404, f"job {job_id}: no such job")
        return status

    @app.delete("/v1/jobs/{job_id}", response_model=Cancelled, dependencies=guard)
    def cancel(job_id: Id) -> Cancelled:
        state = daemon.cancel(job_id)
        if not state:
            raise HTTPException(404, f"job {job_id}: no such job")
        return Cancelled(id=job_id, state=state)

    @app.get("/v1/jobs/{job_id}/explain", dependencies=guard)
    def explain(job_id: Id) -> list[dict[str, Any]]:
        if daemon.store.job(job_id) is None:
            raise HTTPException(404, f"job {job_id}: no such job")
        return views.explain(daemon, job_id)

    @app.get("/v1/workflows/{workflow_id}", dependencies=guard)
    def workflow(workflow_id: Id) -> dict[str, Any]:
        status = views.workflow_status(daemon, workflow_id)
        if status is None:
            raise HTTPException(404, f"workflow {workflow_id}: no such workflow")
        return status

    @app.get("/v1/nodes", dependencies=guard)
    def nodes() -> list[dict[str, Any]]:
        return views.nodes(daemon)

    @app.get("/v1/health")
    def health() -> dict[str, Any]:
        return {**daemon.health(), "jobs": daemon.store.count_jobs()}

    @app.get("/metrics", dependencies=guard)
    def metrics() -> Response:
        return Response(daemon.metrics.render(), media_type=CONTENT_TYPE)

    return app


def _field(error: Any) -> str:
    """What a validation error is about: its location less `body`; a model-level check names its field first."""
    if error.get("type") == "json_invalid":
        return "body"  # the location's number is a character offset, not a field
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
    if not where and error.get("type") == "value_error":
        where = str(error.get("ctx", {}).get("error", "")).partition(": ")[0]
    return where or "body"


def _message(error: Any) -> str:
    """`<field>: <problem>`, without pydantic's "Value error, " in front of a model-level check's own message."""
    own = error.get("ctx", {}).get("error") if error.get("type") == "value_error" else None
    if own is not None and not [part for part in error.get("loc", ()) if part != "body"]:
        return str(own)
    return f"{_field(error)}: {error.get('msg', 'invalid')}"
