"""Users of the API: signed per-user tokens, jobs owned by their submitter, cancel your own.

Why: with one shared token (or none) anyone who reaches the API can cancel anyone's
jobs. With `api.key_file`, each user holds a token naming them (`cosched token USER`);
here a real `Daemon` (SQLite store under tmp_path, images looked up in the local
engine; never started, so nothing runs) serves the API through a TestClient, and
every refusal must leave the job as it was.
"""

from __future__ import annotations

import copy
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import jwt
import pytest
from daemon_support import require_engine
from fastapi.testclient import TestClient

from cosched.cli import main
from cosched.core.events import Offer
from cosched.daemon import views, workflow_stages
from cosched.daemon.api import create_app
from cosched.daemon.config import from_dict, validate
from cosched.daemon.identity import BadToken, create_key, load_key, mint, user_of
from cosched.daemon.service import Daemon
from cosched.daemon.store import Store
from cosched.errors import ConfigError
from workloads.images import busybox_image

SHARED = "shared-operator-token"


@pytest.fixture(scope="module")
def image() -> str:
    return busybox_image(require_engine())


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "api.key"
    assert create_key(path)
    return path


def make_daemon(root: Path, key_file: Path, **api: Any) -> Daemon:
    config = {"key_file": str(key_file), "token": SHARED, "operators": ["ops"], **api}
    document = {
        "daemon": {"state_dir": str(root / "state"), "instance": "userstest"},
        "api": config,
        "cluster": {"nodes": 1, "cores": 2, "memory_mib": 4096},
    }
    return Daemon(validate(from_dict(document)))


@pytest.fixture
def daemon(tmp_path: Path, key_file: Path, image: str) -> Iterator[Daemon]:
    daemon = make_daemon(tmp_path, key_file)
    yield daemon
    daemon.store.close()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[TestClient]:
    with TestClient(create_app(daemon)) as client:
        yield client


def as_user(key_file: Path, user: str, lifetime: float = 600) -> dict[str, str]:
    return {"authorization": f"Bearer {mint(load_key(key_file), user, lifetime)}"}


def job(image: str) -> dict[str, Any]:
    return {"image": image, "command": ["sleep", "1"], "cores": 1, "walltime": 30}


def two_stages(image: str) -> dict[str, Any]:
    return {
        "name": "wf",
        "image": image,
        "command": "true",
        "cores": 1,
        "walltime": 30,
        "stages": [{"name": "a"}, {"name": "b", "depends": ["a"]}],
    }


def test_a_user_cancels_their_own_jobs_and_an_operator_anyones(
    client: TestClient, daemon: Daemon, key_file: Path, image: str, caplog: pytest.LogCaptureFixture
) -> None:
    alice, bob, ops = (as_user(key_file, name) for name in ("alice", "bob", "ops"))
    first = client.post("/v1/jobs", json=job(image), headers=alice).json()["id"]
    second = client.post("/v1/jobs", json=job(image), headers=alice).json()["id"]
    third = client.post("/v1/jobs", json=job(image), headers=bob).json()["id"]
    assert client.get(f"/v1/jobs/{first}", headers=bob).json()["user"] == "alice"  # everyone reads, as squeue
    assert {row["id"]: row["user"] for row in client.get("/v1/queue", headers=bob).json()} == {
        first: "alice",
        second: "alice",
        third: "bob",
    }

    refused = client.delete(f"/v1/jobs/{first}", headers=bob)
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"] == f"job {first}: belongs to alice; bob may cancel only their own jobs"
    record = daemon.store.job(first)
    assert record is not None and (record["cancel"], record["state"]) == (0, "pending")
    assert first not in daemon.kill_reason

    with caplog.at_level(logging.INFO, logger="cosched.jobs"):
        assert client.delete(f"/v1/jobs/{first}", headers=alice).json() == {"id": first, "state": "pending"}
    assert f"job={first} event=cancel_asked state=pending by=alice" in caplog.text  # whose cancel it was
    assert client.delete(f"/v1/jobs/{third}", headers=ops).status_code == 200  # an operator by name
    assert client.delete(f"/v1/jobs/{second}", headers={"authorization": f"Bearer {SHARED}"}).status_code == 200
    assert [daemon.store.job(i)["cancel"] for i in (first, second, third)] == [1, 1, 1]  # type: ignore[index]


def test_an_operators_hold_only_an_operator_releases(
    client: TestClient, daemon: Daemon, key_file: Path, image: str
) -> None:
    """Slurm's JobHeldAdmin: an operator held alice's job (before maintenance, say) and alice
    released it herself. Her own hold stays hers to lift; an operator's hold on it is the operator's."""
    alice, ops = as_user(key_file, "alice"), as_user(key_file, "ops")
    job_id = client.post("/v1/jobs", json=job(image), headers=alice).json()["id"]
    assert client.post(f"/v1/jobs/{job_id}/hold", headers=alice).status_code == 200
    assert client.get(f"/v1/jobs/{job_id}", headers=alice).json()["reason"] == "JobHeldUser"
    assert client.post(f"/v1/jobs/{job_id}/release", headers=alice).status_code == 200
    assert client.post(f"/v1/jobs/{job_id}/hold", headers=ops).status_code == 200
    assert client.post(f"/v1/jobs/{job_id}/hold", headers=alice).status_code == 200  # no downgrade
    assert client.get(f"/v1/jobs/{job_id}", headers=alice).json()["reason"] == "JobHeldAdmin"
    refused = client.post(f"/v1/jobs/{job_id}/release", headers=alice)
    assert (refused.status_code, refused.json()["error"]) == (
        403,
        f"job {job_id} is held by an operator: only an operator may release it",
    )
    assert daemon.store.job(job_id)["held"]  # type: ignore[index]
    assert client.post(f"/v1/jobs/{job_id}/release", headers=ops).status_code == 200
    assert not daemon.store.job(job_id)["held"]  # type: ignore[index]
    assert [type(e).__name__ for e in daemon.inbox][1:] == ["JobHeld", "JobReleased", "JobHeld", "JobReleased"]


def test_a_job_with_no_user_is_an_operators_to_cancel(client: TestClient, key_file: Path, image: str) -> None:
    shared = {"authorization": f"Bearer {SHARED}"}
    job_id = client.post("/v1/jobs", json=job(image), headers=shared).json()["id"]
    refused = client.delete(f"/v1/jobs/{job_id}", headers=as_user(key_file, "alice"))
    assert refused.status_code == 403
    assert "belongs to no user" in refused.json()["error"]


def test_a_workflows_stages_belong_to_its_submitter_released_later_too(
    client: TestClient, daemon: Daemon, key_file: Path, image: str
) -> None:
    answer = client.post("/v1/workflows", json=two_stages(image), headers=as_user(key_file, "carol")).json()
    [first] = answer["jobs"]
    with daemon.store.transaction() as db:
        daemon.store.update_job(db, first, state="done")
        [(second, _)] = workflow_stages.release(daemon.store, db, answer["id"], time.time())
    assert [daemon.store.job(i)["user"] for i in (first, second)] == ["carol", "carol"]  # type: ignore[index]
    assert client.get(f"/v1/workflows/{answer['id']}", headers=as_user(key_file, "dave")).json()["user"] == "carol"
    assert client.delete(f"/v1/jobs/{second}", headers=as_user(key_file, "dave")).status_code == 403


def test_private_data_shows_each_user_their_own_and_operators_everything(
    tmp_path: Path, key_file: Path, image: str
) -> None:
    """`api.private_data` (Slurm's PrivateData=jobs,usage): bob sees his jobs in the queue, and
    alice's job, workflow, decisions, history and the metrics are refused him (403, one line);
    a dependency on her job is refused before its verdict could tell her job's fate. An operator
    sees all. Without per-user tokens the key is refused at start, naming it."""
    daemon = make_daemon(tmp_path, key_file, private_data=True)
    alice, bob, ops = (as_user(key_file, name) for name in ("alice", "bob", "ops"))
    try:
        with TestClient(create_app(daemon)) as client:
            hers = client.post("/v1/jobs", json=job(image), headers=alice).json()["id"]
            flow, [stage] = client.post("/v1/workflows", json=two_stages(image), headers=alice).json().values()
            his = client.post("/v1/jobs", json=job(image), headers=bob).json()["id"]
            assert [row["id"] for row in client.get("/v1/queue", headers=bob).json()] == [his]
            assert len(client.get("/v1/queue", headers=ops).json()) == 3
            mine = (f"/v1/jobs/{hers}", f"/v1/jobs/{hers}/log", f"/v1/jobs/{hers}/explain", f"/v1/workflows/{flow}")
            for path in (*mine, "/metrics"):
                refused = client.get(path, headers=bob)
                assert refused.status_code == 403, (path, refused.text)
                assert "api.private_data shows" in refused.json()["error"]
                assert client.get(path, headers=ops).status_code == 200
                assert client.get(path, headers=alice).status_code == (403 if path == "/metrics" else 200)
            # Her two jobs take both cores in the core (started there only: no engine is called).
            decision = daemon.core.step(time.time(), [Offer(((0, 2),), (2048,)), *daemon.inbox])
            assert sorted(a.job.id for a in decision.actions) == [hers, stage], decision.actions
            for who, expected in ((bob, set()), (alice, {hers, stage}), (ops, {hers, stage})):
                listed = {job["id"] for node in client.get("/v1/nodes", headers=who).json() for job in node["jobs"]}
                assert listed == expected
            assert client.get("/v1/history", params={"user": "alice"}, headers=bob).status_code == 403
            assert client.get("/v1/history", headers=bob).status_code == 200
            after = [{"kind": "afterok", "job": hers}]
            depends = client.post("/v1/jobs", json={**job(image), "after": after}, headers=bob)
            assert depends.status_code == 403 and depends.json()["error"] == (
                f"after: job {hers}: belongs to another user; api.private_data shows each user their own only"
            )
            assert len(daemon.store.jobs()) == 3  # the workflow's first stage among them; nothing refused stored
            refused = client.delete(f"/v1/jobs/{hers}", headers=bob)  # names no owner either
            assert refused.json()["error"] == f"job {hers}: belongs to another user; bob may cancel only their own jobs"
    finally:
        daemon.store.close()
    with pytest.raises(ConfigError, match=r"api.private_data: needs per-user tokens \(api.key_file\)"):
        validate(from_dict({"api": {"private_data": True}}))


def test_private_data_tells_a_guests_owner_nothing_of_another_users_lender(
    tmp_path: Path, key_file: Path, image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Alice's job borrowed CPU from Bob's. Her own job's status named his job, and its decisions
    his job's kind, CPU, memory, progress, runtime and loss (a helper's audit). Under
    `private_data` each sees their own side of a lending; an operator, both."""
    daemon = make_daemon(tmp_path, key_file, private_data=True)
    alice, bob, ops = (as_user(key_file, name) for name in ("alice", "bob", "ops"))
    try:
        with TestClient(create_app(daemon)) as client:
            lender = client.post("/v1/jobs", json=job(image), headers=bob).json()["id"]
            guest = client.post("/v1/jobs", json=job(image), headers=alice).json()["id"]
            with daemon.store.transaction() as db:
                daemon.store.update_job(db, lender, state="running")
                daemon.store.update_job(db, guest, state="running", host=lender)
                body = {
                    "time": 1.0,
                    "guest": guest,
                    "host": lender,
                    "app_class": "bob.secret",
                    "fraction": 0.5,
                    "note": "the lender was cancelled",
                    "features": {"cpu": 0.2},
                    "host_runtime": 12.0,
                    "loss": 0.1,
                    "executed": True,
                }
                daemon.store.save_decision(db, 1, body)
            assert client.get(f"/v1/jobs/{guest}", headers=alice).json()["host"] is None
            assert client.get(f"/v1/jobs/{guest}", headers=ops).json()["host"] == lender
            [hers] = client.get(f"/v1/jobs/{guest}/explain", headers=alice).json()
            assert (hers["guest"], hers["fraction"], hers["executed"]) == (guest, 0.5, True)
            assert all(hers[key] is None for key in ("host", "app_class", "features", "host_runtime", "loss", "note"))
            [his] = client.get(f"/v1/jobs/{lender}/explain", headers=bob).json()
            assert his["guest"] is None and (his["host"], his["app_class"], his["loss"]) == (lender, "bob.secret", 0.1)
            [theirs] = client.get(f"/v1/jobs/{guest}/explain", headers=ops).json()
            assert (theirs["guest"], theirs["host"], theirs["app_class"]) == (guest, lender, "bob.secret")
            shared_node = [{"node": 0, "jobs": [{"id": lender, "host": None}, {"id": guest, "host": lender}]}]
            with patch.object(views, "nodes", lambda _: copy.deepcopy(shared_node)):  # the core's, as a pass left it
                assert client.get("/v1/nodes", headers=alice).json()[0]["jobs"] == [{"id": guest, "host": None}]
                assert client.get("/v1/nodes", headers=ops).json() == shared_node
        # `cosched explain` prints her side only, and says what it leaves out.
        from cosched.daemon import commands

        args = SimpleNamespace(job=guest, json=False, url="http://x", ca_file=None)
        answer = SimpleNamespace(call=lambda method, path: [hers])
        with patch.object(commands, "_client", lambda _: answer):
            commands.explain_live(args)  # type: ignore[arg-type]
        printed = capsys.readouterr().out
        assert (
            f"job {guest} as guest: lend 50% of another user's job to job {guest}, carried out; loss not shown"
            in printed
        )
        assert "bob" not in printed and "lender state" not in printed
    finally:
        daemon.store.close()


def test_a_full_daemon_or_user_refuses_submissions_with_429_until_jobs_end(
    tmp_path: Path, key_file: Path, image: str
) -> None:
    """`api.max_jobs` caps the jobs queued or running in all, `max_jobs_per_user` each user's: one
    client submitting in a loop cannot fill the daemon for everyone. Refusals store nothing."""
    daemon = make_daemon(tmp_path, key_file, max_jobs=3, max_jobs_per_user=2)
    alice, bob, carol = (as_user(key_file, name) for name in ("alice", "bob", "carol"))
    try:
        with TestClient(create_app(daemon)) as client:
            first = [client.post("/v1/jobs", json=job(image), headers=alice).json()["id"] for _ in range(2)]
            refused = client.post("/v1/jobs", json=job(image), headers=alice)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"] == (
                "alice has 2 jobs queued, running or to come in workflows, at most 2 (api.max_jobs_per_user):"
                " submit again later"
            )
            assert client.post("/v1/jobs", json=job(image), headers=bob).status_code == 201
            full = client.post("/v1/jobs", json=job(image), headers=bob)
            assert (full.status_code, full.json()["error"]) == (
                429,
                "the daemon holds 3 jobs queued, running or to come in workflows, at most 3 (api.max_jobs):"
                " submit again later",
            )
            assert len(daemon.store.jobs()) == 3
            with daemon.store.transaction() as db:
                daemon.store.update_job(db, first[0], state="done")
            full = client.post("/v1/workflows", json=two_stages(image), headers=carol)
            assert full.status_code == 429  # room for one job, not two
            assert daemon.store.workflow(1) is None
            assert client.post("/v1/jobs", json=job(image), headers=alice).status_code == 201  # a place came free
    finally:
        daemon.store.close()


@pytest.mark.parametrize(
    ("credential", "problem"),
    [
        ("", "missing or wrong bearer token"),
        ("not-a-jwt", "missing or wrong bearer token"),
        ("other-key", "missing or wrong bearer token"),
        ("forged-user", "missing or wrong bearer token"),
        ("no-signature", "missing or wrong bearer token"),
        ("expired", "bearer token expired: ask the operator for a new one (cosched token USER)"),
    ],
)
def test_a_token_this_key_did_not_sign_or_that_expired_is_refused_before_anything_is_stored(
    client: TestClient, daemon: Daemon, key_file: Path, image: str, credential: str, problem: str
) -> None:
    key = load_key(key_file)
    tokens = {
        "": "",
        "not-a-jwt": "not-a-jwt",
        "other-key": mint(os.urandom(32), "alice", 600),
        "forged-user": _swap_payload(mint(key, "alice", 600), mint(key, "root", 600)),
        "no-signature": jwt.encode({"sun": "root", "exp": time.time() + 600}, None, algorithm="none"),
        "expired": mint(key, "alice", 60, now=time.time() - 120),
    }
    response = client.post("/v1/jobs", json=job(image), headers={"authorization": f"Bearer {tokens[credential]}"})
    assert response.status_code == 401, response.text
    assert response.json()["error"] == problem
    assert daemon.store.jobs() == []


def _swap_payload(token: str, other: str) -> str:
    """`token`'s header and signature around `other`'s claims: a user who edits the name in their token."""
    header, _, signature = token.split(".")
    return f"{header}.{other.split('.')[1]}.{signature}"


def test_tokens_name_posix_users_and_keys_are_private(tmp_path: Path) -> None:
    path = tmp_path / "key"
    assert create_key(path) and not create_key(path)  # never overwritten: that would revoke every token
    assert (path.stat().st_mode & 0o777, path.stat().st_size) == (0o600, 32)
    key = load_key(path)
    assert user_of(key, mint(key, "alice", 60)) == "alice"
    for bad in ("", "Alice", "al ice", "../root", "a" * 33):
        with pytest.raises(ConfigError, match="expected a POSIX user name"):
            mint(key, bad, 60)
    with pytest.raises(BadToken):
        user_of(key, jwt.encode({"sun": "al ice", "exp": time.time() + 60}, key, algorithm="HS256"))
    path.chmod(0o640)
    with pytest.raises(ConfigError, match=r"readable or writable by others \(mode 0640\); chmod 600 it"):
        load_key(path)
    short = tmp_path / "short"
    short.write_bytes(b"x" * 16)
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="holds 16 bytes, at least 32"):
        load_key(short)
    link = tmp_path / "link"
    link.symlink_to(short)
    with pytest.raises(ConfigError, match="cannot open"):
        load_key(link)
    if os.geteuid() == 0:  # a key another user owns, 0600: they read it, and mint an operator's token
        path.chmod(0o600)
        os.chown(path, 65534, 65534)
        with pytest.raises(ConfigError, match=r"is owned by uid 65534, who can read it; chown 0 it, chmod 600 it"):
            load_key(path)
    with pytest.raises(ConfigError, match=r"cannot open .*missing.*cosched token USER --key-file"):
        load_key(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"api\.operators: 'Root' is not a POSIX user name"):
        validate(from_dict({"api": {"operators": ["Root"]}}))


def test_cosched_token_makes_the_key_once_and_prints_a_token_for_the_user(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "api.key"
    assert main(["token", "alice", "--key-file", str(path), "--lifetime", "2h"]) == 0
    out, err = capsys.readouterr()
    assert f"made a new signing key {path}" in err
    name, _, token = out.strip().partition("=")
    assert name == "COSCHED_TOKEN" and user_of(load_key(path), token) == "alice"
    claims = jwt.decode(token, load_key(path), algorithms=["HS256"])
    assert claims["exp"] - claims["iat"] == pytest.approx(7200, abs=1)
    assert main(["token", "bob", "--key-file", str(path)]) == 0
    out, err = capsys.readouterr()
    assert user_of(load_key(path), out.strip().partition("=")[2]) == "bob"
    assert err.startswith("cosched: a token for bob, valid until ") and "made a new" not in err
    assert main(["token", "Bob", "--key-file", str(path)]) == 2
    assert capsys.readouterr().err.strip().endswith("expected a POSIX user name (a-z, 0-9, '_', '.', '-'; up to 32)")


def test_a_state_file_from_before_users_gains_the_column_and_keeps_its_jobs(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(
            "CREATE TABLE workflows (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, spec TEXT NOT NULL,"
            " submitted REAL NOT NULL, state TEXT NOT NULL, failed_stage TEXT);"
            "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, spec TEXT NOT NULL, state TEXT NOT NULL,"
            " submit REAL NOT NULL, start REAL, end REAL, slots TEXT, cpus TEXT, quota REAL,"
            " host INTEGER NOT NULL DEFAULT -1, container TEXT, exit_code INTEGER, reason TEXT, log_tail TEXT,"
            " cancel INTEGER NOT NULL DEFAULT 0, launches INTEGER NOT NULL DEFAULT 0,"
            " workflow INTEGER REFERENCES workflows(id), stage TEXT);"
            "INSERT INTO jobs(spec, state, submit) VALUES ('{\"cores\": 1}', 'pending', 1.0);"
        )
    store = Store(path)
    try:
        [old] = store.jobs()
        assert (old["id"], old["state"], old["user"]) == (1, "pending", "")
        with store.transaction() as db:
            new = store.add_job(db, {"cores": 1}, 2.0, user="alice")
        assert store.owners() == {new: "alice"}
    finally:
        store.close()
    assert Store(path).jobs()[1]["user"] == "alice"  # opened again: nothing added twice


def test_accounts_come_from_the_user_database_and_never_give_root() -> None:
    """What `docker.run_as = "submitter"` runs a job as (the jobs themselves: tests/test_sandbox.py)."""
    from cosched.daemon.accounts import Account, NoAccount, account_in, account_of

    daemon_user = account_of("daemon")  # uid 1 on Debian and most Linux systems
    assert (daemon_user.uid, daemon_user.gid) == (1, 1) and 0 not in daemon_user.groups
    assert account_in({"run_as": daemon_user.as_spec()}) == daemon_user
    assert account_in({"image": "x"}) is None
    with pytest.raises(NoAccount, match="root: jobs never run as root"):
        account_of("root")
    with pytest.raises(NoAccount, match="nosuchuser7 has no account on this host"):
        account_of("nosuchuser7")
    # What an agent's executor is handed is checked again there: never root, never garbage.
    rooted = ({"uid": 0, "gid": 1}, {"uid": 1, "gid": 0}, {"uid": 1, "gid": 1, "groups": [0]}, {"uid": -1, "gid": 1})
    for given in rooted:
        with pytest.raises(NoAccount, match="never run as root"):
            account_in({"run_as": given})
    for given in ({"uid": "x", "gid": 1}, {"gid": 1}, "1:1"):
        with pytest.raises(NoAccount, match="expected uid, gid and groups"):
            account_in({"run_as": given})
    assert Account(5, 6, (7,)).as_spec() == {"uid": 5, "gid": 6, "groups": [7]}


def test_a_revoked_users_old_tokens_are_refused_and_their_new_one_works(
    client: TestClient, daemon: Daemon, key_file: Path, image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A leaked token is good until it expires unless its user's tokens can be revoked: the
    running daemon refuses it as soon as `cosched token USER --revoke` has written the list,
    while the user's next token, and other users' tokens, still work."""
    old_alice, bob = as_user(key_file, "alice"), as_user(key_file, "bob")
    assert client.post("/v1/jobs", json=job(image), headers=old_alice).status_code == 201
    assert main(["token", "alice", "--revoke", "--key-file", str(key_file)]) == 0
    assert "alice's tokens issued before " in capsys.readouterr().err
    listed = key_file.with_name("api.key.revoked")
    assert listed.stat().st_mode & 0o777 == 0o600
    refused = client.post("/v1/jobs", json=job(image), headers=old_alice)
    assert refused.status_code == 401 and refused.json()["error"].startswith("bearer token revoked: alice's tokens")
    assert len(daemon.store.jobs()) == 1  # nothing stored for the refused call
    assert client.post("/v1/jobs", json=job(image), headers=as_user(key_file, "alice")).status_code == 201
    assert client.post("/v1/jobs", json=job(image), headers=bob).status_code == 201
    # Fail closed: a list that cannot be parsed refuses every user token, not none of them.
    listed.write_text("alice not-a-time\n")
    broken = client.get("/v1/queue", headers=bob)
    assert broken.status_code == 401 and "revocation list is unusable" in broken.json()["error"]
    assert client.get("/v1/queue", headers={"authorization": f"Bearer {SHARED}"}).status_code == 200
    listed.unlink()
    assert client.get("/v1/queue", headers=old_alice).status_code == 200  # no list: nothing revoked


def test_cosched_token_without_a_key_says_where_to_give_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "alice"]) == 2
    assert capsys.readouterr().err.strip() == (
        "cosched: error: token: no signing key: give --key-file or a --config whose api.key_file is set"
    )


def test_the_daemons_purge_forgets_jobs_ended_before_keep_ended_days(
    tmp_path: Path, key_file: Path, client: TestClient, daemon: Daemon, image: str
) -> None:
    """What the hourly purge does (`daemon.keep_ended_days`, here 1 day): a job that ended 2 days ago
    is gone, with its environment, and its id is 404; one that ended an hour ago stays."""
    from dataclasses import replace

    alice = as_user(key_file, "alice")
    old, recent = (client.post("/v1/jobs", json=job(image), headers=alice).json()["id"] for _ in "ab")
    now = time.time()
    with daemon.store.transaction() as db:
        daemon.store.update_job(db, old, state="done", end=now - 2 * 86400)
        daemon.store.update_job(db, recent, state="done", end=now - 3600)
    daemon.config = replace(daemon.config, daemon=replace(daemon.config.daemon, keep_ended_days=1.0))
    daemon.purge()
    assert client.get(f"/v1/jobs/{old}", headers=alice).status_code == 404
    assert client.get(f"/v1/jobs/{recent}", headers=alice).json()["state"] == "done"
