"""The daemon's pieces that need no Docker engine, each checked against answers worked by hand.

Why: the end-to-end tests run the whole daemon on a real engine, where a wrong
config message, a misread cgroup file or an off-by-one in the CPU map shows up
(if at all) as a job stuck or a quota mismatch minutes later. Here each piece
is pinned alone: the config refuses what it must and names the key, the state
file and the port fail with a clear ConfigError, cgroup v1 and v2 files are
read from fake trees whose numbers we chose, CPU maps hand out the CPUs we
expect, submissions are checked field by field, and the queue view shows the
core's own order and reservations.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import math
import os
import re
import signal
import socket
import sqlite3
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest
import requests
from conftest import missing
from daemon_support import wait_until
from pydantic import ValidationError

from cosched.daemon.cgroups import CgroupFiles
from cosched.daemon.client import ApiError, Client
from cosched.daemon.commands import _workflow_body
from cosched.daemon.config import DaemonConfig, DockerSection, from_dict, load_config, validate
from cosched.daemon.cpus import CpuMap, share_of
from cosched.daemon.docker_backend import _refused, data_dirs_allowed, runs_as_for
from cosched.daemon.identity import load_key
from cosched.daemon.run import bind, hold_state_dir, serve
from cosched.daemon.specs import JobSpec, WorkflowSpec
from cosched.daemon.store import Store
from cosched.errors import ConfigError, SchedulingError

# -- config -------------------------------------------------------------------


def test_empty_document_is_the_embedded_default() -> None:
    config = validate(from_dict({}))
    assert config == DaemonConfig()
    assert config.api.host == "127.0.0.1" and config.api.port == 6817


def test_unknown_section_is_named() -> None:
    with pytest.raises(ConfigError, match=r"unknown config section \[apii\]"):
        from_dict({"apii": {"port": 1}})


def test_unknown_key_is_named_with_its_section() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key api\.prot\b"):
        from_dict({"api": {"prot": 80}})


def test_section_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match=r"config \[cluster\] must be a table"):
        from_dict({"cluster": 4})


@pytest.mark.parametrize(
    ("document", "key"),
    [
        ({"api": {"port": "6817"}}, "api.port"),
        ({"cluster": {"cores": True}}, "cluster.cores"),  # a bool is not an int here
        ({"cluster": {"cores": 2.0}}, "cluster.cores"),
        ({"intervals": {"sample": "2s"}}, "intervals.sample"),
        ({"docker": {"data_roots": "/data"}}, "docker.data_roots"),
        ({"docker": {"data_roots": ["/data", 3]}}, "docker.data_roots"),
        ({"policies": {"queue": 1}}, "policies.queue"),
    ],
)
def test_wrong_type_names_the_key(document: dict[str, dict[str, object]], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"config key {re.escape(key)}: expected"):
        from_dict(document)


def test_ints_are_accepted_where_floats_are() -> None:
    config = from_dict({"intervals": {"schedule": 2}, "docker": {"data_roots": ["/data"]}})
    assert config.intervals.schedule == 2.0 and isinstance(config.intervals.schedule, float)
    assert config.docker.data_roots == ("/data",)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.org", "::"])
def test_non_loopback_host_needs_a_token(host: str) -> None:
    with pytest.raises(ConfigError, match=r"api\.token: required"):
        validate(from_dict({"api": {"host": host}}))
    config = validate(from_dict({"api": {"host": host, "token": "s3cret"}}))
    assert config.api.token == "s3cret"
    assert validate(from_dict({"api": {"host": host, "key_file": "/etc/cosched/api.key"}})).api.key_file


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "localhost"])
def test_loopback_host_needs_no_token(host: str) -> None:
    assert validate(from_dict({"api": {"host": host}})).api.host == host


@pytest.mark.parametrize(
    ("document", "match"),
    [
        ({"api": {"port": 0}}, r"api\.port"),
        ({"api": {"port": 65536}}, r"api\.port"),
        ({"api": {"max_body": 1023}}, r"api\.max_body"),
        ({"api": {"max_connections": 3}}, r"api\.max_connections: must be >= 4"),
        ({"api": {"header_timeout": 0}}, r"api\.header_timeout: must be in"),
        ({"api": {"body_timeout": -1}}, r"api\.body_timeout: must be in"),
        ({"api": {"body_timeout": 1e9}}, r"api\.body_timeout: must be in"),
        ({"cluster": {"nodes": 0}}, r"\[cluster\]"),
        ({"cluster": {"cores": -1}}, r"\[cluster\]"),
        ({"docker": {"cpu_period": 999}}, r"docker\.cpu_period"),
        ({"docker": {"data_roots": ["relative/dir"]}}, r"docker\.data_roots"),
        ({"intervals": {"schedule": 0}}, r"intervals\.schedule: must be in \(0, 86400\]"),
        ({"intervals": {"reconcile": -1.5}}, r"intervals\.reconcile: must be in"),
        ({"intervals": {"schedule": math.nan}}, r"intervals\.schedule: must be in"),  # crashed the scheduler late
        ({"intervals": {"sample": math.inf}}, r"intervals\.sample: must be in"),
        ({"intervals": {"review": 1e300}}, r"intervals\.review: must be in"),
        ({"cluster": {"cores": 9_000_000_000_000_000_000}}, r"\[cluster\]: .*cores in 0\.\.1048576"),  # a hang
        ({"cluster": {"default_memory_per_core": 5}}, r"default_memory_per_core in 6\."),
        ({"policies": {"seed": -1}}, r"policies\.seed: must be >= 0"),
        ({"docker": {"job_user": "99999999999999999999:1"}}, r"docker\.job_user: expected 'uid:gid', each in"),
        ({"docker": {"job_user": "4294967295:1"}}, r"docker\.job_user"),  # (uid_t)-1
        ({"docker": {"log_tail": -5}}, r"docker\.log_tail: must be >= 0"),
        ({"mesos": {"watchdog_heartbeats": 0.5}}, r"mesos\.watchdog_heartbeats: must be in \[1, 100\]"),
    ],
)
def test_out_of_range_values_are_refused(document: dict[str, dict[str, object]], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        validate(from_dict(document))


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "cosched.toml"
    path.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[api]\nport = 7000\n[intervals]\nsample = 0.5\n')
    config = load_config(path)
    assert config.state_dir == tmp_path
    assert config.api.port == 7000
    assert config.intervals.sample == 0.5
    assert config.intervals.schedule == 1.0  # untouched keys keep their default


def test_a_config_holding_the_operators_token_must_be_the_daemons_alone(tmp_path: Path) -> None:
    """Whoever reads `api.token` is an operator (cancel anyone's jobs, drain nodes, see every job
    under `private_data`): a config holding it that others may read is refused, as a readable
    `key_file` is. The shipped config was 0644, and a helper's audit drained a node as nobody."""
    path = tmp_path / "cosched.toml"
    path.write_text("[api]\nport = 7000\n")
    path.chmod(0o644)
    assert load_config(path).api.port == 7000  # no token: nothing to hide
    path.write_text('[api]\ntoken = "s3cret"\n')
    with pytest.raises(
        ConfigError,
        match=r"config key api\.token \(in it\): .*cosched\.toml is readable or writable by "
        r"others \(mode 0644\); chmod 600 it",
    ):
        load_config(path)
    path.chmod(0o600)
    assert load_config(path).api.token == "s3cret"


def test_load_config_on_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"nope\.toml does not exist"):
        load_config(missing)


def test_load_config_on_invalid_toml(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[api\nport = = 3\n")
    with pytest.raises(ConfigError, match=r"config file .*bad\.toml: "):
        load_config(path)


def test_load_config_on_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xfe[api]\n")
    with pytest.raises(ConfigError, match=r"config file .*binary\.toml: 'utf-8' codec can't decode"):
        load_config(path)


def test_a_key_file_that_is_a_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"api\.key_file: {re.escape(str(tmp_path))} is not a regular file"):
        load_key(tmp_path)


@pytest.mark.parametrize("url", ["notaurl", "http://[::1", "http://127.0.0.1:1/\u00e4", "ftp://host", "http://:80"])
def test_a_url_that_cannot_name_a_daemon_is_one_line(url: str) -> None:
    with pytest.raises(ApiError, match="is not the URL of a cosched daemon"):
        Client(url, "")


@pytest.mark.parametrize("token", ["bad\ntoken", "t\u00f6ken", "two words"])
def test_a_token_a_header_cannot_carry_is_one_line(token: str) -> None:
    with pytest.raises(ApiError, match="has characters an HTTP header cannot carry"):
        Client("http://127.0.0.1:1", token)


def test_a_plain_daemon_that_does_not_answer_is_not_probed_for_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    """An https daemon answers a plain request by closing the connection; a plain one gone silent
    times out, and asking its port for a TLS handshake then added up to 5 s to each try (a review)."""
    from cosched.daemon import client as client_module
    from cosched.daemon.client import AnswerLost

    probed: list[str] = []
    monkeypatch.setattr(client_module, "_speaks_tls", lambda url, timeout: probed.append(url) or False)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel takes the connection; nobody reads or answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(AnswerLost, match="no answer from the cosched daemon"):
            Client(url, "", timeout=0.5).call("GET", "/v1/health")
    assert probed == []


@contextlib.contextmanager
def _answering_once(status: int, body: bytes, content_type: str = "") -> Iterator[str]:
    """The URL of a server that answers one GET with `status` and `body`, as no cosched daemon would."""

    class Answers(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Answers)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        thread.join(10)
        server.server_close()


@pytest.mark.parametrize("token", ["", "a-wrong-one"])
def test_a_refused_token_says_where_the_cli_reads_one_when_none_was_given(token: str) -> None:
    """`missing or wrong bearer token (HTTP 401)` did not say where a token goes (a walkthrough)."""

    answer = b'{"error": "missing or wrong bearer token"}'
    with _answering_once(401, answer, "application/json") as url, pytest.raises(ApiError) as refused:
        Client(url, token).call("GET", "/v1/queue")
    hint = ": give the token in $COSCHED_TOKEN" if not token else ""
    assert str(refused.value) == f"missing or wrong bearer token{hint} (HTTP 401)"


def test_an_answer_that_is_not_json_is_one_line() -> None:
    """A URL that answers, but not as the daemon does (a web server's HTML page)."""

    not_json = "answered /v1/queue with other than JSON: is it the cosched daemon"
    with _answering_once(200, b"<html>hello</html>") as url, pytest.raises(ApiError, match=not_json):
        Client(url, "", timeout=10).call("GET", "/v1/queue")


def test_a_redirect_is_refused_and_the_token_goes_nowhere_else() -> None:
    """urllib followed a redirect with the Authorization header: a 307 from the daemon's URL to
    another server delivered the token to it (a helper's audit)."""
    seen: list[str | None] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    other = http.server.HTTPServer(("127.0.0.1", 0), Elsewhere)

    class Redirect(Elsewhere):
        def do_GET(self) -> None:
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{other.server_port}/v1/queue")
            self.end_headers()

    first = http.server.HTTPServer(("127.0.0.1", 0), Redirect)
    threads = [threading.Thread(target=server.handle_request, daemon=True) for server in (first, other)]
    for thread in threads:
        thread.start()
    try:
        with pytest.raises(ApiError, match=r"answered /v1/queue with a redirect \(HTTP 307\) to 'http://127.0.0.1:"):
            Client(f"http://127.0.0.1:{first.server_port}", "SECRET-TOKEN", timeout=10).call("GET", "/v1/queue")
    finally:
        with socket.create_connection(("127.0.0.1", other.server_port)):
            pass  # lets `other` stop waiting for a request
        for thread in threads:
            thread.join(10)
        first.server_close()
        other.server_close()
    assert "Bearer SECRET-TOKEN" not in seen


def test_a_workflow_files_after_takes_the_dependency_option_form() -> None:
    """`after = "afterok:79"` in a workflow file was refused, `Input should be a valid list`."""
    document = tomllib.loads('[workflow]\nname = "w"\nafter = "afterok:79:80,afterany:w3"\n')
    assert _workflow_body(document)["after"] == [
        {"kind": "afterok", "job": 79},
        {"kind": "afterok", "job": 80},
        {"kind": "afterany", "workflow": 3},
    ]
    with pytest.raises(ConfigError, match=r"^workflow file: after: 'afterwards:1': expected afterok"):
        _workflow_body(tomllib.loads('[workflow]\nname = "w"\nafter = "afterwards:1"\n'))


def test_a_workflow_file_with_a_toml_date_names_where() -> None:
    document = tomllib.loads('[workflow]\nname = "w"\n[[stage]]\nname = "a"\nwalltime = 07:32:00\n')
    with pytest.raises(ConfigError, match=r"stages\[0\]\.walltime is a TOML date or time; give seconds"):
        _workflow_body(document)
    document = tomllib.loads('[workflow]\nname = "w"\nbegin = 2030-05-27T07:32:00Z\n')
    with pytest.raises(ConfigError, match=r"workflow file: begin is a TOML date or time"):
        _workflow_body(document)


def test_load_config_validates(tmp_path: Path) -> None:
    path = tmp_path / "open.toml"
    path.write_text('[api]\nhost = "0.0.0.0"\n')
    with pytest.raises(ConfigError, match=r"api\.token"):
        load_config(path)


# -- the port and the state file -------------------------------------------------


def test_bind_on_a_taken_port() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"cannot listen on 127\.0\.0\.1:{port}: .*port in use"):
            bind("127.0.0.1", port)


def test_a_daemon_refused_for_a_taken_port_creates_no_state_file(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        config = tmp_path / "cosched.toml"
        config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[api]\nport = {port}\n')
        with pytest.raises(ConfigError, match="port in use"):
            serve(load_config(config))
    assert not (tmp_path / "state").exists()


def test_a_second_daemon_on_one_state_directory_is_refused_in_one_line(tmp_path: Path) -> None:
    """Two daemons on one state directory (two configs, two ports) each adopted the other's
    containers: every job the first ran was recorded failed by the second, `container disappeared`.
    The second stops at its start, before it opens the state file; the first's end lets go."""
    state = tmp_path / "state"
    held = hold_state_dir(state)
    assert held is not None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        config = tmp_path / "cosched.toml"
        config.write_text(f'[daemon]\nstate_dir = "{state}"\n[api]\nport = {port}\n')
        with pytest.raises(ConfigError, match=rf"^state directory {state} is in use by another cosched daemon: "):
            serve(load_config(config))
        assert not (state / "state.sqlite").exists()
        bind("127.0.0.1", port).close()  # the refused start let its port go
    finally:
        os.close(held)
    again = hold_state_dir(state)  # the first one gone, its directory is free
    assert again is not None
    os.close(again)


def test_a_user_who_can_read_the_state_directory_cannot_keep_the_daemon_from_starting() -> None:
    """The lock was the directory itself, which any user who may read it can `flock`: one did, and
    every start of the daemon after was refused as `in use by another cosched daemon`."""
    import subprocess
    import tempfile

    if os.geteuid() != 0:
        missing("running a process as another uid needs root")
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        Path(top).chmod(0o755)
        state = Path(top) / "state"
        state.mkdir(mode=0o755)  # readable by all, as an operator may make it
        holder = subprocess.Popen(  # flock(1) locks a directory as the daemon did, through O_RDONLY
            ["flock", "--exclusive", str(state), "--command", "echo held; exec sleep 60"],
            user=65534,
            group=65534,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            held = hold_state_dir(state)
            assert held is not None
            os.close(held)
        finally:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
        assert (state / "lock").stat().st_mode & 0o777 == 0o600


def test_a_state_directory_another_user_could_replace_is_refused(tmp_path: Path) -> None:
    """A state directory another user made (`/tmp/cosched`) let them link `state.sqlite-wal` to a
    host file, which the root daemon made 0600 (a link to /etc/passwd breaks every other user's
    name lookup), or `mounts` to a host directory, where the daemon mounted a job's data dir; or
    give it a state file of their own. The daemon refuses such a directory at its start."""
    import tempfile

    from cosched.daemon.sandbox import StagingMounts
    from cosched.daemon.store import Store

    if os.geteuid() != 0:
        missing("giving a directory to another owner needs root")
    owned = tmp_path / "theirs"
    owned.mkdir()
    os.chown(owned, 65534, 65534)
    with pytest.raises(ConfigError, match=rf"^daemon.state_dir '{owned}': it is owned by uid 65534, who could"):
        hold_state_dir(owned)
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        shared = Path(top) / "shared"
        shared.mkdir()
        shared.chmod(0o777)  # writable by all, not sticky
        with pytest.raises(ConfigError, match=rf"^daemon.state_dir '{shared}/state': '{shared}' above it is writable"):
            hold_state_dir(shared / "state")
    # Behind the check, neither the state file's modes nor the staging mounts follow a link.
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    (victim / "passwd").write_text("root:x:0:0\n")
    (victim / "passwd").chmod(0o644)
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.sqlite").touch(mode=0o600)
    (state / "state.sqlite-wal").symlink_to(victim / "passwd")
    with pytest.raises(ConfigError, match=r"state file .* is not usable"):
        Store(state / "state.sqlite")
    assert (victim / "passwd").stat().st_mode & 0o777 == 0o644
    (state / "mounts").symlink_to(victim)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError, match="is not a directory of the daemon's own"):
            StagingMounts(state / "mounts").pin(7, [fd])
    finally:
        os.close(fd)
    assert victim.stat().st_mode & 0o777 == 0o755 and sorted(p.name for p in victim.iterdir()) == ["passwd"]


def test_bind_on_a_free_port_listens() -> None:
    sock = bind("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert port > 0
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        sock.close()


def test_store_under_a_regular_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory")
    path = tmp_path / "afile" / "state.sqlite"
    with pytest.raises(ConfigError, match=r"state file .*afile/state\.sqlite is not usable"):
        Store(path)


def test_store_on_a_directory_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "state.sqlite").mkdir()
    with pytest.raises(ConfigError, match=r"is not usable"):
        Store(tmp_path / "state.sqlite")


def test_store_creates_its_directory_and_keeps_what_it_wrote(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "state.sqlite"
    store = Store(path)
    with store.transaction() as db:
        job_id = store.add_job(db, {"name": "j", "cores": 1}, 12.5)
        store.set_meta(db, "instance", "abc")
    store.close()
    again = Store(path)
    assert again.get_meta("instance") == "abc"
    [job] = again.jobs()
    assert job["id"] == job_id and job["spec"] == {"name": "j", "cores": 1} and job["state"] == "pending"
    again.close()


def test_a_restart_reloads_the_recent_decisions_and_those_about_unfinished_jobs(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.sqlite")
    with store.transaction() as db:
        done, live = store.add_job(db, {"cores": 1}, 0.0), store.add_job(db, {"cores": 1}, 0.0)
        store.update_job(db, done, state="done")
        for seq in range(1, 1001):
            host = live if seq == 3 else done
            store.save_decision(db, seq, {"seq": seq - 1, "guest": done, "host": host})
    needed = [body["seq"] for body in store.decisions_needed(10)]
    assert needed == [2, *range(990, 1000)]
    assert len(store.decisions()) == 1000  # all kept on disk, for explain
    store.close()


def test_a_lender_with_nothing_left_to_do_leaves_a_state_file_a_restart_reads(tmp_path: Path) -> None:
    """A lender whose progress says N/N has Hp = +inf. Its decision was written as Python's JSON,
    `Infinity`, which SQLite's JSON functions refuse: once it was no longer among the last decisions
    kept in any case, every restart (and every rebuild after a failed pass) failed with `malformed
    JSON` (a helper's audit, from real jobs). Decisions are strict JSON now (Hp +inf as "inf", as
    `cosched experts fit` records hold it; a number again when restored, or its next save failed, a
    review found), and a file written before is mended when opened."""
    from cosched.policies.asax import LendingDecision
    from experts.records import from_decision

    body = LendingDecision(
        time=10.0,
        guest=2,
        host=1,
        app_class="x",
        host_cores=2,
        experts=["a"],
        distributions=[[1.0]],
        weights=[1.0],
        action=0,
        fraction=0.5,
        learner="x",
        executed=True,
        loss=0.25,
        features={"cpu": 0.2, "mem": 0.1, "parallel": True, "progress": 1.0, "happiness": math.inf},
    ).as_dict()
    store = Store(tmp_path / "state.sqlite")
    with store.transaction() as db:
        store.save_decision(db, 1, {**body, "loss": None, "host_runtime": 5.0})  # waits for its score
        for seq in range(2, 5):
            store.save_decision(db, seq, {**body, "guest": 10 + seq})
        db.execute("UPDATE decisions SET body = ? WHERE seq = 4", (json.dumps({**body, "fraction": math.inf}),))
    store.close()
    store = Store(tmp_path / "state.sqlite")  # an older daemon's `Infinity` in row 4: mended here
    try:
        [needed] = store.decisions_needed(0)
        assert needed["features"]["happiness"] == "inf" and needed["guest"] == 2
        restored = LendingDecision.from_stored(needed)  # a number again: its next save names it anew
        assert restored.features["happiness"] == math.inf
        with store.transaction() as db:
            store.save_decision(db, 1, {**restored.as_dict(), "loss": 0.5})
        assert [d["fraction"] for d in store.decisions()][-1] == "inf"
        assert LendingDecision.from_stored(store.decisions()[-1]).fraction == math.inf
        record = from_decision(store.decisions()[0])
        assert record is not None and record.features.happiness == math.inf and record.loss == 0.5
    finally:
        store.close()


def test_asax_forgets_old_decisions_but_numbers_and_finds_new_ones() -> None:
    from cosched.policies.asax import ASAx, LendingDecision

    asax = ASAx()
    body = dict(time=0.0, guest=1, host=2, app_class="c", features={}, experts=[], distributions=[], weights=[])
    asax.restore([LendingDecision(**body, action=0, fraction=0.0, seq=seq) for seq in range(40, 100)])
    assert asax.decided == 100 and [d.seq for d in asax.since(95)] == [95, 96, 97, 98, 99]
    asax.forget(10)
    assert len(asax.decisions) == 10 and asax.decisions[0].seq == 90
    assert [d.seq for d in asax.since(95)] == [95, 96, 97, 98, 99] and asax.since(100) == []
    assert [d.seq for d in asax.since(0)] == list(range(90, 100))


# -- cgroup files ------------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _proc(tmp_path: Path, pid: int, cgroup: str, mountinfo: str, state: str = "S", flags: int = 0x400100) -> Path:
    """A /proc with one process: its cgroup membership, its stat (`state`, `flags`) and our mounts."""
    proc = tmp_path / "proc"
    stat = f"{pid} (sh -c) {state} 1 {pid} {pid} 0 -1 {flags} 0 0 0 0 1 2 0 0 20 0 1 0 100\n"
    _write(proc, {f"{pid}/cgroup": cgroup, f"{pid}/stat": stat, "self/mountinfo": mountinfo})
    return proc


def test_cgroup_v1(tmp_path: Path) -> None:
    cpu_mount, memory_mount = tmp_path / "v1" / "cpu,cpuacct", tmp_path / "v1" / "memory"
    mountinfo = (
        "25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        f"35 25 0:30 / {cpu_mount} rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct\n"
        f"36 25 0:31 / {memory_mount} rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,memory\n"
        f"37 25 0:32 / {tmp_path / 'unified'} rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw\n"
    )
    # hybrid host: the v1 controllers win over the unified hierarchy's empty line
    cgroup = "12:memory:/docker/abc\n11:cpu,cpuacct:/docker/abc\n3:pids:/docker/abc\n0::/docker/abc\n"
    proc = _proc(tmp_path, 4242, cgroup, mountinfo)
    _write(
        cpu_mount / "docker" / "abc",
        {"cpu.cfs_quota_us": "150000\n", "cpu.cfs_period_us": "100000\n", "cpuacct.usage": "2500000000\n"},
    )
    _write(
        memory_mount / "docker" / "abc",
        {
            "memory.usage_in_bytes": "10485760\n",
            "memory.limit_in_bytes": "52428800\n",
            "memory.stat": "cache 7\ninactive_file 999\ntotal_inactive_file 1048576\n",
        },
    )
    files = CgroupFiles.of_pid(4242, proc=proc)
    assert files is not None
    assert files.version == 1
    assert files.cpu == cpu_mount / "docker" / "abc"
    assert files.cpuacct == cpu_mount / "docker" / "abc"
    assert files.memory == memory_mount / "docker" / "abc"
    assert files.quota() == (150000, 100000)
    assert files.cpu_seconds() == pytest.approx(2.5)
    assert files.memory_bytes() == (10485760 - 1048576, 52428800)


def test_cgroup_v1_unlimited_quota(tmp_path: Path) -> None:
    mount = tmp_path / "cpu"
    mountinfo = (
        f"35 25 0:30 / {mount} rw - cgroup cgroup rw,cpu,cpuacct\n36 25 0:31 / {mount} rw - cgroup cgroup rw,memory\n"
    )
    proc = _proc(tmp_path, 7, "4:memory:/\n2:cpu,cpuacct:/\n", mountinfo)
    _write(mount, {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"})
    files = CgroupFiles.of_pid(7, proc=proc)
    assert files is not None and files.cpu == mount
    assert files.quota() == (-1, 100000)


def test_cgroup_v2(tmp_path: Path) -> None:
    mount = tmp_path / "sys" / "fs" / "cgroup"
    mountinfo = (
        "25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        f"30 25 0:26 / {mount} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    proc = _proc(tmp_path, 99, "0::/system.slice/docker-abc.scope\n", mountinfo)
    directory = mount / "system.slice" / "docker-abc.scope"
    _write(
        directory,
        {
            "cpu.max": "50000 100000\n",
            "cpu.stat": "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
            "memory.current": "8192\n",
            "memory.max": "65536\n",
            "memory.stat": "anon 4096\nactive_inactive_file 1\ninactive_file 2048\n",
        },
    )
    files = CgroupFiles.of_pid(99, proc=proc)
    assert files == CgroupFiles(2, directory, directory, directory)
    assert files.quota() == (50000, 100000)
    assert files.cpu_seconds() == pytest.approx(1.5)
    assert files.memory_bytes() == (8192 - 2048, 65536)


def test_cgroup_v2_unlimited_and_nested_root(tmp_path: Path) -> None:
    # inside a container's cgroup namespace, the mount's root is the container's own group
    mount = tmp_path / "cg"
    mountinfo = f"40 30 0:26 /kubepods {mount} rw,relatime - cgroup2 cgroup2 rw\n"
    proc = _proc(tmp_path, 5, "0::/kubepods/pod1/ctr\n", mountinfo)
    directory = mount / "pod1" / "ctr"
    _write(
        directory,
        {
            "cpu.max": "max 100000\n",
            "cpu.stat": "usage_usec 0\n",
            "memory.current": "100\n",
            "memory.max": "max\n",
            "memory.stat": "inactive_file 4096\n",
        },
    )
    files = CgroupFiles.of_pid(5, proc=proc)
    assert files is not None and files.cpu == directory
    assert files.quota() == (-1, 100000)
    assert files.memory_bytes() == (0, -1)  # reclaimable cache larger than usage: never negative


def test_cgroup_v2_without_usage_is_an_oserror(tmp_path: Path) -> None:
    mount = tmp_path / "cg"
    proc = _proc(tmp_path, 5, "0::/a\n", f"30 25 0:26 / {mount} rw - cgroup2 cgroup2 rw\n")
    _write(mount / "a", {"cpu.stat": "user_usec 3\n"})
    files = CgroupFiles.of_pid(5, proc=proc)
    assert files is not None
    with pytest.raises(OSError, match="usage_usec"):
        files.cpu_seconds()


@pytest.mark.parametrize(("state", "flags"), [("Z", 0x40400104), ("R", 0x40400104), ("D", 0x400104)])
def test_cgroup_of_an_exiting_process_is_not_the_root_groups(tmp_path: Path, state: str, flags: int) -> None:
    # cgroup v1 shows an exiting task (PF_EXITING, zombie or not) in every hierarchy's root: a
    # container read just after its process exited got the host's unlimited quota (an ERROR, applied
    # again) and the host's CPU seconds since boot as its own (41,160 s for a 0.01 s `true`)
    mount = tmp_path / "cpu"
    mountinfo = (
        f"35 25 0:30 / {mount} rw - cgroup cgroup rw,cpu,cpuacct\n36 25 0:31 / {mount} rw - cgroup cgroup rw,memory\n"
    )
    proc = _proc(tmp_path, 7, "4:memory:/\n2:cpu,cpuacct:/\n", mountinfo, state, flags)
    _write(mount, {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n", "cpuacct.usage": "41160104927444\n"})
    assert CgroupFiles.of_pid(7, proc=proc) is None


def test_cgroup_of_a_gone_process_or_without_mounts(tmp_path: Path) -> None:
    proc = _proc(tmp_path, 1, "0::/a\n", "25 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    assert CgroupFiles.of_pid(2, proc=proc) is None  # no /proc/2
    assert CgroupFiles.of_pid(1, proc=proc) is None  # no cgroup mount to resolve against


# -- CPU maps ----------------------------------------------------------------------


def test_cpu_map_cuts_nodes_and_takes_the_lowest_free() -> None:
    cpus = CpuMap(list(range(8)), 2)
    assert cpus.cores_per_node == 4
    assert cpus.node_cpus == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert cpus.take(((0, 2), (1, 1))) == [0, 1, 4]
    assert (cpus.free_count(0), cpus.free_count(1)) == (2, 3)
    assert cpus.take(((0, 1),)) == [2]
    cpus.give([0])
    assert cpus.take(((0, 2),)) == [0, 3]
    assert cpus.free_count(0) == 0


def test_cpu_map_failed_take_claims_nothing() -> None:
    cpus = CpuMap([0, 1, 2, 3], 2)
    assert cpus.node_cpus == [[0, 1], [2, 3]]
    with pytest.raises(SchedulingError, match="node 1 has 2 free CPUs, 3 asked"):
        cpus.take(((0, 1), (1, 3)))
    assert (cpus.free_count(0), cpus.free_count(1)) == (2, 2)


def test_cpu_map_claim_and_node_of() -> None:
    cpus = CpuMap([0, 1, 2, 3, 4, 5], 3)
    assert [cpus.node_of(c) for c in range(6)] == [0, 0, 1, 1, 2, 2]
    cpus.claim([4])  # a job adopted after a restart
    assert cpus.free_count(2) == 1
    assert cpus.take(((2, 1),)) == [5]
    with pytest.raises(SchedulingError):
        cpus.take(((2, 1),))
    cpus.give([4, 5])
    assert cpus.free_count(2) == 2


def test_a_job_adopted_on_cores_the_cluster_no_longer_has_is_one_line() -> None:
    """A daemon restarted with `cluster.cores = 1` while a 2-core job ran died in its recovery with
    `KeyError: 1` and a traceback; now one line names the cores, and nothing is claimed."""
    cpus = CpuMap([0], 1)
    with pytest.raises(ConfigError, match=r"^a running job holds cores 0-1, and this cluster has cores 0 only: "):
        cpus.claim([0, 1])
    assert cpus.free_count(0) == 1


def test_cpu_map_cores_run_on_the_host_cpus_given() -> None:
    # cores are numbered 0..n-1; core k runs on the k-th host CPU listed
    cpus = CpuMap([2, 3, 6, 7], 2)
    assert cpus.take(((1, 1),)) == [2]
    assert cpus.cpuset([2]) == [6]
    assert cpus.cpuset([3, 0]) == [2, 7]
    # more cores than CPUs (oversubscribed): a container's cpuset names each CPU once
    shared = CpuMap([0, 1, 0, 1], 2)
    assert shared.cpuset(shared.take(((0, 2), (1, 2)))) == [0, 1]


def test_share_of_takes_the_hosts_first_cpus_per_node() -> None:
    cpus = CpuMap(list(range(8)), 2)
    host = cpus.take(((0, 3), (1, 2)))
    assert host == [0, 1, 2, 4, 5]
    assert share_of(host, ((0, 1), (1, 2)), cpus) == [0, 4, 5]
    assert share_of(host, ((1, 1),), cpus) == [4]
    assert share_of(host, ((0, 0), (1, 1)), cpus) == [4]


# -- submissions ---------------------------------------------------------------------

JOB = {"image": "busybox:latest", "command": ["sleep", "1"], "cores": 2, "walltime": 60}


def _locs(exc: ValidationError) -> list[tuple[str | int, ...]]:
    return [tuple(error["loc"]) for error in exc.errors()]


def test_valid_job_and_its_defaults() -> None:
    spec = JobSpec.model_validate(JOB)
    assert spec.cores == 2 and spec.walltime == 60.0 and spec.command == ["sleep", "1"]
    assert (spec.name, spec.app_class, spec.tasks, spec.parallel, spec.memory_mib) == ("job", "unknown", 1, True, None)
    assert spec.env == {} and spec.data_dirs == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cores": -1}, "cores"),
        ({"cores": 0}, "cores"),
        ({"walltime": 0}, "walltime"),
        ({"walltime": float("inf")}, "walltime"),
        ({"command": []}, "command"),
        ({"command": ""}, "command"),
        ({"command": "echo 'unclosed"}, "command"),
        ({"image": ""}, "image"),
        ({"image": "-flag"}, "image"),
        ({"memory_mib": 0}, "memory_mib"),
        ({"memory_mib": 5}, "memory_mib"),  # below Docker's least limit: the engine would refuse it at launch
        ({"command": ["echo", "a\0b"]}, "command"),
        ({"env": {"X": "a\0b"}}, "env"),
        ({"data_dirs": ["/data/a\0"]}, "data_dirs"),
        ({"data_dirs": ["/data/a", "/data/a/"]}, "data_dirs"),  # two mounts on one place
        ({"tasks": 0}, "tasks"),
        ({"walltime": True}, "walltime"),  # lax mode's 1
        ({"cores": True}, "cores"),
        ({"name": "has space"}, "name"),
        ({"colour": "blue"}, "colour"),  # extra keys are refused, not ignored
    ],
)
def test_bad_job_field_is_named(change: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate({**JOB, **change})
    assert _locs(caught.value) == [(field,)]


@pytest.mark.parametrize("missing", ["image", "command", "cores", "walltime"])
def test_required_job_fields(missing: str) -> None:
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate({k: v for k, v in JOB.items() if k != missing})
    assert _locs(caught.value) == [(missing,)]


def test_string_command_is_split_like_a_shell() -> None:
    spec = JobSpec.model_validate({**JOB, "command": "sh -c 'echo \"hi there\"; exit 3'  "})
    assert spec.command == ["sh", "-c", 'echo "hi there"; exit 3']


def test_unsplittable_command_says_why() -> None:
    with pytest.raises(ValidationError, match="cannot split command: No closing quotation"):
        JobSpec.model_validate({**JOB, "command": "echo 'x"})


def _workflow(**changes: object) -> dict[str, object]:
    document: dict[str, object] = {
        "name": "wf",
        "app": "blast",
        "image": "busybox:latest",
        "command": "true",
        "cores": 2,
        "walltime": 30,
        "stages": [{"name": "split"}, {"name": "align", "depends": ["split"]}],
    }
    document.update(changes)
    return document


def test_valid_workflow_and_its_stage_jobs() -> None:
    spec = WorkflowSpec.model_validate(
        _workflow(
            env={"A": "1", "B": "2"},
            stages=[
                {"name": "split", "walltime": 5},
                {"name": "align", "depends": ["split"], "image": "other:1", "env": {"B": "3"}, "app_class": "x.y"},
            ],
        )
    )
    assert [s.name for s in spec.dag().topological_order()] == ["split", "align"]
    split, align = spec.job_spec("split"), spec.job_spec("align")
    assert (split.name, split.image, split.command, split.walltime, split.cores) == (
        "wf.split",
        "busybox:latest",
        ["true"],
        5.0,
        2,
    )
    assert split.app_class == "blast.split"
    assert (align.image, align.walltime, align.app_class, align.env) == ("other:1", 30.0, "x.y", {"A": "1", "B": "3"})


def test_cyclic_workflow_names_the_cycle() -> None:
    stages = [
        {"name": "start"},
        {"name": "a", "depends": ["start", "b"]},
        {"name": "b", "depends": ["c"]},
        {"name": "c", "depends": ["a"]},
    ]
    with pytest.raises(ValidationError) as caught:
        WorkflowSpec.model_validate(_workflow(stages=stages))
    message = str(caught.value)
    assert "stages: dependency cycle a -> b -> c -> a" in message
    assert message.count("stages:") == 1 and "workflow 'wf'" not in message  # the field once, no repeats


def test_unknown_dependency_is_named() -> None:
    with pytest.raises(ValidationError, match="depends on unknown stage 'ghost'"):
        WorkflowSpec.model_validate(_workflow(stages=[{"name": "a", "depends": ["ghost"]}]))


@pytest.mark.parametrize("field", ["image", "command", "walltime"])
def test_stage_missing_a_field_with_no_workflow_default(field: str) -> None:
    document = _workflow(stages=[{"name": "only"}])
    del document[field]
    with pytest.raises(ValidationError, match=rf"stages\.only\.{field}: missing \(and no workflow default\)"):
        WorkflowSpec.model_validate(document)
    document["stages"] = [{"name": "only", field: JOB[field]}]
    stage_job = WorkflowSpec.model_validate(document).job_spec("only")
    assert getattr(stage_job, field) == getattr(JobSpec.model_validate(JOB), field)


def test_data_dirs_allowed(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "in").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "escape").symlink_to(tmp_path / "outside")
    roots = (str(root),)
    assert data_dirs_allowed([str(root)], roots) == "" and data_dirs_allowed([str(root / "in")], roots) == ""
    assert "is not an absolute path" in data_dirs_allowed(["data/in"], roots)
    assert "not under a configured data root" in data_dirs_allowed([str(tmp_path / "outside")], roots)
    assert "leads through a symlink" in data_dirs_allowed([str(root / "escape")], roots)  # to outside
    assert "none configured" in data_dirs_allowed([str(root)], ())
    assert "is not an existing directory" in data_dirs_allowed([str(root / "missing")], roots)
    # paths the OS refuses to look at are a refusal too, not an exception (a 500 in the API)
    assert "not a usable path: embedded null byte" in data_dirs_allowed([f"{root}/in\x00"], roots)
    assert "not a usable path" in data_dirs_allowed([str(root / ("n" * 300))], roots)


@pytest.mark.parametrize("spelled", ["{root}/in/../in", "{root}/in/./x", "{root}/in/", "/{root}/in", "{root}//in"])
def test_a_data_dir_is_a_plain_path_at_submission_and_at_launch(tmp_path: Path, spelled: str) -> None:
    """A '..' is no link: O_NOFOLLOW let the launch walk climb it from wherever it was, and a job
    renaming one of its own directories between two steps got the walk past '/' to any host
    directory, mounted read-write (a helper's audit: host /etc read by job 61 of 60 tries). Only a
    plain path is accepted, and one accepted before is refused at launch."""
    from cosched.daemon.sandbox import SandboxRefused, open_data_dir

    root = tmp_path / "data"
    (root / "in" / "x").mkdir(parents=True)
    path = spelled.format(root=root)
    assert "is not a plain absolute path" in data_dirs_allowed([path], (str(root),))
    with pytest.raises(SandboxRefused, match="is not a plain absolute path"):
        open_data_dir(path, (str(root),))


def _acl(*entries: tuple[int, int, int]) -> bytes:
    """A `system.posix_acl_access` value: version 2, then (tag, permissions, id) entries."""
    import struct

    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, who) for tag, perm, who in entries)


ANY = 0xFFFFFFFF
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20


@pytest.mark.parametrize(
    ("entries", "groups"),
    [
        ([(USER_OBJ, 7, ANY), (USER, 0, 65534), (GROUP_OBJ, 5, ANY), (MASK, 5, ANY), (OTHER, 5, ANY)], ()),
        ([(USER_OBJ, 7, ANY), (GROUP_OBJ, 0, ANY), (MASK, 5, ANY), (OTHER, 5, ANY)], (4242,)),
        ([(USER_OBJ, 7, ANY), (GROUP_OBJ, 5, ANY), (GROUP, 0, 4243), (MASK, 5, ANY), (OTHER, 5, ANY)], (4243,)),
        ([(USER_OBJ, 7, ANY), (USER, 5, 65534), (GROUP_OBJ, 0, ANY), (MASK, 5, ANY), (OTHER, 0, ANY)], ()),
        ([(USER_OBJ, 7, ANY), (USER, 5, 65534), (GROUP_OBJ, 0, ANY), (MASK, 0, ANY), (OTHER, 5, ANY)], ()),
    ],
    ids=["named-user-denied", "owning-group-denied-under-mask", "named-group-denied", "named-user-let", "masked-out"],
)
def test_a_directorys_acl_decides_who_passes_as_the_kernel_decides(
    entries: list[tuple[int, int, int]], groups: tuple[int, ...]
) -> None:
    """With `run_as = "submitter"` each directory above a data dir must let its submitter pass.
    The mode bits alone let pass whom an ACL entry refuses (the mode's group bits are the mask):
    a helper's audit mounted such directories. The kernel is the oracle here: a process of the
    account stats a file inside."""
    import subprocess
    import tempfile

    from cosched.daemon.accounts import Account
    from cosched.daemon.sandbox import may_search

    if os.geteuid() != 0:
        missing("setting another owner, an ACL and running as another uid need root")

    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        directory = Path(top) / "d"
        (directory / "inside").mkdir(parents=True)
        Path(top).chmod(0o755)
        os.chown(directory, 0, 4242)
        os.setxattr(directory, "system.posix_acl_access", _acl(*entries))
        account = Account(65534, 65534, groups)
        probe = ["/bin/sh", "-c", 'test -e "$1"', "sh", str(directory / "inside")]  # stat: needs search on d
        kernel = subprocess.run(probe, user=65534, group=65534, extra_groups=list(groups), capture_output=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert may_search(fd, account) == (kernel.returncode == 0), kernel.stderr
        finally:
            os.close(fd)


def test_a_data_root_must_be_real_and_only_root_may_replace_it_or_what_lies_above(tmp_path: Path) -> None:
    """A data dir is judged by its path under a root: a user who could make a root (or a directory
    above it) a link to `/` made every host directory a data dir (a helper's audit: host /etc in a
    job). The daemon and each Mesos executor refuse such roots at start."""
    import tempfile

    from cosched.daemon.sandbox import data_dir_problem, root_problem

    if os.geteuid() != 0:
        missing("giving a directory to another owner needs root")
    real = tmp_path / "data"
    real.mkdir()
    assert root_problem(str(real)) == ""  # under /tmp, sticky, and pytest's 0700 directories, root's
    (tmp_path / "link").symlink_to("/")
    assert "is or goes through a symlink" in root_problem(str(tmp_path / "link"))
    assert "is not an existing directory" in root_problem(str(tmp_path / "missing"))
    assert "is not a plain absolute path" in root_problem(f"{real}/")
    assert data_dir_problem("/etc", (str(tmp_path / "link"),)).endswith(
        "is not under a configured data root ({})".format(tmp_path / "link")
    )
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        shared = Path(top) / "scratch"
        (shared / "data").mkdir(parents=True)
        shared.chmod(0o777)
        writable = f"{str(shared)!r} above it is writable by others, who could replace what lies in it"
        assert root_problem(str(shared / "data")) == f"{str(shared / 'data')!r}: {writable}"
        shared.chmod(0o1777)  # sticky, as /tmp: others may not replace root's entries
        assert root_problem(str(shared / "data")) == ""
        os.chown(shared, 65534, 65534)
        assert "above it is owned by uid 65534" in root_problem(str(shared / "data"))
        os.chown(shared, 0, 0)
        shared.chmod(0o755)
        data = shared / "data"
        os.chown(data, 65534, 65534)  # its owner could mount something of theirs over it
        assert root_problem(str(data)) == f"{str(data)!r}: it is owned by uid 65534, who could replace it"
        os.chown(data, 0, 0)
        data.chmod(0o777)
        assert root_problem(str(data)) == f"{str(data)!r}: it is writable by others, who could replace what lies in it"
        data.chmod(0o1777)  # a shared scratch root, as /tmp
        assert root_problem(str(data)) == ""
    assert root_problem("/") == "'/' would make the host's own files data dirs"


def test_an_images_volume_inside_a_data_dir_is_refused_at_launch() -> None:
    """Its tmpfs target would be resolved through the data dir, which the job's user can change
    while the runtime sets the container up (as nested data dirs: a redirect of the job's own
    mounts). A volume that holds a data dir resolves through a fresh tmpfs: it is kept."""
    from cosched.daemon.docker_backend import LaunchRefused, _refuse_volumes_in_data_dirs

    with pytest.raises(LaunchRefused, match=r"declares VOLUME '/d/x/cache' inside data dir '/d/x'"):
        _refuse_volumes_in_data_dirs("img", {"/d/x/cache/": {}}, {"/d/x"})
    _refuse_volumes_in_data_dirs("img", {"/d": {}, "/d/x": {}, "/e": {}}, {"/d/x"})  # around it, the same, apart


def test_data_dirs_that_nest_are_refused_at_submission_and_at_launch(tmp_path: Path) -> None:
    """A mount's target is its path, resolved in the container through the mounts before it: with
    `/d` and `/d/x`, a job that swapped its own `x` for a link got its data mounted over its `/etc`
    (a helper's audit, 8 of 30 tries). Data dirs may not nest, nor be given twice."""
    from cosched.daemon.docker_backend import DockerBackend
    from cosched.daemon.sandbox import SandboxRefused

    root = tmp_path / "data"
    (root / "d" / "x").mkdir(parents=True)
    (root / "e").mkdir()
    roots = (str(root),)
    assert data_dirs_allowed([str(root / "d"), str(root / "e")], roots) == ""
    inside = f"data dir {str(root / 'd' / 'x')!r} is inside {str(root / 'd')!r}: give data dirs that do not nest"
    assert data_dirs_allowed([str(root / "d" / "x"), str(root / "d")], roots) == inside
    assert "is given twice" in data_dirs_allowed([str(root / "e"), str(root / "e")], roots)
    backend = DockerBackend("x", DockerSection(data_roots=[str(root)]))
    spec = {"image": "x", "cores": 1, "data_dirs": [str(root / "d"), str(root / "d" / "x")]}
    with pytest.raises(SandboxRefused, match="is inside"):
        backend.launch(1, spec, "0", 1.0, 64)


def test_a_refused_data_dir_says_nothing_of_what_lies_past_a_directory_its_submitter_may_not_pass() -> None:
    """Checked as root, the path's existence, kind and link target were told before the parents'
    permissions: a probe of another user's 0700 directory learned what it held. The walk checks
    each directory before looking into it: every path past one gets the same refusal."""
    import tempfile

    from cosched.daemon.accounts import Account
    from cosched.daemon.sandbox import data_dir_problem

    if os.geteuid() != 0:
        missing("giving a directory to another owner needs root")
    with tempfile.TemporaryDirectory(dir="/tmp") as open_to_all:  # pytest's own tmp_path is 0700
        root = Path(open_to_all) / "data"
        private = root / "bob"
        (private / "payroll").mkdir(parents=True)
        (private / "latest").symlink_to(private / "payroll")
        for directory in (Path(open_to_all), root):
            directory.chmod(0o755)
        private.chmod(0o700)
        os.chown(private, 1, 1)
        nobody = Account(65534, 65534)
        for name in ("payroll", "missing", "latest"):
            path = str(private / name)
            blocked = f"{path!r}: {str(private)!r} above it does not let uid 65534 (its submitter) pass"
            assert data_dir_problem(path, (str(root),), nobody) == blocked


def test_with_the_job_user_a_data_dir_below_a_directory_it_may_not_pass_is_refused(tmp_path: Path) -> None:
    """Every job runs as `docker.job_user` (`run_as = "job_user"`): Alice's 0700 directory in the
    data root kept her files from uid 65534's own processes, not from another user's job, which
    named a data dir inside it and got the mount (the daemon, root, opens the path; a helper's
    audit). The directories below the data root must let that uid pass; the root and those above
    it are the operator's (a root below pytest's 0700 temporary directory stays usable)."""
    import tempfile

    from cosched.daemon.sandbox import SandboxRefused, open_data_dir

    if os.geteuid() != 0:
        missing("giving a directory to another owner needs root")
    with tempfile.TemporaryDirectory(dir="/tmp") as open_to_all:
        root = Path(open_to_all) / "data"
        private = root / "alice"
        inside = private / "run1"
        inside.mkdir(parents=True)
        for directory in (Path(open_to_all), root):
            directory.chmod(0o755)
        private.chmod(0o700)
        os.chown(private, 2001, 2001)
        os.chown(inside, 65534, 65534)
        who = "docker.job_user, as which jobs run"
        blocked = f"{str(inside)!r}: {str(private)!r} above it does not let uid 65534 ({who}) pass"
        assert data_dirs_allowed([str(inside)], (str(root),)) == blocked
        with pytest.raises(SandboxRefused, match="does not let uid 65534"):  # and at launch
            open_data_dir(str(inside), (str(root),), *runs_as_for(None, "65534:65534"))
        private.chmod(0o711)
        assert data_dirs_allowed([str(inside)], (str(root),)) == ""
    behind = tmp_path / "root"  # pytest's tmp_path is root's, 0700: above the root, not checked
    (behind / "d").mkdir(parents=True)
    assert data_dirs_allowed([str(behind / "d")], (str(behind),)) == ""


def test_a_stage_job_keeps_a_jobs_limits_with_what_it_takes_from_its_workflow() -> None:
    """A stage's job is named `<workflow>.<stage>` and gets the workflow's env and data dirs with
    its own: each within its own limit, together they passed a job's, and the stage's job spec
    then failed inside the submission, a 500 (a security audit). At a job's limits a stage is
    accepted (a key or directory both name counts once); one more is refused, naming the field."""
    stage = "s" * 63
    env = {f"W{i}": "1" for i in range(100)}
    dirs = [f"/d/{i}" for i in range(10)]
    stages = [
        {
            "name": stage,
            "env": {f"W{i}": "2" for i in range(72, 100)} | {f"S{i}": "2" for i in range(28)},
            "data_dirs": [f"/d/{i}/" for i in range(4)] + [f"/e/{i}" for i in range(6)],
        }
    ]
    at_limit = _workflow(name="w" * 64, app="p" * 64, env=env, data_dirs=dirs, stages=stages)
    job = WorkflowSpec.model_validate(at_limit).job_spec(stage)
    assert (len(job.name), len(job.app_class), len(job.env), len(job.data_dirs)) == (128, 128, 128, 16)
    for change, problem in (
        ({"name": "w" * 65}, "name: its job would have 129 characters (the workflow's name, a dot, the stage's)"),
        ({"app": "p" * 65}, "app_class: its job would have 129 characters (app, a dot, the stage's name)"),
        ({"env": {**env, "W100": "1"}}, "env: its job would have 129 variables (the workflow's and the stage's)"),
        (
            {"data_dirs": [*dirs, "/d/10"]},
            "data_dirs: its job would have 17 directories (the workflow's and the stage's)",
        ),
    ):
        with pytest.raises(ValidationError) as caught:
            WorkflowSpec.model_validate({**at_limit, **change})
        [error] = caught.value.errors()
        most = 16 if "data_dirs" in change else 128
        assert str(error["ctx"]["error"]) == f"stages.{stage}.{problem}, at most {most}"


# -- the queue view ----------------------------------------------------------------


def test_status_shows_a_jobs_memory_also_when_it_took_the_default(tmp_path: Path) -> None:
    """A job submitted without `memory_mib` showed none (a walkthrough); its cgroup was given
    `default_memory_per_core` per core, which `status` now says."""
    from fake_engine import Clock, FakeEngine, clocked_daemon

    from cosched.daemon import views

    daemon = clocked_daemon(tmp_path, Clock(), FakeEngine(Clock()), cores=2)
    default = daemon.submit_job(JobSpec(image="x", command=["true"], cores=2, walltime=100))
    asked = daemon.submit_job(JobSpec(image="x", command=["true"], cores=2, memory_mib=64, walltime=100))
    per_core = daemon.config.cluster.default_memory_per_core
    assert views.job_status(daemon, default)["memory_mib"] == 2 * per_core  # type: ignore[index]
    assert views.job_status(daemon, asked)["memory_mib"] == 64  # type: ignore[index]
    daemon.close()


def test_cpus_are_shown_only_where_jobs_are_pinned_to_them(tmp_path: Path) -> None:
    """On one host a job's container is pinned to CPUs, which `status` and `nodes` show; on Mesos a
    node is an agent and a job is pinned to none: `status` showed the daemon host's CPUs (`cpus:
    0-1`, a helper's walkthrough)."""
    from fake_engine import Clock, FakeEngine, clocked_daemon

    from cosched.daemon import views
    from cosched.daemon.backend import NodeStatus

    clock = Clock()
    engine = FakeEngine(clock)
    daemon = clocked_daemon(tmp_path, clock, engine, cores=2)
    job = daemon.submit_job(JobSpec(image="x", command=["true"], memory_mib=64, cores=2, walltime=100))
    daemon.schedule()
    assert views.job_status(daemon, job)["cpus"] == [0, 1]  # type: ignore[index]
    assert [row["jobs"][0]["cpus"] for row in views.nodes(daemon)] == [[0, 1]]
    engine.node_status = lambda: [NodeStatus("agent1", "a1", True)]  # type: ignore[method-assign]
    assert views.job_status(daemon, job)["cpus"] is None  # type: ignore[index]
    [row] = views.nodes(daemon)
    assert row["cpus"] is None and row["jobs"][0]["cpus"] is None and row["hostname"] == "agent1"
    daemon.close()


def test_the_journal_names_cpus_only_where_jobs_are_pinned_to_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`event=launching cpus=0,1,2,3` was journaled on Mesos, which pins no CPU (a helper's walkthrough)."""
    from fake_engine import Clock, FakeEngine, clocked_daemon

    from cosched.daemon.backend import NodeStatus

    clock = Clock()
    engine = FakeEngine(clock)
    daemon = clocked_daemon(tmp_path, clock, engine, cores=4)
    spec = {"image": "x", "command": ["true"], "memory_mib": 64, "walltime": 100}
    with caplog.at_level("INFO", logger="cosched.jobs"):
        pinned = daemon.submit_job(JobSpec(**spec, cores=2))
        daemon.schedule()
        engine.node_status = lambda: [NodeStatus("agent1", "a1", True)]  # type: ignore[method-assign]
        agents = daemon.submit_job(JobSpec(**spec, cores=2))
        daemon.schedule()
    lines = [r.getMessage() for r in caplog.records if "event=launching" in r.getMessage()]
    assert [f"job={pinned} " in line and "cpus=0,1" in line for line in lines] == [True, False]
    assert f"job={agents} " in lines[1] and "cpus=" not in lines[1]
    daemon.close()


def test_the_job_gauges_count_the_cores_running_and_pending_jobs(tmp_path: Path) -> None:
    """`cosched_running_jobs` and `cosched_pending_jobs`, read off the core's own lists: counting every
    job's state took most of a pass with 10,000 queued (`benchmarks/mesos.py`, profiled)."""
    from fake_engine import Clock, FakeEngine, clocked_daemon

    from cosched.daemon import job_actions, views
    from cosched.daemon.identity import ANONYMOUS

    clock = Clock()
    daemon = clocked_daemon(tmp_path, clock, FakeEngine(clock), cores=2)
    spec = {"image": "x", "command": ["true"], "memory_mib": 64, "walltime": 100}
    daemon.submit_job(JobSpec(**spec, cores=2))
    daemon.schedule()
    queued = [daemon.submit_job(JobSpec(**spec, cores=1)) for _ in range(3)]
    job_actions.hold(daemon, queued[0], ANONYMOUS, True)
    daemon.schedule()
    states = [row["state"] for row in views.queue(daemon)]
    gauges = dict(
        line.rsplit(" ", 1) for line in daemon.metrics.render().decode().splitlines() if line.startswith("cosched_")
    )
    assert (states.count("running"), states.count("pending")) == (1, 3)
    assert (gauges["cosched_running_jobs"], gauges["cosched_pending_jobs"]) == ("1.0", "3.0")
    daemon.close()


def test_a_restart_under_another_trained_model_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A policy's trained model is a file the config names: replaced between two starts, the
    daemon's decisions changed without a word, the history before them the old model's. Its
    digest is kept in the state file, and a start under another model says so; the same model,
    copied elsewhere, is no change."""
    from dataclasses import replace

    from fake_engine import Clock, FakeEngine, clocked_daemon

    from cosched.learn.models import model_path
    from cosched.learn.network import PolicyNetwork

    shipped = model_path("rlbf", "hpc2n")
    model = tmp_path / "site.npz"
    model.write_bytes(shipped.read_bytes())
    state = tmp_path / "state"

    def start() -> str:
        caplog.clear()
        clock = Clock()
        daemon = clocked_daemon(state, clock, FakeEngine(clock), cores=2, backfill=f"rlbf:{model}")
        daemon.close()
        return caplog.text

    with caplog.at_level("WARNING", logger="cosched.daemon"):
        assert "another trained model" not in start()  # the first: nothing to compare with
        assert "another trained model" not in start()  # the same file
        network = PolicyNetwork.load(shipped)
        replace(network, biases=tuple(b + 0.5 for b in network.biases)).save(model)
        said = start()
    digest = PolicyNetwork.load(model).digest
    assert f"policies.backfill runs another trained model than at the last start (sha256 {digest}, then" in said
    assert PolicyNetwork.load(shipped).digest in said


def test_the_queue_says_why_a_job_was_not_co_scheduled(tmp_path: Path) -> None:
    """Beside running jobs that could lend, `cosched queue` said only Resources (a helper's
    walkthrough: why no lending?). The core's reason is added to the job's, and its expected start
    is still the backfill's."""
    from fake_engine import Clock, FakeEngine, clocked_daemon

    from cosched.daemon import views

    clock = Clock()
    daemon = clocked_daemon(tmp_path, clock, FakeEngine(clock), cores=4, cosched="static")
    spec = {"image": "x", "command": ["true"], "memory_mib": 64, "walltime": 100}
    for _ in range(2):
        daemon.submit_job(JobSpec(**spec, cores=2))
    daemon.schedule()
    wide = daemon.submit_job(JobSpec(**spec, cores=4))
    daemon.schedule()
    row = {row["id"]: row for row in views.queue(daemon)}[wide]
    assert row["reason"] == "Resources; not co-scheduled: no running job of 4+ cores"
    assert row["start"] == 1100.0
    assert views.job_status(daemon, wide)["pending_reason"] == row["reason"]  # type: ignore[index]
    daemon.close()


def test_the_blocked_head_shows_its_expected_start_while_the_cluster_is_full(tmp_path: Path) -> None:
    """EASY reserves only when a pass asks it for a plan, which needs a free core and a job to
    backfill: with the cluster full `cosched queue` and `status` showed no expected start for the
    head, the usual case (a helper's walkthrough). Now the head's is EASY's shadow time."""
    from fake_engine import Clock, FakeEngine, clocked_daemon

    from cosched.daemon import views

    clock = Clock()
    daemon = clocked_daemon(tmp_path, clock, FakeEngine(clock), cores=2)
    spec = {"image": "x", "command": ["true"], "memory_mib": 64}
    busy = daemon.submit_job(JobSpec(**spec, cores=2, walltime=100))
    daemon.schedule()
    clock.t = 1010.0
    head = daemon.submit_job(JobSpec(**spec, cores=1, walltime=50))
    behind = daemon.submit_job(JobSpec(**spec, cores=2, walltime=50))
    daemon.schedule()
    rows = {row["id"]: row for row in views.queue(daemon)}
    assert rows[busy]["state"] == "running"
    assert (rows[head]["reason"], rows[head]["start"]) == ("Resources", 1100.0)
    assert (rows[behind]["reason"], rows[behind]["start"]) == ("Priority", None)
    assert views.job_status(daemon, head)["expected_start"] == 1100.0  # type: ignore[index]
    daemon.close()


@pytest.mark.parametrize("how", ["cancelled", "failed"])
def test_a_workflow_whose_stage_is_cancelled_is_cancelled_not_failed(tmp_path: Path, how: str) -> None:
    """`cosched cancel --workflow` cancels its stages; the workflow then read `failed`, its stage
    `exit code 137`, as if it had crashed (a helper's walkthrough). A stage that fails still fails it."""
    from fake_engine import Clock, FakeEngine, clocked_daemon

    from cosched.daemon import views

    clock = Clock()
    engine = FakeEngine(clock)
    daemon = clocked_daemon(tmp_path, clock, engine, cores=2)
    spec = {"name": "w", "image": "x", "command": "true", "cores": 1, "memory_mib": 64, "walltime": 100}
    stages = [{"name": "a"}, {"name": "b", "depends": ["a"]}]
    workflow, [first] = daemon.submit_workflow(WorkflowSpec(**spec, stages=stages))
    daemon.schedule()
    clock.t += 5
    if how == "cancelled":
        daemon.cancel(first)
    else:
        engine.finish(first, 1)
    for _ in range(3):
        daemon.schedule()
        clock.t += 1
    status = views.workflow_status(daemon, workflow)
    assert status is not None
    assert (status["state"], status["failed_stage"]) == (how, "a")
    assert {stage: info["state"] for stage, info in status["stages"].items()} == {"a": how, "b": "cancelled"}
    daemon.close()


def test_a_workflow_whose_stage_the_core_refuses_fails_and_frees_its_room(tmp_path: Path) -> None:
    """A stage the core refuses (here: a per-user core cap lowered before a restart) was marked
    failed alone: its workflow stayed `running` for ever, and its stages to come kept their room
    under the job caps (an audit of the two worlds). It now fails its workflow as a failed run does."""
    from fake_engine import Clock, FakeEngine, clocked_daemon

    from cosched.daemon import views

    clock = Clock()
    engine = FakeEngine(clock)
    daemon = clocked_daemon(tmp_path, clock, engine, cores=4, max_cores_per_user=4)
    spec = {"name": "w", "image": "x", "command": "true", "cores": 2, "memory_mib": 64, "walltime": 100}
    workflow, [first] = daemon.submit_workflow(
        WorkflowSpec(**spec, stages=[{"name": "a"}, {"name": "b", "depends": ["a"]}])
    )
    blocker = daemon.submit_job(JobSpec(image="x", command=["true"], cores=4, memory_mib=64, walltime=100))
    daemon.close()
    daemon = clocked_daemon(tmp_path, clock, engine, cores=4, max_cores_per_user=1)
    daemon.schedule()
    status = views.workflow_status(daemon, workflow)
    assert status is not None
    assert (status["state"], status["failed_stage"]) == ("failed", "a")
    assert {stage: info["state"] for stage, info in status["stages"].items()} == {"a": "failed", "b": "cancelled"}
    assert "max_cores_per_user" in str(daemon.store.job(first)["reason"])
    assert daemon.store.job(blocker)["state"] == "failed"
    with daemon.store.transaction() as db:
        assert daemon.store.count_live(db) == 0  # stage b's room is free again
    daemon.close()


def test_a_stored_workflow_that_todays_checks_refuse_fails_and_the_others_run_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A workflow accepted under older checks (here: a stage image with '..', which image names may
    no longer have) is read again at each stage's end. Its spec no longer validated, and the pass
    failed on it, then every pass after: no job started and no end was collected. The workflow now
    fails naming why, and the pass goes on."""
    import json

    from fake_engine import Clock, FakeEngine, clocked_daemon

    from cosched.daemon import views

    clock = Clock()
    engine = FakeEngine(clock)
    daemon = clocked_daemon(tmp_path, clock, engine, cores=4)
    spec = {"name": "w", "image": "x", "command": "true", "cores": 1, "memory_mib": 64, "walltime": 100}
    workflow, [first] = daemon.submit_workflow(
        WorkflowSpec(**spec, stages=[{"name": "a"}, {"name": "b", "depends": ["a"]}])
    )
    stored = daemon.store.workflow(workflow)["spec"]  # type: ignore[index]
    stored["stages"][1]["image"] = "a/../x"
    with daemon.store.transaction() as db:
        db.execute("UPDATE workflows SET spec = ? WHERE id = ?", (json.dumps(stored), workflow))
    daemon.schedule()
    other = daemon.submit_job(JobSpec(image="x", command=["true"], cores=1, memory_mib=64, walltime=100))
    engine.finish(first)
    daemon.schedule()
    daemon.schedule()
    assert daemon.store.job(other)["state"] == "running"
    status = views.workflow_status(daemon, workflow)
    assert status is not None and status["state"] == "failed", status
    assert status["stages"]["a"]["state"] == "done" and status["stages"]["b"]["state"] == "cancelled"
    assert status["failed_stage"] == "b"
    assert "workflow 1 fails: its stage b no longer passes today's checks (stages.1.image: " in caplog.text
    daemon.close()


def test_the_api_refuses_a_job_whose_memory_no_node_holds_as_the_core_would(tmp_path: Path) -> None:
    """Two nodes of 4 cores and 4,096 MiB: a 2-core job asking 6,000 MiB fits the cluster's 8,192 in
    all, was accepted, and was refused by the core's per-node rule at the next pass (an audit of
    the two worlds). Both now read one rule (`Cluster.memory_on_one_node`); a gang spread over both
    nodes may still ask for all of it."""
    from fake_engine import Clock, FakeEngine

    from cosched.daemon.service import Daemon
    from cosched.daemon.submissions import Rejected

    clock = Clock()
    config = from_dict(
        {
            "daemon": {"state_dir": str(tmp_path)},
            "cluster": {"nodes": 2, "cores": 8, "memory_mib": 8192},
            "policies": {"cosched": "none"},
        }
    )
    daemon = Daemon(config, backend=FakeEngine(clock), clock=clock)  # type: ignore[arg-type]
    daemon.start()
    spec = {"image": "x", "command": ["true"], "walltime": 100}
    with pytest.raises(Rejected, match=r"^memory_mib: 6000 MiB asked on one node, and a node has 4096 MiB$"):
        daemon.submit_job(JobSpec(**spec, cores=2, memory_mib=6000))
    with pytest.raises(Rejected, match=r"^memory_mib: 9000 MiB asked, 4500 MiB of it on one node, and a node has"):
        daemon.submit_job(JobSpec(**spec, cores=8, memory_mib=9000, span=True))
    gang = daemon.submit_job(JobSpec(**spec, cores=8, memory_mib=8192, span=True))
    daemon.schedule()
    assert daemon.store.job(gang)["state"] == "running"
    daemon.close()


def test_a_workflows_stages_to_come_keep_its_room_under_the_job_caps(tmp_path: Path) -> None:
    """A workflow needs room for all its stages, but the caps counted only those submitted: five
    workflows of a stage fanning out to five fit `max_jobs_per_user = 10` and became 25 live jobs
    once their first stages ended (a security audit). The stages to come keep their room, per user
    and in all, until a stage fails: the rest never come, and their room is free again."""
    from fake_engine import Clock, FakeEngine

    from cosched.daemon.service import Daemon
    from cosched.daemon.submissions import Full

    clock = Clock()
    engine = FakeEngine(clock)
    document = {
        "daemon": {"state_dir": str(tmp_path)},
        "cluster": {"cores": 8, "memory_mib": 8192},
        "api": {"max_jobs": 12, "max_jobs_per_user": 10},
        "policies": {"cosched": "none"},
    }
    daemon = Daemon(from_dict(document), backend=engine, clock=clock)  # type: ignore[arg-type]
    daemon.start()
    shared = {"image": "x", "command": ["true"], "cores": 1, "memory_mib": 64, "walltime": 100}
    fan_out = WorkflowSpec(
        **shared, name="fan", stages=[{"name": "a"}, *({"name": f"b{i}", "depends": ["a"]} for i in range(5))]
    )
    chain = WorkflowSpec(**shared, name="chain", stages=[{"name": "a"}, {"name": "b", "depends": ["a"]}])
    _, [mallorys] = daemon.submit_workflow(fan_out, user="mallory")
    with pytest.raises(Full, match=r"^mallory has 6 jobs queued, running or to come in workflows, at most 10 "):
        daemon.submit_workflow(fan_out, user="mallory")
    _, [bobs] = daemon.submit_workflow(fan_out, user="bob")
    with pytest.raises(Full, match=r"^the daemon holds 12 jobs queued, running or to come in workflows, at most 12 "):
        daemon.submit_job(JobSpec(**shared), user="carol")
    daemon.schedule()
    engine.finish(mallorys)  # her five stages come, in the room they held
    engine.finish(bobs, 1)  # his never will
    clock.t += 10
    daemon.schedule()
    daemon.schedule()
    assert len(daemon.store.jobs(("pending", "launching", "running"))) == 5
    with daemon.store.transaction() as db:
        assert (daemon.store.count_live(db, "mallory"), daemon.store.count_live(db)) == (5, 5)
    daemon.submit_workflow(chain, user="mallory")  # within both caps
    with daemon.store.transaction() as db:
        assert (daemon.store.count_live(db, "mallory"), daemon.store.count_live(db, "bob")) == (7, 0)
    daemon.close()
    # A state file from before the stages to come were kept: its running workflows' are counted at the start.
    with sqlite3.connect(tmp_path / "state.sqlite") as conn:
        conn.execute("DROP INDEX workflows_state")
        conn.execute("ALTER TABLE workflows DROP COLUMN to_come")
    older = Store(tmp_path / "state.sqlite")
    try:
        with older.transaction() as db:
            assert (older.count_live(db, "mallory"), older.count_live(db, "bob")) == (7, 0)
    finally:
        older.close()


def test_health_counts_held_jobs_as_pending(tmp_path: Path) -> None:
    """`/v1/health` said `queued: 0` while `cosched queue` listed a held job PENDING (a helper's
    walkthrough): `pending` counts what squeue -t PD does, `queued` what the policies order."""
    from fake_engine import Clock, FakeEngine, clocked_daemon
    from fastapi.testclient import TestClient

    from cosched.daemon.api import create_app
    from cosched.daemon.identity import ANONYMOUS

    clock = Clock()
    daemon = clocked_daemon(tmp_path, clock, FakeEngine(clock), cores=1)
    spec = {"image": "x", "command": ["true"], "cores": 1, "memory_mib": 64, "walltime": 100}
    jobs = [daemon.submit_job(JobSpec(**spec)) for _ in range(3)]
    daemon.hold(jobs[2], ANONYMOUS, True)
    daemon.schedule()
    with TestClient(create_app(daemon)) as client:
        assert client.get("/v1/health").json()["jobs"] == {"queued": 1, "pending": 2, "running": 1}
    daemon.close()


def test_queue_view_shows_the_cores_order_and_reservations() -> None:
    """`cosched queue` lists pending jobs in the queue policy's order (WFP3 here, not arrival)
    and shows the start the core's backfill policy reserved, not a second scheduler's guess."""
    from cosched.core.events import JobSubmitted, Offer
    from cosched.core.scheduler import Scheduler
    from cosched.daemon import views
    from cosched.model import Cluster, Job
    from cosched.policies.registry import create

    cluster = Cluster(1, 4)
    core = Scheduler(
        cluster,
        create("queue", "wfp3"),
        create("backfill", "easy"),
        create("estimate", "requested"),
        create("placement", "first-fit"),
        create("cosched", "none"),
    )
    big = Job(id=1, submit=0.0, cores=3, walltime=100.0)
    core.step(0.0, [Offer(((0, 4),), (0,)), JobSubmitted(big)])  # 3 of 4 cores until 100
    # Arrival order 2, 3, 4; WFP3 favours the long wait relative to walltime: 3 first, then 2, 4.
    waiting = [
        Job(id=2, submit=10.0, cores=2, walltime=1000.0),
        Job(id=3, submit=11.0, cores=4, walltime=20.0),
        Job(id=4, submit=12.0, cores=1, walltime=5000.0),
    ]
    decision = core.step(50.0, [JobSubmitted(j) for j in waiting])
    for_offers: dict[int, str] = {}
    daemon = SimpleNamespace(
        clock=lambda: 50.0,
        core=core,
        cluster=cluster,
        reservations=decision.reservations,
        inbox=[],
        specs={},
        backend=SimpleNamespace(waiting=lambda: for_offers),
        store=SimpleNamespace(owners=lambda: {3: "alice"}),
        down=set(),
        drained={},
        containers={},
    )
    rows = views.queue(daemon)  # type: ignore[arg-type]
    pending = [(r["id"], r["reason"], r["start"]) for r in rows if r["state"] == "pending"]
    expected = [j.id for j in sorted(waiting, key=lambda j: core.queue_policy.score(j, 50.0))]
    assert [job_id for job_id, _, _ in pending] == expected == [3, 2, 4]
    assert [reason for _, reason, _ in pending] == ["Resources", "Priority", "Priority"]
    assert {r["id"]: r["user"] for r in rows} == {3: "alice", 2: "", 4: "", 1: ""}
    # EASY reserves for the blocked head alone, at the big job's expected end; nothing backfills
    # (job 4 would hold the one free core past 100, where the head needs all four).
    assert dict(decision.reservations) == {3: 100.0}
    assert {job_id: start for job_id, _, start in pending} == {3: 100.0, 2: None, 4: None}
    assert [r["id"] for r in rows if r["state"] == "running"] == [1]
    # On Mesos the core's launch may wait for the agent's offer: the row says so.
    for_offers[1] = "waiting for offers of agent1"
    [row] = [r for r in views.queue(daemon) if r["id"] == 1]  # type: ignore[arg-type]
    assert (row["state"], row["reason"]) == ("launching", "waiting for offers of agent1")
    # A run lost with its agent, which waits for its fence: running still, and why it will be queued.
    daemon.containers[1] = "cosched-job-1-r1"
    for_offers[1] = "lost with agent1: queued again once its executor's fence has passed"
    [row] = [r for r in views.queue(daemon) if r["id"] == 1]  # type: ignore[arg-type]
    assert (row["state"], row["reason"]) == ("running", for_offers[1])
    # A job the machines still up can never hold (conservative's reservation at infinity, with a
    # Mesos agent gone) shows no start, and the queue stays JSON (no Infinity).
    daemon.reservations = {3: math.inf, 2: 120.0}
    starts = {r["id"]: r["start"] for r in views.queue(daemon) if r["state"] == "pending"}  # type: ignore[arg-type]
    assert starts == {3: None, 2: 120.0, 4: None}
    json.dumps(views.queue(daemon), allow_nan=False)  # type: ignore[arg-type]


def test_unreachable_engine_is_one_line_naming_the_address(tmp_path: Path) -> None:
    """`cosched daemon` with no engine at the configured address: exit 2, one line, the address named."""
    import subprocess
    import sys

    from cosched.daemon.docker_backend import DockerBackend, EngineUnavailable

    socket_path = tmp_path / "no-engine.sock"
    with pytest.raises(EngineUnavailable, match=r"no-engine\.sock"):
        DockerBackend("x", DockerSection(base_url=f"unix://{socket_path}")).connect()
    config = tmp_path / "cosched.toml"
    config.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[api]\nport = {_free_port()}\n'
        f'[docker]\nbase_url = "unix://{socket_path}"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "cosched.cli", "daemon", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("cosched: error: cannot reach the Docker engine at unix://"), done.stderr
    assert "Traceback" not in done.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _EngineRefusingUpdates:
    """The engine's answer when runc updates a container that is exiting: a 500, then the
    container's state. Only a real exit race produces it, which no test can time."""

    def __init__(self, running: bool) -> None:
        self.running = running
        self.api = self

    def update_container(self, container_id: str, **quota: int) -> None:
        import docker

        response = requests.Response()
        response.status_code = 500
        raise docker.errors.APIError("update", response, explanation="runc did not terminate successfully")

    def inspect_container(self, container_id: str) -> dict[str, dict[str, bool]]:
        return {"State": {"Running": self.running}}


@pytest.mark.parametrize("running", [False, True])
def test_quota_update_refused_mid_exit_is_an_end_not_an_engine_failure(running: bool) -> None:
    """A 500 from `update` on a container that has stopped running is its end (the next pass
    collects it); on a container still running it is the engine failing, and said so."""
    from cosched.daemon.docker_backend import DockerBackend, EngineUnavailable

    backend = DockerBackend("x", DockerSection())
    backend._client = _EngineRefusingUpdates(running)  # type: ignore[assignment]
    if running:
        with pytest.raises(EngineUnavailable, match=r"updating the quota of abc: 500 .*runc did not terminate"):
            backend.set_quota("abc", 0.5)
    else:
        backend.set_quota("abc", 0.5)


class _CgroupReadings:
    """A container's cgroup as `DockerBackend.sample` reads it: CPU seconds the test adds to."""

    def __init__(self, tmp_path: Path) -> None:
        self.used = 100.0
        self.cpu = tmp_path  # exists

    def cpu_seconds(self) -> float:
        return self.used

    def memory_bytes(self) -> tuple[int, int]:
        return 10, 100


def test_a_cpu_sample_is_a_rate_under_one_quota_never_a_first_reading_or_one_across_a_change(tmp_path: Path) -> None:
    """CPU% is CPU used between two readings over the quota granted. A container's first reading
    has no interval: it read 0 (idle), and ASAx tries the least busy lender first. An interval
    across a quota change read a share of neither (a fully busy job 0.75 or 1.5): each is
    labelled with the current quota and judged as one taken under it. Neither is a sample."""
    from cosched.daemon.docker_backend import DockerBackend

    backend = DockerBackend("x", DockerSection())
    cgroup = _CgroupReadings(tmp_path)
    backend._cgroups["c"], backend._pids["c"] = cgroup, 1  # type: ignore[assignment]
    backend._progress = lambda container: (0, 0)  # type: ignore[method-assign]
    assert backend.sample("c", 4.0, 2.0) is None  # busy on 4 CPUs since its start: not known yet
    cgroup.used += 8.0
    assert backend.sample("c", 4.0, 4.0).cpu == pytest.approx(1.0)  # type: ignore[union-attr]
    cgroup.used += 4.0 + 2.0  # 1 s on 4 CPUs, then it lent half: 1 s on 2
    assert backend.sample("c", 2.0, 6.0) is None
    cgroup.used += 4.0
    assert backend.sample("c", 2.0, 8.0).cpu == pytest.approx(1.0)  # type: ignore[union-attr]


def test_the_shipped_configs_are_the_defaults_and_a_valid_mesos_example() -> None:
    """deploy/cosched.toml lists every key at its default; deploy/mesos/cosched-mesos.toml loads."""
    import dataclasses

    from cosched.daemon.config import DaemonConfig, load_config

    deploy = Path(__file__).resolve().parents[1] / "deploy"
    shipped = load_config(deploy / "cosched.toml")
    defaults = DaemonConfig()
    listed = tomllib.loads((deploy / "cosched.toml").read_text())
    for section in dataclasses.fields(DaemonConfig):  # every key, not only those whose value differs
        keys = {key.name for key in dataclasses.fields(getattr(defaults, section.name))}
        assert set(listed.get(section.name, {})) == keys, section.name
    for section in dataclasses.fields(DaemonConfig):
        if section.name == "daemon":
            continue  # its state_dir default depends on who runs it
        assert getattr(shipped, section.name) == getattr(defaults, section.name), section.name
    mesos = load_config(deploy / "mesos" / "cosched-mesos.toml")
    assert (mesos.backend.kind, mesos.cluster.nodes) == ("mesos", 2)


def test_weights_learned_under_another_learner_setting_are_said_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Changing `policies.learner` keys the weights differently: the daemon says the saved ones
    go unused instead of silently learning from uniform weights again."""
    from cosched.daemon.service import Daemon
    from experts.weights import WeightBook

    book = WeightBook(4)
    book.get("montage").update()
    store = Store(tmp_path / "state.sqlite")
    with store.transaction() as db:
        store.set_meta(db, "weights", book.to_state())
        store.set_meta(db, "learner", "class")

    def start(learner: str) -> Daemon:
        config = from_dict({"daemon": {"state_dir": str(tmp_path)}, "policies": {"learner": learner}})
        return Daemon(config)

    with caplog.at_level("WARNING", logger="cosched.daemon"):
        daemon = start("app")
    assert "learned with learner = 'class'; under learner = 'app'" in caplog.text
    assert daemon.asax is not None and daemon.asax.book.get("montage").t == 1  # kept, not dropped
    caplog.clear()
    with caplog.at_level("WARNING", logger="cosched.daemon"):
        start("class")
    assert "learned with learner" not in caplog.text


def test_weights_learned_for_another_expert_set_are_dropped_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Weights are by expert index: after `policies.experts` names another set (one fitted from the
    daemon's own decisions), the saved ones would weigh experts they never saw. They are dropped,
    and said so; with the same set they are kept, and a state file from before the set's digest was
    saved keeps them too."""
    from cosched.daemon.service import Daemon
    from experts.default import default_experts
    from experts.tree import ExpertSet
    from experts.weights import WeightBook

    shipped = default_experts()
    other = ExpertSet([*shipped.experts[1:], shipped.experts[0]])  # the same experts, another order
    other.save(tmp_path / "other.json")
    book = WeightBook(4)
    book.get("montage").update()
    store = Store(tmp_path / "state.sqlite")
    with store.transaction() as db:
        store.set_meta(db, "weights", book.to_state())
        store.set_meta(db, "learner", "app")

    def start(experts: str) -> Daemon:
        return Daemon(from_dict({"daemon": {"state_dir": str(tmp_path)}, "policies": {"experts": experts}}))

    def learned(daemon: Daemon) -> int:
        assert daemon.asax is not None
        return daemon.asax.book.get("montage").t

    assert learned(start(str(tmp_path / "other.json"))) == 1  # no digest saved yet: kept
    with store.transaction() as db:
        store.set_meta(db, "experts", shipped.digest())
    with caplog.at_level("WARNING", logger="cosched.daemon"):
        assert learned(start("")) == 1
    assert "another expert set" not in caplog.text
    with caplog.at_level("WARNING", logger="cosched.daemon"):
        assert learned(start(str(tmp_path / "other.json"))) == 0
    assert "the saved weights were learned for another expert set" in caplog.text
    store.close()


def test_the_journal_quotes_a_value_that_is_not_plain_printable_text() -> None:
    """A journal value is often a job's own words (a reason quoting its command): one holding a
    control character is JSON-quoted, so tailing the log never feeds a terminal escape sequences."""
    from cosched.daemon.journal import _line

    line = _line(3, "failed", reason="exec:\x1b]0;owned\x07", app_class="blast.blastn", note="a b", empty="")
    assert line == 'job=3 event=failed reason="exec:\\u001b]0;owned\\u0007" app_class=blast.blastn note="a b" empty=""'


def test_every_line_of_the_daemons_log_is_printable() -> None:
    """Not only the journal: the daemon's other lines quote jobs' words too (an engine refusing a
    launch names the command), and a job's escape sequences retitled and cleared the terminal of
    an operator tailing the log (a helper's audit), a newline could forge a line. The daemon and
    the Mesos executor log through `log_to_stderr`; a traceback, the daemon's own, stays as is."""
    import subprocess
    import sys

    program = (
        "import logging\nfrom cosched.daemon import journal\njournal.log_to_stderr()\n"
        "log = logging.getLogger('cosched.daemon')\n"
        "log.warning('job %d could not start: %s', 3, 'stat /nope\\x1b]0;PWNED\\x07\\x1b[2J\\nforged line')\n"
        "try:\n    raise RuntimeError('exec: \\x1b[2J')\nexcept RuntimeError:\n    log.exception('a pass failed')\n"
    )
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    lines = run.stderr.splitlines()
    assert lines[0].endswith(r"job 3 could not start: stat /nope\x1b]0;PWNED\x07\x1b[2J\nforged line")
    assert all(line.isprintable() for line in lines)
    assert lines[-1] == r"RuntimeError: exec: \x1b[2J" and lines[-2].startswith("  File ")  # a traceback still
    for source in ("cosched/daemon/run.py", "cosched/mesos/executor.py"):
        text = (Path(__file__).parents[1] / source).read_text()
        assert "journal.log_to_stderr()" in text and "basicConfig" not in text


def test_the_state_file_is_its_owners_alone(tmp_path: Path) -> None:
    """It holds every job's environment: 0600, its WAL and shared memory too, and a file an older
    daemon left readable by others is made private at the next start."""
    import stat as stat_module

    from cosched.daemon.store import Store

    def modes() -> list[int]:
        return [stat_module.S_IMODE((tmp_path / f"state.sqlite{s}").stat().st_mode) for s in ("", "-wal", "-shm")]

    store = Store(tmp_path / "state.sqlite")
    with store.transaction() as db:
        store.add_job(db, {"cores": 1, "env": {"TOKEN": "secret"}}, 1.0)
    assert modes() == [0o600, 0o600, 0o600]
    store.close()  # the last connection: SQLite folds the WAL in and removes it
    (tmp_path / "state.sqlite").chmod(0o644)
    reopened = Store(tmp_path / "state.sqlite")
    try:
        assert len(reopened.jobs()) == 1
        assert modes() == [0o600, 0o600, 0o600]
    finally:
        reopened.close()


@pytest.mark.parametrize("batch", [1, 5000])
def test_purge_deletes_what_ended_long_ago_never_a_stage_a_workflow_needs(tmp_path: Path, batch: int) -> None:
    """`daemon.keep_ended_days`: what ended before the cut goes, with its quota log; a workflow's jobs
    only once the workflow is over and all of them ended before the cut, and the workflow with them."""
    from cosched.daemon.store import Store

    store = Store(tmp_path / "state.sqlite")

    def job(state: str, end: float | None, workflow: int | None = None) -> int:
        with store.transaction() as db:
            job_id = store.add_job(db, {"cores": 1}, 0.0, workflow)
            store.update_job(db, job_id, state=state, end=end)
            store.log_quota(db, job_id, 1.0, 0.0)
        return job_id

    def workflow(state: str) -> int:
        with store.transaction() as db:
            workflow_id = store.add_workflow(db, "wf", {}, 0.0)
            store.update_workflow(db, workflow_id, state)
        return workflow_id

    old, recent, running = job("done", 100.0), job("failed", 2000.0), job("running", None)
    cancelled_pending = job("cancelled", 50.0)
    over, going, failed = workflow("done"), workflow("running"), workflow("failed")
    for state, end in (("done", 100.0), ("failed", 200.0)):
        job(state, end, over)  # the workflow is over and every one of them ended before the cut
    going_jobs = [job("done", 100.0, going), job("pending", None, going)]
    failed_jobs = [job("failed", 100.0, failed), job("running", None, failed)]
    try:
        assert store.purge_ended(1000.0, batch=batch) == 4
        assert [j["id"] for j in store.jobs()] == [recent, running, *going_jobs, *failed_jobs]
        assert store.workflow(over) is None  # over, and its jobs gone: it goes too
        assert store.workflow(going) is not None and store.workflow(failed) is not None
        assert [store.quota_changes(j) != [] for j in (old, recent, cancelled_pending)] == [False, True, False]
        assert store.purge_ended(1000.0, batch=batch) == 0
    finally:
        store.close()


@pytest.mark.parametrize("killed_once", [False, True])
def test_a_state_file_from_before_charges_were_saved_gets_one_per_ended_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, killed_once: bool
) -> None:
    """Fair-share is rebuilt from the charges each pass saves; a file an older daemon wrote has none,
    and starts with each ended job's last run at its cores, or its users' history would be lost.
    A start killed during the upgrade leaves the file as it was: the next start upgrades it."""
    import sqlite3

    from cosched.daemon.store import Store

    store = Store(tmp_path / "state.sqlite")
    with store.transaction() as db:
        ran = store.add_job(db, {"cores": 4}, 0.0, user="alice")
        store.update_job(db, ran, state="done", start=100.0, end=160.0)
        never = store.add_job(db, {"cores": 2}, 0.0, user="bob")
        store.update_job(db, never, state="cancelled", end=50.0)
        store.add_job(db, {"cores": 8}, 0.0, user="carol")  # pending
    store.close()
    with sqlite3.connect(tmp_path / "state.sqlite") as conn:
        conn.execute("DROP TABLE charges")
    if killed_once:

        def killed(self: Store, charged: bool) -> None:
            raise RuntimeError("killed between the tables' creation and the back-fill")

        with monkeypatch.context() as patch:
            patch.setattr(Store, "_upgrade", killed)
            with pytest.raises(RuntimeError, match="killed"):
                Store(tmp_path / "state.sqlite")
    older = Store(tmp_path / "state.sqlite")
    try:
        assert older.charges_since(0.0) == [(ran, "alice", 4.0, 100.0, 160.0)]
    finally:
        older.close()
    again = Store(tmp_path / "state.sqlite")  # once: the table is there now
    try:
        assert len(again.charges_since(0.0)) == 1
    finally:
        again.close()


def test_purge_keeps_what_a_live_job_or_running_workflow_depends_on(tmp_path: Path) -> None:
    """A dependency is judged again from the file (at a restart, or for a workflow's later stage):
    a target purged would cancel its dependant, `DependencyNeverSatisfied`, however long ago it was
    met. Targets of live jobs and of running workflows stay; those of ended ones go."""
    from cosched.daemon.store import Store

    store = Store(tmp_path / "state.sqlite")

    def job(state: str, end: float | None, after: list[dict[str, object]] | None = None) -> int:
        with store.transaction() as db:
            job_id = store.add_job(db, {"cores": 1, "after": after or []}, 0.0)
            store.update_job(db, job_id, state=state, end=end)
        return job_id

    def workflow(state: str, after: list[dict[str, object]] | None = None) -> int:
        with store.transaction() as db:
            workflow_id = store.add_workflow(db, "wf", {"after": after or []}, 0.0)
            store.update_workflow(db, workflow_id, state)
        return workflow_id

    old = [job("done", 100.0) for _ in range(5)]
    old_workflows = [workflow("done"), workflow("done")]
    job("pending", None, [{"kind": "afterok", "job": old[0]}, {"kind": "afterany", "workflow": old_workflows[0]}])
    job("running", None, [{"kind": "singleton", "job": None, "workflow": None}])
    workflow("running", [{"kind": "afterok", "job": old[1]}])
    job("done", 900.0, [{"kind": "afterok", "job": old[2]}, {"kind": "afterok", "workflow": old_workflows[1]}])
    workflow("done", [{"kind": "afterok", "job": old[3]}])
    try:
        store.purge_ended(1000.0)
        kept = {j["id"] for j in store.jobs()}
        assert [j in kept for j in old] == [True, True, False, False, False]
        assert store.workflow(old_workflows[0]) is not None and store.workflow(old_workflows[1]) is None
    finally:
        store.close()


def test_purge_decisions_deletes_old_lendings_but_never_one_a_restart_needs(tmp_path: Path) -> None:
    """`daemon.keep_decisions_days`: decisions made before the cut go, except the last `recent`, those
    about a job still live (a loss to resolve), and an executed lending still waiting for its score."""
    from cosched.daemon.store import Store

    store = Store(tmp_path / "state.sqlite")

    def decision(seq: int, time_: float, guest: int, host: int, **body: object) -> None:
        with store.transaction() as db:
            doc = {"time": time_, "guest": guest, "host": host, "loss": 0.1, "executed": True, "fraction": 0.2}
            store.save_decision(db, seq, {**doc, **body})

    with store.transaction() as db:
        live = store.add_job(db, {"cores": 1}, 0.0)
        store.update_job(db, live, state="running")
    decision(1, 100.0, 900, 901)  # old, both jobs gone: goes
    decision(2, 100.0, live, 901)  # old, but its guest still runs: stays
    decision(3, 100.0, 902, 903, loss=None, host_runtime=50.0)  # old, waiting for its score: stays
    decision(4, 100.0, 904, 905, loss=None, executed=False)  # old, nothing lent: goes
    decision(5, 5000.0, 906, 907)  # recent: stays
    decision(6, 100.0, 908, 909)  # old, but among the last `recent`: stays
    try:
        assert store.purge_decisions(1000.0, recent=1, batch=1) == 2
        assert [d["time"] for d in store.decisions()] == [100.0, 100.0, 5000.0, 100.0]
        assert {d["guest"] for d in store.decisions()} == {live, 902, 906, 908}
        assert store.purge_decisions(1000.0, recent=1) == 0
    finally:
        store.close()
    with pytest.raises(ConfigError, match=r"daemon\.keep_decisions_days: must be in 0\.\.36500"):
        validate(from_dict({"daemon": {"keep_decisions_days": 40000}}))


def test_keep_ended_days_is_checked_and_sets_an_hourly_purge(tmp_path: Path) -> None:
    from cosched.daemon.run import periodic

    with pytest.raises(ConfigError, match=r"daemon\.keep_ended_days: must be in 0\.\.36500"):
        validate(from_dict({"daemon": {"keep_ended_days": -1}}))
    for key, days, planned in (
        ("keep_ended_days", 0, False),
        ("keep_ended_days", 30, True),
        ("keep_decisions_days", 9, True),
    ):
        config = validate(from_dict({"daemon": {"state_dir": str(tmp_path / f"{key}{days}"), key: days}}))
        jobs = dict.fromkeys(("schedule", "sample", "review", "reconcile", "purge"), print)
        daemon = SimpleNamespace(config=config, **jobs)
        assert (periodic(daemon).get_job("purge") is not None) is planned  # type: ignore[arg-type]


def test_a_pass_runs_at_the_time_the_core_asked_for_between_the_regular_ones(tmp_path: Path) -> None:
    """Passes every 30 s; after the first, the core asks for one in 0.4 s (a begin, a latest start,
    a window's end): it runs then, and only once, as replay steps at `Decision.wake_at`, even when
    that pass stops before the core's step (a time read again was a pass at once, for ever)."""
    from cosched.daemon.run import periodic

    config = validate(from_dict({"daemon": {"state_dir": str(tmp_path)}, "intervals": {"schedule": 30}}))
    passes: list[float] = []

    def schedule() -> None:  # the second stops before the core's step (the engine down): it asks for nothing
        passes.append(time.time())
        if len(passes) == 1:
            daemon.wake_at = passes[0] + 0.4

    daemon = SimpleNamespace(config=config, clock=time.time, wake_at=math.inf, schedule=schedule)
    daemon.__dict__.update(dict.fromkeys(("sample", "review", "reconcile", "purge"), lambda: None))
    scheduler = periodic(daemon)  # type: ignore[arg-type]
    scheduler.start()
    try:
        wait_until(lambda: len(passes) >= 2, 5, "a second pass")
        time.sleep(0.5)
    finally:
        scheduler.shutdown()
    assert len(passes) == 2 and 0.35 <= passes[1] - passes[0] < 1.5


@pytest.mark.parametrize(("status", "kind"), [(400, "LaunchRefused"), (404, "LaunchRefused"), (500, "RunLost")])
def test_an_engine_error_at_a_launch_is_the_jobs_or_a_lost_run(status: int, kind: str) -> None:
    """The engine answered, so it is up: its 4xx is the job's own (it fails), its 5xx may be the
    engine's trouble (the run is lost and the job queued again), never "engine unavailable"."""
    response = requests.Response()
    response.status_code = status
    error = docker.errors.APIError("refused", response=response, explanation="no such binary")
    outcome = _refused(7, error)
    assert type(outcome).__name__ == kind
    assert str(outcome).startswith("the Docker engine refused job 7: ")


@pytest.mark.parametrize(("durable_power", "synchronous"), [(False, 1), (True, 2)])
def test_durable_power_makes_every_commit_reach_the_disk(tmp_path: Path, durable_power: bool, synchronous: int) -> None:
    """`daemon.durable_power`: the state file's `synchronous` is FULL (2), else NORMAL (1), whose last
    commits a power loss may take. The store had the option; the config could not set it."""
    from fake_engine import Clock, FakeEngine

    from cosched.daemon.service import Daemon

    config = from_dict(
        {"daemon": {"state_dir": str(tmp_path), "durable_power": durable_power}, "cluster": {"cores": 2}}
    )
    daemon = Daemon(config, backend=FakeEngine(Clock()))  # type: ignore[arg-type]
    try:
        assert daemon.store._conn().execute("PRAGMA synchronous").fetchone()[0] == synchronous
    finally:
        daemon.store.close()


class _EngineRemovingSlowly:
    """A container name taken by what an earlier run of the job left, whose removal the engine
    has under way: a create is a 409 (name taken), and so is a removal (removal in progress).
    Only a removal an earlier call timed out on produces that, which no test can time."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.containers = self
        self.labels = labels
        self.id = "0123456789abcdef"

    @staticmethod
    def _conflict(what: str) -> None:
        import docker

        response = requests.Response()
        response.status_code = 409
        raise docker.errors.APIError(what, response, explanation=f"{what}: removal of container is already in progress")

    def create(self, *args: object, **options: object) -> None:
        self._conflict("create")

    def get(self, name: str) -> _EngineRemovingSlowly:
        return self

    def remove(self, **options: object) -> None:
        self._conflict("remove")


@pytest.mark.parametrize("same_job", [True, False])
def test_a_leftover_whose_removal_is_under_way_loses_the_run_and_anothers_is_refused(same_job: bool) -> None:
    """The run's container name is taken by an earlier run's, which the engine is still removing.
    Raised as the engine unreachable, every later pass found it back, relaunched the job and lost
    it again: no end collected, no job started (a review). The run is lost instead (the job goes
    back to the queue, `ends.MAX_LOST_RUNS` caps it). A container of another instance or job under
    that name is neither taken nor removed: the launch is refused."""
    from cosched.daemon.docker_backend import (
        LABEL_INSTANCE,
        LABEL_JOB,
        LABEL_RUN,
        DockerBackend,
        LaunchRefused,
        RunLost,
    )

    backend = DockerBackend("x", DockerSection())
    left = {LABEL_INSTANCE: "x", LABEL_JOB: "7" if same_job else "8", LABEL_RUN: "1"}
    backend._client = _EngineRemovingSlowly(left)  # type: ignore[assignment]
    options = {"name": "cosched-x-7", "labels": {LABEL_INSTANCE: "x", LABEL_JOB: "7", LABEL_RUN: "2"}}
    with pytest.raises(
        RunLost if same_job else LaunchRefused, match="still being removed" if same_job else "another's"
    ):
        backend._create(7, {"image": "i", "command": ["true"]}, options)


def test_a_stored_image_name_that_is_no_reference_is_refused_before_the_engine_is_asked() -> None:
    """A spec accepted before image names were held to Docker's grammar, or sent to a Mesos executor:
    the launch refuses it without a call to the engine, whose URL path the name would climb out of."""
    from cosched.daemon.docker_backend import DockerBackend, LaunchRefused

    backend = DockerBackend("x", DockerSection(base_url="unix:///nonexistent/docker.sock"))
    spec = {"image": "a/../../distribution/127.0.0.1:8765/x", "command": ["true"], "cores": 1}
    with pytest.raises(LaunchRefused, match="is not a Docker image reference"):
        backend.launch(7, spec, [0], 1.0, 64)


def _on_nodes(state_dir: Path, clock: Any, engine: Any, nodes: int, cores: int, instance: str = "") -> Any:
    """A started daemon of `nodes` nodes and `cores` cores on the tests' engine and clock."""
    from cosched.daemon.service import Daemon

    document = {
        "daemon": {"state_dir": str(state_dir), "instance": instance},
        "cluster": {"nodes": nodes, "cores": cores, "memory_mib": 8192},
        "policies": {"cosched": "none"},
    }
    daemon = Daemon(from_dict(document), backend=engine, clock=clock)
    daemon.start()
    return daemon


def test_a_drained_node_taken_out_of_the_cluster_is_forgotten_not_a_failed_pass_for_ever(tmp_path: Path) -> None:
    """Drain a node, restart with `cluster.nodes` one fewer: every pass then failed on the drain of
    a node the core has not (an IndexError, retried for ever, with /v1/health saying ok), and
    resuming it was refused as no such node (an operator's walkthrough)."""
    from fake_engine import Clock, FakeEngine

    from cosched.daemon import drain
    from cosched.daemon.identity import ANONYMOUS

    clock = Clock()
    engine = FakeEngine(clock)
    daemon = _on_nodes(tmp_path, clock, engine, nodes=2, cores=4)
    drain.drain(daemon, 1, "to remove", ANONYMOUS)
    daemon.close()
    daemon = _on_nodes(tmp_path, clock, engine, nodes=1, cores=2)
    assert daemon.drained == {}
    job = daemon.submit_job(JobSpec(image="x", command=["true"], cores=2, memory_mib=64, walltime=100))
    daemon.schedule()
    assert daemon.failed_passes == 0 and daemon.store.job(job)["state"] == "running"
    daemon.close()
    daemon = _on_nodes(tmp_path, clock, engine, nodes=2, cores=4)  # forgotten in the file too (a Mesos walkthrough)
    assert daemon.drained == {}
    daemon.close()


def test_a_restart_without_the_node_a_job_runs_on_is_refused_in_one_line(tmp_path: Path) -> None:
    """A job runs on node 1 and the daemon restarts with one node (and as many cores): recovery
    stopped on an IndexError's traceback (an operator's walkthrough)."""
    from fake_engine import Clock, FakeEngine

    clock = Clock()
    engine = FakeEngine(clock)
    daemon = _on_nodes(tmp_path, clock, engine, nodes=2, cores=4)
    spec = {"image": "x", "command": ["true"], "memory_mib": 64, "walltime": 100, "span": False}
    jobs = [daemon.submit_job(JobSpec(**spec, cores=2)) for _ in range(2)]
    daemon.schedule()
    [on_node_1] = [job for job in jobs if daemon.store.job(job)["slots"] == [[1, 2]]]
    daemon.close()
    with pytest.raises(ConfigError, match=rf"^job {on_node_1} runs on node 1, and this cluster has nodes 0 to 0 only"):
        _on_nodes(tmp_path, clock, engine, nodes=1, cores=4)


def test_a_state_file_put_back_from_before_a_job_started_is_refused_and_its_run_left_alone(tmp_path: Path) -> None:
    """A copy of the state file taken while job 1 waited, put back while it ran (a restore from a
    backup): the restart removed its running container as an earlier run's and ran the job again
    (seen on the real engine). The copy never began that run, so it is refused before any container
    is touched, as a file with no record of a job is."""
    import shutil
    import sqlite3

    from fake_engine import Clock, FakeEngine

    clock = Clock()
    engine = FakeEngine(clock)
    daemon = _on_nodes(tmp_path, clock, engine, nodes=1, cores=2)
    job = daemon.submit_job(JobSpec(image="x", command=["true"], cores=1, memory_mib=64, walltime=100))
    copy = tmp_path / "copy.sqlite"
    with sqlite3.connect(copy) as backup:  # what `sqlite3 state.sqlite ".backup copy.sqlite"` writes
        sqlite3.connect(daemon.store.path).backup(backup)
    daemon.schedule()
    assert daemon.store.job(job)["state"] == "running" and engine.runs[job] == 1
    daemon.close()
    for path in tmp_path.glob("state.sqlite*"):
        path.unlink()
    shutil.copy(copy, tmp_path / "state.sqlite")
    with pytest.raises(ConfigError, match=rf"is older than the containers of job {job} run 1 under instance"):
        _on_nodes(tmp_path, clock, engine, nodes=1, cores=2)
    assert engine.running == {job: f"c{job}"} and job not in engine.exits  # its run goes on


def test_a_new_instance_name_is_refused_while_the_old_ones_jobs_run(tmp_path: Path) -> None:
    """`daemon.instance` changed across a restart: the running job's container, labelled with the
    old name, was not found; the job was failed as lost while its container ran on, unmanaged, on
    cores given away (an operator's walkthrough). Refused until its jobs end; an empty name takes
    the file's."""
    from fake_engine import Clock, FakeEngine

    clock = Clock()
    engine = FakeEngine(clock)
    daemon = _on_nodes(tmp_path, clock, engine, nodes=1, cores=2, instance="walk")
    job = daemon.submit_job(JobSpec(image="x", command=["true"], cores=1, memory_mib=64, walltime=100))
    daemon.schedule()
    daemon.close()
    with pytest.raises(
        ConfigError, match=r"daemon.instance = 'walk2', and state file .* holds 1 running job\(s\) of instance 'walk'"
    ):
        _on_nodes(tmp_path, clock, engine, nodes=1, cores=2, instance="walk2")
    daemon = _on_nodes(tmp_path, clock, engine, nodes=1, cores=2)
    assert daemon.instance == "walk" and daemon.store.job(job)["state"] == "running"
    engine.finish(job)
    daemon.schedule()
    daemon.close()
    daemon = _on_nodes(tmp_path, clock, engine, nodes=1, cores=2, instance="walk2")  # nothing runs: renamed
    assert daemon.instance == "walk2" and daemon.store.get_meta("instance") == "walk2"
    daemon.close()


def test_a_drain_follows_its_machine_to_the_node_it_holds(tmp_path: Path) -> None:
    """On Mesos a node is whichever agent holds it. A drain held the node's number: a spare that took
    the node of a drained agent was drained in its place (a walkthrough on a real master). It now
    names its machine and goes with it; one whose machine holds no node is forgotten."""
    from fake_engine import Clock, FakeEngine

    from cosched.daemon import drain
    from cosched.daemon.backend import NodeStatus
    from cosched.daemon.identity import ANONYMOUS

    clock = Clock()
    engine = FakeEngine(clock)
    hosts = ["agent1", "agent2"]
    engine.node_status = lambda: [NodeStatus(h, f"id-{h}", True) for h in hosts]  # type: ignore[method-assign]
    daemon = _on_nodes(tmp_path, clock, engine, nodes=2, cores=2)
    assert drain.drain(daemon, 1, "DIMM swap", ANONYMOUS).host == "agent2"
    hosts[:] = ["agent2", "agent1"]  # nodes mapped anew
    drain.follow(daemon)
    assert {node: entry.host for node, entry in daemon.drained.items()} == {0: "agent2"}
    hosts[:] = ["agent3", "agent1"]  # a spare took node 0: agent2 holds none
    drain.follow(daemon)
    assert daemon.drained == {} and drain.load(daemon.store, 2) == {}
    daemon.close()


def test_the_daemon_says_which_host_tables_jobs_could_fill(tmp_path: Path) -> None:
    """The kernel's tables of files, ptys, pids, threads and (per uid) inotify instances, epoll
    watches and pipe buffers are the host's, and no cgroup bounds what one job takes of them: at
    Debian's defaults one job left no file, pty or inotify instance for any other (helpers'
    audits). Each is said at start, with what closes it; nothing where each is closed."""
    from cosched.daemon.host_limits import (
        EPOLL_WATCHES_LARGEST,
        FILE_MAX_UNBOUNDED,
        INOTIFY_INSTANCES_LARGEST,
        PID_MAX_LARGEST,
        PTY_MAX_LARGEST,
        exposures,
    )

    (tmp_path / "fs").mkdir()
    (tmp_path / "kernel" / "pty").mkdir(parents=True)
    (tmp_path / "fs" / "file-max").write_text("2466170\n")
    (tmp_path / "kernel" / "pty" / "max").write_text("4096\n")
    (tmp_path / "kernel" / "pty" / "reserve").write_text("1024\n")
    (tmp_path / "kernel" / "pid_max").write_text("32768\n")
    (tmp_path / "kernel" / "threads-max").write_text("60000\n")
    (tmp_path / "fs" / "inotify").mkdir()
    (tmp_path / "fs" / "inotify" / "max_user_instances").write_text("128\n")
    (tmp_path / "fs" / "epoll").mkdir()
    (tmp_path / "fs" / "epoll" / "max_user_watches").write_text("5491511\n")
    (tmp_path / "fs" / "pipe-user-pages-soft").write_text("16384\n")
    files, ptys, inotify, epoll, pipes, pids, threads = exposures(4096, 4096, 8, tmp_path)
    assert "one job may open 16,777,216 files" in files and "2,466,170 (fs.file-max)" in files
    assert f"fs.file-max={FILE_MAX_UNBOUNDED}" in files
    assert "the same 3,072 (kernel.pty.max less kernel.pty.reserve)" in ptys
    assert f"kernel.pty.max={PTY_MAX_LARGEST}" in ptys
    assert "32,768 pids (kernel.pid_max) are 8 jobs' worth" in pids and "may run 16 jobs at once" in pids
    assert f"kernel.pid_max={PID_MAX_LARGEST}" in pids
    assert "the same 128 (fs.inotify.max_user_instances)" in inotify
    assert f"fs.inotify.max_user_instances={INOTIFY_INSTANCES_LARGEST}" in inotify
    assert "its epoll watches from the same 5,491,511 (fs.epoll.max_user_watches)" in epoll
    assert f"fs.epoll.max_user_watches={EPOLL_WATCHES_LARGEST}" in epoll
    assert "16,384 (fs.pipe-user-pages-soft): one job can leave pipes of 2 pages" in pipes
    assert "fs.pipe-user-pages-soft=0 " in pipes
    assert "60,000 threads (kernel.threads-max) are 14 jobs' worth" in threads
    assert f"kernel.threads-max={PID_MAX_LARGEST}" in threads
    only_shared = exposures(64, 64, 8, tmp_path)  # 4,096 files, and 8,192 pids at once: far from either
    assert only_shared == [ptys, inotify, epoll, pipes]
    assert exposures(64, 64, 8, tmp_path, ptys=False) == [inotify, epoll, pipes]  # jobs open no pty
    (tmp_path / "fs" / "pipe-user-pages-soft").write_text("0\n")
    (tmp_path / "fs" / "inotify" / "max_user_instances").write_text(f"{INOTIFY_INSTANCES_LARGEST}\n")
    (tmp_path / "fs" / "epoll" / "max_user_watches").write_text(f"{EPOLL_WATCHES_LARGEST}\n")
    (tmp_path / "fs" / "file-max").write_text(f"{FILE_MAX_UNBOUNDED}\n")
    (tmp_path / "kernel" / "pty" / "max").write_text(f"{PTY_MAX_LARGEST}\n")
    (tmp_path / "kernel" / "pid_max").write_text(f"{PID_MAX_LARGEST}\n")
    assert exposures(4096, 4096, 8, tmp_path) == [threads]
    (tmp_path / "kernel" / "threads-max").write_text(f"{PID_MAX_LARGEST}\n")
    assert exposures(4096, 4096, 8, tmp_path) == []
    assert exposures(4096, 4096, 8, tmp_path / "absent") == []  # a host that does not say
    booted = tmp_path / "proc"
    (booted / "sys").mkdir(parents=True)
    (booted / "cmdline").write_text("root=/dev/sda1 cgroup.memory=nokmem quiet\n")
    [nokmem] = exposures(4096, 4096, 8, booted / "sys")
    assert "charges no kernel memory to jobs (booted with cgroup.memory=nokmem)" in nokmem
