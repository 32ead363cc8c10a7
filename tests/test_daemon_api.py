"""The daemon's HTTP API in-process: every bad submission is a 4xx naming the field, and nothing is stored.

Why: the API is the daemon's only door, and what it lets through is written to
the store and later launched. Here a real `Daemon` (its SQLite store under
tmp_path, image lookups on the local Docker engine) serves the FastAPI app
through a TestClient; it is never started and no scheduling pass runs, so no
container is made. Each bad input must come back as a 4xx whose JSON `error`
starts with the field at fault, and must leave no job or workflow row behind.
A hypothesis fuzz test then throws random JSON, random bytes and random ids at
every endpoint: never a 5xx, and every 4xx is JSON with an `error`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from daemon_support import require_engine
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cosched.daemon.api import create_app
from cosched.daemon.config import from_dict, validate
from cosched.daemon.service import Daemon
from workloads.images import busybox_image

TOKEN = "s3cret-token"
MAX_BODY = 4096
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def image() -> str:
    return busybox_image(require_engine())


def make_daemon(root: Path, **api: Any) -> Daemon:
    config = validate(
        from_dict(
            {
                "daemon": {"state_dir": str(root / "state"), "instance": "apitest"},
                "api": {"max_body": MAX_BODY, **api},
                "cluster": {"nodes": 1, "cores": 2, "memory_mib": 4096},
                "docker": {"data_roots": [str(root)]},
            }
        )
    )
    return Daemon(config)


@pytest.fixture
def daemon(tmp_path: Path, image: str) -> Iterator[Daemon]:
    daemon = make_daemon(tmp_path)
    yield daemon
    daemon.store.close()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[TestClient]:
    with TestClient(create_app(daemon)) as client:
        yield client


def rows(daemon: Daemon, table: str) -> int:
    """Rows in a store table, read through a connection of our own (what is on disk, not in a cache)."""
    with sqlite3.connect(daemon.config.state_dir / "state.sqlite") as db:
        return int(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def nothing_stored(daemon: Daemon) -> bool:
    return daemon.store.jobs() == [] and rows(daemon, "jobs") == 0 and rows(daemon, "workflows") == 0


def error_of(response: httpx.Response) -> str:
    assert response.headers["content-type"].startswith("application/json"), response.text
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str), body
    return str(body["error"])


def job(image: str, /, **changes: Any) -> dict[str, Any]:
    return {"image": image, "command": ["sleep", "1"], "cores": 1, "walltime": 30, **changes}


def workflow(image: str, /, **changes: Any) -> dict[str, Any]:
    return {
        "name": "wf",
        "image": image,
        "command": "true",
        "cores": 1,
        "walltime": 30,
        "stages": [{"name": "a"}, {"name": "b", "depends": ["a"]}],
        **changes,
    }


# -- what is accepted -------------------------------------------------------------


def test_valid_job_is_stored(client: TestClient, daemon: Daemon, image: str) -> None:
    response = client.post("/v1/jobs", json=job(image, command="sh -c 'exit 0'", cores=2, name="ok"))
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    [row] = daemon.store.jobs()
    assert row["id"] == job_id and row["state"] == "pending"
    assert row["spec"]["command"] == ["sh", "-c", "exit 0"]
    assert (row["spec"]["image"], row["spec"]["cores"], row["spec"]["name"]) == (image, 2, "ok")
    status = client.get(f"/v1/jobs/{job_id}")
    assert status.status_code == 200 and status.json()["state"] == "pending"
    assert client.get(f"/v1/jobs/{job_id}/explain").json() == []
    cancelled = client.delete(f"/v1/jobs/{job_id}")
    assert cancelled.json() == {"id": job_id, "state": "pending"}
    record = daemon.store.job(job_id)
    assert record is not None and record["cancel"] == 1


def test_valid_workflow_is_stored_with_its_first_stage(client: TestClient, daemon: Daemon, image: str) -> None:
    response = client.post("/v1/workflows", json=workflow(image))
    assert response.status_code == 201, response.text
    body = response.json()
    [row] = daemon.store.jobs()
    assert body["jobs"] == [row["id"]] and row["stage"] == "a" and row["workflow"] == body["id"]
    assert rows(daemon, "workflows") == 1
    status = client.get(f"/v1/workflows/{body['id']}").json()
    assert status["name"] == "wf" and status["stages"]["a"]["job"] == row["id"]


def test_openapi_lists_the_api(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/jobs", "/v1/workflows", "/v1/queue", "/v1/nodes", "/metrics"):
        assert path in paths
    assert "post" in paths["/v1/jobs"] and "post" in paths["/v1/workflows"]


# -- what is refused ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"cores": -1}, "cores", "greater than 0"),
        ({"cores": 3}, "cores", "3 cores asked, the cluster has 2"),
        ({"walltime": 0}, "walltime", "greater than 0"),
        ({"command": []}, "command", ""),
        ({"command": [""]}, "command", "its first word, the program, must not be empty"),  # was runc's words at launch
        ({"command": "echo 'unclosed"}, "command", "cannot split command"),
        ({"image": "cosched/not-here:nope"}, "image", "is not in the local Docker engine"),
        ({"memory_mib": 5000}, "memory_mib", "5000 MiB asked on one node, and a node has 4096 MiB"),
        ({"data_dirs": ["/etc"]}, "data_dirs", "not under a configured data root"),
        ({"data_dirs": ["/\x00"]}, "data_dirs", "must not contain a NUL character"),
        ({"env": {"1BAD": "x"}}, "env", "env key '1BAD': String should match pattern"),  # was env.1BAD.[key]
        ({"colour": "blue"}, "colour", "no such field (misspelt?)"),
        ({"begin": "tomorrow"}, "begin", "begin: 'tomorrow' is neither"),  # without pydantic's "Value error, "
        # past SQLite's integers: was a 500 (OverflowError) when the dependency was looked up
        ({"after": [{"kind": "afterok", "job": 1 << 64}]}, "after.0.job", "less than or equal"),
        ({"after": [{"kind": "afterany", "workflow": 1 << 63}]}, "after.0.workflow", "less than or equal"),
        ({"after": [{"kind": "afterok"}]}, "after.0", "afterok names one job or one workflow"),  # said "singleton"
    ],
)
def test_bad_job_is_refused_naming_the_field(
    client: TestClient, daemon: Daemon, image: str, changes: dict[str, Any], field: str, words: str
) -> None:
    response = client.post("/v1/jobs", json=job(image, **changes))
    assert response.status_code == 422, response.text
    error = error_of(response)
    assert error.startswith(f"{field}"), error
    assert words in error
    assert response.json()["fields"][0].startswith(field)
    assert nothing_stored(daemon)


def test_an_image_name_that_climbs_out_of_the_images_path_is_refused(
    client: TestClient, daemon: Daemon, image: str
) -> None:
    """The SDK puts an image's name into the engine's URL path as written (`/images/NAME/json`), and
    the engine cleans the path: `a/../../images/IMAGE` was looked up as IMAGE and accepted, and other
    such names made the root engine contact a host the submitter chose (a helper's audit). Refused
    by Docker's reference grammar, and the engine is never asked about such a name."""
    climbing = f"a/../../images/{image}"
    response = client.post("/v1/jobs", json=job(image, image=climbing))
    assert response.status_code == 422, response.text
    error = error_of(response)
    assert error.startswith("image: ") and "is not a Docker image reference" in error, error
    assert nothing_stored(daemon)
    assert daemon.backend.has_image(image) and not daemon.backend.has_image(climbing)  # type: ignore[attr-defined]


def test_a_misspelt_key_is_named_before_the_field_it_misses(client: TestClient, daemon: Daemon, image: str) -> None:
    """`cors = 1` was refused as `cores: Field required`, the typo itself unnamed (a helper's walkthrough)."""
    spec = job(image)
    spec["cors"] = spec.pop("cores")
    response = client.post("/v1/jobs", json=spec)
    assert (response.status_code, error_of(response)) == (422, "cors: no such field (misspelt?)")
    assert response.json()["fields"] == ["cors", "cores"]
    assert nothing_stored(daemon)


def test_json_sent_without_its_content_type_is_told_so(client: TestClient, daemon: Daemon, image: str) -> None:
    """`curl -d '{...}'` sends form encoding: the refusal said `body: Input should be a valid dictionary`."""
    response = client.post("/v1/jobs", content=json.dumps(job(image)), headers={"content-type": "text/plain"})
    assert (response.status_code, error_of(response)) == (
        422,
        "body: not JSON: send a JSON object with Content-Type: application/json",
    )
    assert nothing_stored(daemon)


def test_missing_fields_are_all_named(client: TestClient, daemon: Daemon) -> None:
    response = client.post("/v1/jobs", json={})
    assert response.status_code == 422
    assert error_of(response) == "image: Field required"
    assert set(response.json()["fields"]) == {"image", "command", "cores", "walltime"}
    assert nothing_stored(daemon)


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b"{not json", "application/json"),
        (b'{"cores": 1,', "application/json"),
        (b"\xff\xfe\x00", "application/json"),
        (b"[1, 2]", "application/json"),
        (b"null", "application/json"),
        (b"cores=1&walltime=3", "application/x-www-form-urlencoded"),
        (b"", "application/json"),
    ],
)
def test_non_json_body_is_refused(client: TestClient, daemon: Daemon, content: bytes, content_type: str) -> None:
    for path in ("/v1/jobs", "/v1/workflows"):
        response = client.post(path, content=content, headers={"content-type": content_type})
        # 422 "body: ..." from validation; bytes that are not even UTF-8 are FastAPI's 400 "error parsing the body"
        assert response.status_code in (400, 422), response.text
        assert error_of(response).startswith("body: ") or "parsing the body" in error_of(response)
    assert nothing_stored(daemon)


@pytest.mark.parametrize(
    ("changes", "start", "words"),
    [
        (
            {
                "stages": [
                    {"name": "a", "depends": ["c"]},
                    {"name": "b", "depends": ["a"]},
                    {"name": "c", "depends": ["b"]},
                ]
            },
            "stages: ",
            "dependency cycle a -> c -> b -> a",
        ),
        ({"stages": [{"name": "a", "depends": ["zz"]}]}, "stages: ", "depends on unknown stage 'zz'"),
        ({"stages": [{"name": "a"}, {"name": "a"}]}, "stages: ", "duplicate stage name 'a'"),
        ({"stages": []}, "stages: ", ""),
        ({"image": None, "stages": [{"name": "a"}]}, "stages.a.image: ", "no workflow default"),
        ({"walltime": None, "stages": [{"name": "a", "walltime": 0}]}, "stages.0.walltime: ", ""),
        ({"cores": 3}, "cores: ", "3 cores asked, the cluster has 2"),
        ({"image": "cosched/not-here:nope"}, "image: ", "not in the local Docker"),
        ({"stages": [{"name": "a", "image": "cosched/not-here:nope"}]}, "stages.a.image: ", "not in the local Docker"),
        ({"name": ""}, "name: ", ""),
        # each within its own limit, but a stage's job takes the workflow's with its own: were 500s
        ({"name": "w" * 128, "stages": [{"name": "s" * 128}]}, f"stages.{'s' * 128}.name: ", "257 characters"),
        ({"app": "p" * 128, "stages": [{"name": "a"}]}, "stages.a.app_class: ", "130 characters"),
        (
            {
                "env": {f"W{i}": "1" for i in range(100)},
                "stages": [{"name": "a", "env": {f"S{i}": "1" for i in range(100)}}],
            },
            "stages.a.env: ",
            "its job would have 200 variables (the workflow's and the stage's), at most 128",
        ),
        (
            {
                "data_dirs": [f"/w/{i}" for i in range(10)],
                "stages": [{"name": "a", "data_dirs": [f"/s/{i}" for i in range(10)]}],
            },
            "stages.a.data_dirs: ",
            "its job would have 20 directories (the workflow's and the stage's), at most 16",
        ),
    ],
)
def test_bad_workflow_is_refused_naming_the_field(
    client: TestClient, daemon: Daemon, image: str, changes: dict[str, Any], start: str, words: str
) -> None:
    response = client.post("/v1/workflows", json=workflow(image, **changes))
    assert response.status_code == 422, response.text
    error = error_of(response)
    assert error.startswith(start), error
    assert words in error
    assert nothing_stored(daemon)


ONE_STRING = "1000000 characters in one string, at most 16384: send a longer command as a list"
IN_ALL = "characters of commands as strings in the workflow, at most 65536: send them as lists"


@pytest.mark.parametrize(
    ("path", "changes", "said"),
    [
        ("/v1/jobs", {"command": "a" * 1_000_000}, f"command: {ONE_STRING}"),
        ("/v1/workflows", {"command": "a" * 1_000_000}, f"command: 1000000 {IN_ALL}"),
        (
            "/v1/workflows",
            {"stages": [{"name": "a", "command": "a" * 20_000}]},
            "stages.0.command: 20000 " + ONE_STRING.removeprefix("1000000 "),
        ),
        (
            "/v1/workflows",
            {"command": ["true"], "stages": [{"name": f"s{i}", "command": "a" * 16_000} for i in range(60)]},
            f"command: 960000 {IN_ALL}",
        ),
    ],
)
def test_a_long_command_string_is_refused_before_it_is_split(
    tmp_path: Path, image: str, path: str, changes: dict[str, Any], said: str
) -> None:
    """A command string is split as a shell would, on the event loop, at about 2.5 MB a second and
    worse for long tokens: one of 1 MB held every request for 13 s (a security audit), 60 stages of
    16 KB each half a second. Past 16 KiB in one string, or 64 KiB in a workflow, it is refused
    unsplit; a longer command comes as a list."""
    daemon = make_daemon(tmp_path, max_body=2 << 20)
    try:
        with TestClient(create_app(daemon)) as client:
            body = job(image, **changes) if path == "/v1/jobs" else workflow(image, **changes)
            started = time.monotonic()
            response = client.post(path, json=body)
            assert time.monotonic() - started < 2
            assert (response.status_code, error_of(response)) == (422, said)
            assert nothing_stored(daemon)
    finally:
        daemon.store.close()


def test_oversized_body_is_413(client: TestClient, daemon: Daemon, image: str) -> None:
    big = job(image, env={"PAD": "x" * MAX_BODY})
    response = client.post("/v1/jobs", json=big)
    assert response.status_code == 413
    assert error_of(response) == f"request body: larger than the limit of {MAX_BODY} bytes"
    assert client.post("/v1/workflows", json=workflow(image, env={"PAD": "x" * MAX_BODY})).status_code == 413
    assert nothing_stored(daemon)


def test_oversized_body_without_a_length_is_413(client: TestClient, daemon: Daemon, image: str) -> None:
    """A chunked body has no Content-Length: the limit must hold while it is read, not turn into a 400."""
    payload = json.dumps(job(image, env={"PAD": "x" * (2 * MAX_BODY)})).encode()

    def chunks() -> Iterator[bytes]:
        for at in range(0, len(payload), 1000):
            yield payload[at : at + 1000]

    response = client.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text
    assert "larger than the limit" in error_of(response)
    assert nothing_stored(daemon)


def test_token_is_required_when_configured(tmp_path: Path, image: str) -> None:
    """With a token, every path wants it (docs and health too), before the body is even parsed."""
    daemon = make_daemon(tmp_path, token=TOKEN)
    try:
        with TestClient(create_app(daemon)) as client:
            for headers in (
                {},
                {"authorization": "Bearer wrong"},
                {"authorization": TOKEN},
                {"authorization": f"Basic {TOKEN}"},
                {"authorization": f"Bearer{TOKEN}"},
                {"authorization": "Bearer "},
            ):
                for method, path, body in (
                    ("POST", "/v1/jobs", job(image)),
                    ("POST", "/v1/workflows", workflow(image)),
                    ("GET", "/v1/queue", None),
                    ("GET", "/v1/jobs/1", None),
                    ("DELETE", "/v1/jobs/1", None),
                    ("GET", "/metrics", None),
                    ("GET", "/v1/health", None),
                    ("GET", "/openapi.json", None),
                    ("GET", "/docs", None),
                    ("GET", "/redoc", None),
                    ("GET", "/v1/nowhere", None),
                ):
                    response = client.request(method, path, json=body, headers=headers)
                    assert response.status_code == 401, (method, path, headers, response.text)
                    assert error_of(response) == "missing or wrong bearer token"
            bad_json = client.post("/v1/jobs", content=b"{not json", headers={"content-type": "application/json"})
            assert bad_json.status_code == 401, bad_json.text  # not 422: an anonymous client learns nothing
            assert nothing_stored(daemon)
            good = {"authorization": f"Bearer {TOKEN}"}
            assert client.post("/v1/jobs", json=job(image), headers=good).status_code == 201
            assert client.get("/v1/queue", headers=good).status_code == 200
            for scheme in ("bearer", "BEARER", "BeArEr"):  # RFC 9110: the scheme is case-insensitive
                response = client.get("/v1/health", headers={"authorization": f"{scheme} {TOKEN}"})
                assert response.status_code == 200, (scheme, response.text)
            assert client.get("/openapi.json", headers=good).status_code == 200
            assert client.get("/docs", headers=good).status_code == 200
            assert len(daemon.store.jobs()) == 1
    finally:
        daemon.store.close()


@pytest.mark.parametrize(
    ("method", "path", "error"),
    [
        ("GET", "/v1/jobs/999", "job 999: no such job"),
        ("DELETE", "/v1/jobs/999", "job 999: no such job"),
        ("GET", "/v1/jobs/999/explain", "job 999: no such job"),
        ("GET", "/v1/workflows/7", "workflow 7: no such workflow"),
        ("GET", "/v1/nowhere", "Not Found"),
    ],
)
def test_unknown_ids_are_404(client: TestClient, daemon: Daemon, method: str, path: str, error: str) -> None:
    response = client.request(method, path)
    assert response.status_code == 404
    assert error_of(response) == error


@pytest.mark.parametrize("job_id", ["abc", "1.5", str(1 << 63), str(-(1 << 63) - 1), "9" * 40])
def test_ids_that_are_not_ids_are_422(client: TestClient, job_id: str) -> None:
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/explain", f"/v1/workflows/{job_id}"):
        response = client.get(path)
        assert response.status_code == 422, (path, response.text)
        assert error_of(response).startswith("path.")
    response = client.delete(f"/v1/jobs/{job_id}")
    assert response.status_code == 422 and error_of(response).startswith("path.job_id: ")


# -- fuzz ------------------------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


_DROP = object()
NAME = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,10}", fullmatch=True)
# values a field would accept (or nearly), so that some fuzzed submissions get through
GOOD = {
    "cores": st.integers(1, 2),
    "walltime": st.floats(0.001, 1e6),
    "command": st.text(min_size=1, max_size=20),
    "name": NAME,
    "app_class": NAME,
    "memory_mib": st.integers(1, 4096),
    "tasks": st.integers(1, 100),
    "parallel": st.booleans(),
}


@st.composite
def mutated(draw: st.DrawFn, valid: dict[str, Any]) -> dict[str, Any]:
    """`valid` with up to three keys (its own or unknown ones) changed, spoiled or dropped."""
    document = dict(valid)
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(sorted(valid)) | st.text(max_size=8))
        value = draw((GOOD[key] | values if key in GOOD else values) | st.just(_DROP))
        if value is _DROP:
            document.pop(key, None)
        else:
            document[key] = value
    return document


def job_like(image: str) -> st.SearchStrategy[dict[str, Any]]:
    """A JobSpec with every key, some of them changed."""
    return mutated(job(image, name="fuzz", memory_mib=64, app_class="a.b", tasks=2, parallel=False, env={"A": "1"}))


def workflow_like(image: str) -> st.SearchStrategy[dict[str, Any]]:
    """A WorkflowSpec, some keys changed, or with random stages over a few names (duplicates, cycles, unknowns)."""
    names = st.sampled_from(["a", "b", "c"]) | st.text(max_size=4)
    stage = st.fixed_dictionaries(
        {"name": names, "depends": st.lists(names, max_size=2, unique=True)},
        optional={"walltime": st.just(5) | values, "image": st.just(image) | values, "tasks": st.integers(-1, 3)},
    )
    valid = workflow(image)
    stages = st.builds(
        lambda base, stages: {**base, "stages": stages}, mutated(valid), st.lists(stage, min_size=1, max_size=4)
    )
    return mutated(valid) | stages


def check_answer(response: httpx.Response) -> None:
    event(f"HTTP {response.status_code}")  # --hypothesis-show-statistics: how often each answer came
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error_of(response)


@FUZZ
@given(data=st.data())
def test_fuzz_submissions(client: TestClient, daemon: Daemon, image: str, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(["/v1/jobs", "/v1/workflows"]))
    shaped = job_like(image) if path == "/v1/jobs" else workflow_like(image)
    body = data.draw(shaped if data.draw(st.integers(0, 3)) else values)  # mostly near-valid, some anything
    before = (rows(daemon, "jobs"), rows(daemon, "workflows"))
    # json.dumps, not httpx's json=: it writes NaN and Infinity, which the server's parser reads
    response = client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    check_answer(response)
    event(f"{path} HTTP {response.status_code}")
    after = (rows(daemon, "jobs"), rows(daemon, "workflows"))
    if response.status_code >= 400:
        assert after == before, (body, response.text)
    elif path == "/v1/jobs":
        assert response.status_code == 201 and after == (before[0] + 1, before[1])
    else:
        assert response.status_code == 201 and after[1] == before[1] + 1
        assert after[0] - before[0] == len(response.json()["jobs"]) >= 1


@FUZZ
@given(content=st.binary(max_size=300), content_type=st.sampled_from(["application/json", "text/plain", ""]))
def test_fuzz_raw_bodies(client: TestClient, daemon: Daemon, content: bytes, content_type: str) -> None:
    for path in ("/v1/jobs", "/v1/workflows"):
        check_answer(client.post(path, content=content, headers={"content-type": content_type}))


@FUZZ
@given(
    key=st.integers(min_value=-3, max_value=3) | st.integers() | st.text(max_size=12),
    route=st.sampled_from(
        [
            ("GET", "/v1/jobs/{}"),
            ("GET", "/v1/workflows/{}"),
            ("GET", "/v1/jobs/{}/explain"),
            ("DELETE", "/v1/jobs/{}"),
            ("POST", "/v1/nodes/{}/drain"),
            ("POST", "/v1/nodes/{}/resume"),
        ]
    ),
)
def test_fuzz_ids(client: TestClient, daemon: Daemon, image: str, key: int | str, route: tuple[str, str]) -> None:
    if not daemon.store.jobs():  # one real job and workflow, so small ids sometimes hit
        assert client.post("/v1/workflows", json=workflow(image)).status_code == 201
    method, template = route
    response = client.request(method, template.format(quote(str(key), safe="")))
    check_answer(response)
    if isinstance(key, int) and response.status_code == 200:
        assert response.json() == [] or response.json()["id"] == key
    if template.startswith("/v1/nodes/"):  # no body to drain with, no drained node to resume
        assert response.status_code in (404, 409, 422), response.text
