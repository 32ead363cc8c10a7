"""The Mesos client's pure parts: RecordIO framing, call bodies, master addresses, backoff."""

from __future__ import annotations

import base64
import itertools
import json
import os
import random
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cosched.daemon.config import DockerSection
from cosched.daemon.sandbox import StagingMounts
from cosched.errors import ConfigError
from cosched.mesos import calls, jobs
from cosched.mesos.backoff import Backoff
from cosched.mesos.executor import staging_for
from cosched.mesos.masters import (
    MASTER_ENTRY,
    DiscoveryFailed,
    Master,
    ZooKeeperGroup,
    _master_info,
    follow_location,
    parse_masters,
    parse_zookeeper,
    zookeeper_masters,
)
from cosched.mesos.recordio import RecordIODecoder, RecordIOError, encode

# -- RecordIO -----------------------------------------------------------------------------------------------


@given(
    records=st.lists(st.binary(max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=20),
)
def test_recordio_decodes_any_chunking_of_any_records(records: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode(r) for r in records)
    points = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    decoder = RecordIODecoder()
    decoded = [r for a, b in itertools.pairwise(points) for r in decoder.feed(stream[a:b])]
    assert decoded == records
    assert not decoder.mid_record


def test_recordio_byte_by_byte_and_many_records_in_one_feed() -> None:
    events = [json.dumps({"type": "HEARTBEAT"}).encode(), b"", b"x" * 1000]
    stream = b"".join(encode(e) for e in events)
    one_by_one = RecordIODecoder()
    assert [r for i in range(len(stream)) for r in one_by_one.feed(stream[i : i + 1])] == events
    assert RecordIODecoder().feed(stream) == events


def test_recordio_holds_an_unfinished_record() -> None:
    decoder = RecordIODecoder()
    assert decoder.feed(b"10\nabc") == []
    assert decoder.mid_record
    assert decoder.feed(b"defghij5\nab") == [b"abcdefghij"]
    assert decoder.mid_record


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"12x\n{}", "decimal digits"),
        (b"\n{}", "decimal digits"),
        (b"-3\nabc", "decimal digits"),
        (b"{}", "decimal digits"),  # JSON without framing is caught before any newline
        (b"1" * 30, "decimal digits"),
        (b"999999999\n", "over the limit"),
    ],
)
def test_recordio_bad_framing_is_one_line_and_final(data: bytes, problem: str) -> None:
    decoder = RecordIODecoder(max_record=1024)
    with pytest.raises(RecordIOError, match=problem) as error:
        decoder.feed(data)
    assert "\n" not in str(error.value)
    with pytest.raises(RecordIOError):
        decoder.feed(b"2\n{}")


# -- call bodies ---------------------------------------------------------------------------------------------


def test_first_subscribe_has_no_framework_id_and_a_resubscribe_repeats_it() -> None:
    first = calls.subscribe(calls.framework_info(name="cosched", user="root", framework_id=None))
    info = first["subscribe"]["framework_info"]
    assert "framework_id" not in first and "id" not in info
    assert info["checkpoint"] is True and info["failover_timeout"] == 7 * 24 * 3600
    again = calls.subscribe(calls.framework_info(name="cosched", user="root", framework_id="F1", roles=["hpc"]))
    assert again["framework_id"] == again["subscribe"]["framework_info"]["id"] == {"value": "F1"}
    assert again["subscribe"]["framework_info"]["roles"] == ["hpc"]
    assert {"type": "MULTI_ROLE"} in again["subscribe"]["framework_info"]["capabilities"]


def test_decline_and_accept_carry_the_refuse_filter_only_when_given() -> None:
    assert calls.decline(["O1", "O2"], 120) == {
        "type": "DECLINE",
        "decline": {"offer_ids": [{"value": "O1"}, {"value": "O2"}], "filters": {"refuse_seconds": 120.0}},
    }
    accept = calls.accept(["O1"], [calls.launch([{"name": "t"}])], None)
    assert accept["accept"] == {
        "offer_ids": [{"value": "O1"}],
        "operations": [{"type": "LAUNCH", "launch": {"task_infos": [{"name": "t"}]}}],
    }


def test_launch_group_reconcile_acknowledge_message_bodies() -> None:
    group = calls.launch_group({"executor_id": {"value": "E"}}, [{"name": "a"}, {"name": "b"}])
    assert group["launch_group"]["task_group"]["tasks"] == [{"name": "a"}, {"name": "b"}]
    assert calls.reconcile() == {"type": "RECONCILE", "reconcile": {"tasks": []}}
    assert calls.reconcile([("t1", "S1"), ("t2", None)])["reconcile"]["tasks"] == [
        {"task_id": {"value": "t1"}, "agent_id": {"value": "S1"}},
        {"task_id": {"value": "t2"}},
    ]
    ack = calls.acknowledge("S1", "t1", "AAEC")
    assert ack["acknowledge"] == {"agent_id": {"value": "S1"}, "task_id": {"value": "t1"}, "uuid": "AAEC"}
    message = calls.message("S1", "E1", b'{"quota": 1.5}')
    assert base64.b64decode(message["message"]["data"]) == b'{"quota": 1.5}'
    assert calls.revive() == {"type": "REVIVE"} and calls.suppress(["r"]) == {
        "type": "SUPPRESS",
        "suppress": {"roles": ["r"]},
    }
    assert calls.kill("t1", "S1")["kill"] == {"task_id": {"value": "t1"}, "agent_id": {"value": "S1"}}


# -- master addresses --------------------------------------------------------------------------------------


def test_master_addresses_parse_and_a_location_is_followed() -> None:
    assert parse_masters("m1:5050, m2,https://m3:443/") == [
        Master("m1", 5050),
        Master("m2", 5050),
        Master("m3", 443, "https"),
    ]
    current = Master("m1", 5050)
    assert follow_location("//10.0.0.2:5051/api/v1/scheduler", current) == Master("10.0.0.2", 5051)
    assert follow_location("https://m9:5050/api/v1/scheduler", current) == Master("m9", 5050, "https")


@pytest.mark.parametrize(
    "bad", ["zk://z1:2181/mesos", "m1,zk://z1:2181/mesos", "m1:notaport", "ftp://m1", "", "m1:99999"]
)
def test_bad_master_addresses_are_one_line_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_masters(bad)
    assert "\n" not in str(error.value)


def test_a_zookeeper_group_parses_and_its_master_entries_are_read() -> None:
    assert parse_zookeeper("m1:5050") is None
    group = parse_zookeeper("zk://z1:2181,10.0.0.3:2182/mesos/")
    assert (
        group == ZooKeeperGroup("z1:2181,10.0.0.3:2182", "/mesos") and str(group) == "zk://z1:2181,10.0.0.3:2182/mesos"
    )
    info = {"address": {"hostname": "m1.example", "ip": "10.0.0.7", "port": 5051}, "pid": "master@10.0.0.7:5051"}
    assert _master_info(json.dumps(info).encode(), group) == Master("10.0.0.7", 5051)
    assert _master_info(b'{"pid": "master@10.0.0.8:5050"}', group) == Master("10.0.0.8", 5050)  # no address
    with pytest.raises(DiscoveryFailed, match="not MasterInfo JSON"):
        _master_info(b"\x08\x01", group)  # the protobuf entries of Mesos < 0.24
    assert [MASTER_ENTRY.match(n) is not None for n in ("json.info_0000000003", "log_replicas", "info_1")] == [
        True,
        False,
        False,
    ]


@pytest.mark.parametrize("bad", ["zk://z1:2181", "zk://z1:2181/", "zk://z1/mesos", "zk://z1:2181,/mesos"])
def test_bad_zookeeper_groups_are_one_line_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_zookeeper(bad)
    assert "\n" not in str(error.value) and bad in str(error.value)


@pytest.mark.parametrize("bad", ["zk://pw-only@z1:2181/mesos", "zk://u:pw@z1/mesos", "zk://:pw@z1:2181/mesos"])
def test_a_bad_group_with_credentials_never_prints_the_password(bad: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_zookeeper(bad)
    assert "pw" not in str(error.value) and "***@" in str(error.value)
    group = parse_zookeeper("zk://u:p@w:d@z1:2181/mesos")  # a password may hold ':' and '@'
    assert group is not None and (group.hosts, group.credentials) == ("z1:2181", "u:p@w:d")


def test_an_unreachable_zookeeper_is_a_retryable_discovery_failure() -> None:
    """Nobody listens: the client retries with backoff (Unavailable), it does not crash or hang."""
    pytest.importorskip("kazoo")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    group = parse_zookeeper(f"zk://127.0.0.1:{port}/mesos")
    assert group is not None
    started = time.monotonic()
    with pytest.raises(DiscoveryFailed, match=f"ZooKeeper zk://127.0.0.1:{port}/mesos"):
        zookeeper_masters(group, timeout=1.0)
    assert time.monotonic() - started < 10


# -- backoff -------------------------------------------------------------------------------------------------


def test_backoff_grows_with_jitter_up_to_the_cap() -> None:
    backoff = Backoff(base=0.5, cap=8.0, rng=random.Random(1))
    for attempt in range(12):
        ceiling = min(8.0, 0.5 * 2**attempt)
        delays = {backoff.delay(attempt) for _ in range(50)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(delays) > 1, "jittered"
    assert backoff.delay(10_000) <= 8.0


# -- the executor's payloads and settings ---------------------------------------------
def test_a_job_rides_in_task_data_and_comes_back_whole() -> None:
    job = jobs.JobPayload(12, {"image": "i", "command": ["true"], "cores": 2}, 1.5, 256, (0, 1), hold=30.0)
    task = jobs.job_task("t12", "S0", jobs.executor_info("t12", "F"), job, 2.0)
    assert jobs.job_of(task) == job and jobs.swept_executors(task) is None
    assert task["executor"]["executor_id"] == {"value": "t12"}
    assert {r["name"]: r["scalar"]["value"] for r in task["resources"]} == {"cpus": 2.0, "mem": 256.0}
    sweep = jobs.sweep_task("s1", "S0", jobs.executor_info("s1", "F"), ["t12", "t13"])
    assert jobs.swept_executors(sweep) == ["t12", "t13"]


def test_the_daemons_job_settings_reach_the_executor_whole(tmp_path: Path) -> None:
    """The operator's [docker] job user and limits ride in the executor's environment, so a job on
    an agent gets them, not the executor's defaults; the agent's engine address does not travel.
    The daemon's sample interval travels too: the executor reports usage as often; so does the
    fence, after which it stops its jobs while its agent answers nothing."""
    profile = tmp_path / "seccomp.json"  # the same path on every agent, as the data roots
    profile.write_text('{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []}')
    daemon = DockerSection(
        seccomp_profile=str(profile),
        base_url="unix:///daemon-host.sock",
        data_roots=("/srv/data",),
        job_user="1234:5678",
        pids_limit=64,
        log_max_mib=1,
        nofile=128,
        cpu_period=50_000,
        log_tail=7,
        ptys=False,
    )
    from cosched.mesos.executor import ExecutorSettings

    info = jobs.executor_info("t1", "F", "cosched-executor", daemon, sample_interval=0.5, fence=7.0)
    variables = {v["name"]: v["value"] for v in info["command"]["environment"]["variables"]}
    assert set(variables) == {jobs.JOB_SETTINGS, jobs.SAMPLE_INTERVAL, jobs.FENCE}
    agent = {"MESOS_AGENT_ENDPOINT": "127.0.0.1:5051", "MESOS_FRAMEWORK_ID": "F", "MESOS_EXECUTOR_ID": "t1"}
    settings = ExecutorSettings.from_env({**agent, **variables})
    assert (settings.sample_interval, settings.fence) == (0.5, 7.0)
    got = jobs.read_job_settings(variables[jobs.JOB_SETTINGS], "unix:///agent.sock")
    assert got == replace(daemon, base_url="unix:///agent.sock")
    assert jobs.read_job_settings("", "") == DockerSection()  # none given: the defaults


def test_an_executor_given_data_roots_pins_them_or_refuses_to_run(tmp_path: Path) -> None:
    """As the local daemon: a data dir is mounted from the directory checked, never bound by its path,
    and only root can mount, so a non-root executor with data roots starts no job at all."""
    assert staging_for((), tmp_path, 1000) is None  # no data dirs can be asked for
    root = tmp_path / "data"
    root.mkdir()
    assert isinstance(staging_for((str(root),), tmp_path, 0), StagingMounts)
    with pytest.raises(ConfigError, match="needs the executor to run as root"):
        staging_for((str(root),), tmp_path, 1000)
    (tmp_path / "link").symlink_to("/")  # a root that leads elsewhere makes anything a data dir
    with pytest.raises(ConfigError, match=r"docker\.data_roots: .* is or goes through a symlink"):
        staging_for((str(tmp_path / "link"),), tmp_path, 0)


def test_an_executor_pins_data_dirs_outside_its_sandbox_and_releases_a_gone_executors(tmp_path: Path) -> None:
    """Staging mounts lived in the Mesos sandbox, which the agent's `/files` serves and its garbage
    collection deletes recursively: through a mount an executor killed mid-launch left there, into
    the job's data (a helper's audit read it so; the executor never released them). Each executor now
    has a folder of its own elsewhere, locked while it runs, and releases those whose lock is free."""
    import fcntl
    import subprocess

    from cosched.mesos.executor import LOCK

    place = tmp_path / "executor-mounts"
    root = tmp_path / "data"
    (root / "job7").mkdir(parents=True)
    (root / "job7" / "results").write_text("keep me")
    staging = staging_for((str(root),), place, 0)
    assert staging is not None and staging.root.parent == place and (staging.root / LOCK).is_file()
    with open(staging.root / LOCK) as lock, pytest.raises(BlockingIOError):
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held while this executor runs
    if os.geteuid() != 0:
        pytest.skip("the rest mounts, which needs root")
    gone = place / "gone"  # an executor killed mid-launch: its pin stayed, its lock is free
    target = gone / "7" / "0"
    target.mkdir(parents=True)
    (gone / LOCK).touch()
    subprocess.run(["mount", "--bind", str(root / "job7"), str(target)], check=True)
    staging_for((str(root),), place, 0)  # the next executor's start
    assert not gone.exists() and staging.root.is_dir()  # the live one's stays
    assert (root / "job7" / "results").read_text() == "keep me"
    assert str(target) not in Path("/proc/self/mounts").read_text()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("{", "not JSON"),
        ('{"privileged": true}', "keys among"),
        ('{"pids_limit": "64"}', "docker.pids_limit has the wrong type"),
        ('{"data_roots": "/srv"}', "docker.data_roots has the wrong type"),
        ('{"ptys": 0}', "docker.ptys has the wrong type"),
        ('{"job_user": "0:0"}', "docker.job_user: expected 'uid:gid', each in 1..4294967294"),
        ('{"pids_limit": 3}', "docker.pids_limit: must be >= 16"),
        ('{"data_roots": ["srv"]}', "'srv' is not an absolute path"),
    ],
)
def test_bad_job_settings_stop_the_executor_with_one_line(value: str, problem: str) -> None:
    """A job is never started under settings the daemon would have refused (root, no pids limit)."""
    with pytest.raises(ConfigError, match=problem) as caught:
        jobs.read_job_settings(value)
    assert str(caught.value).startswith(jobs.JOB_SETTINGS) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (None, "task data: missing"),
        ("%%%", "not base64 JSON"),
        (base64.b64encode(b"[1]").decode(), "expected a JSON object"),
        (base64.b64encode(b'{"type": "other"}').decode(), "expected type 'job'"),
        (base64.b64encode(b'{"type": "job", "job": 1}').decode(), "missing or invalid field"),
        (
            base64.b64encode(
                b'{"type": "job", "job": 1, "spec": {"image": "i"}, "quota": 1, "memory_mib": 8}'
            ).decode(),
            "needs an image and a command",
        ),
        (
            base64.b64encode(
                b'{"type": "job", "job": 1, "spec": {"image": "i", "command": ["x"]}, "quota": 0, "memory_mib": 8}'
            ).decode(),
            "must be > 0",
        ),
        (
            base64.b64encode(
                b'{"type": "job", "job": 1, "spec": {"image": "i", "command": ["x"]}, "quota": 1, "memory_mib": 8,'
                b' "hold": -1}'
            ).decode(),
            "hold -1.0 must be seconds >= 0",
        ),
    ],
)
def test_bad_task_data_is_named(data: object, problem: str) -> None:
    with pytest.raises(jobs.BadPayload, match=problem):
        jobs.job_of({"data": data})


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"not json", "not JSON"),
        (b"[]", "a JSON object with a 'type'"),
        (b'{"type": "quota", "task": "t"}', "'cpus' > 0"),
        (b'{"type": "quota", "task": "t", "cpus": -1}', "'cpus' > 0"),
        (b'{"type": "quota", "task": 3, "cpus": 1}', "needs 'task'"),
        # a usage NaN read as idle by ASAx (`max(0, nan)` is 0), a string stopped the review
        (b'{"type": "usage", "tasks": {"t": {"cpu": NaN, "mem": 0.1, "done": 0, "total": 0}}}', "finite 'cpu'"),
        (b'{"type": "usage", "tasks": {"t": {"cpu": "0.5", "mem": 0.1, "done": 0, "total": 0}}}', "finite 'cpu'"),
        (b'{"type": "usage", "tasks": {"t": {"cpu": 0.5, "mem": 0.1, "done": 5, "total": 3}}}', "'done' <= 'total'"),
        (
            b'{"type": "usage", "tasks": {"t": {"cpu": 0.5, "mem": 0.1, "done": 0, "total": 0, "quota": 0}}}',
            "'quota' > 0",
        ),
        (b'{"type": "usage", "tasks": []}', "needs 'tasks'"),
        (b'{"type": "quota", "task": "t", "cpus": Infinity}', "'cpus' > 0"),
        (b'{"type": "quota_applied", "task": "t", "cpus": NaN}', "'cpus' \\(finite, or null\\)"),
        (b'{"type": "go"}', "go message: needs 'task'"),
        (b'{"type": "quota", "task": "t", "cpus": 1, "ask": -1}', "'ask' must be a whole number"),
        (b'{"type": "quota_applied", "task": "t", "cpus": 1, "ask": "2"}', "'ask' must be a whole number"),
    ],
)
def test_bad_messages_are_named(data: bytes, problem: str) -> None:
    with pytest.raises(jobs.BadPayload, match=problem):
        jobs.parse_message(data)
    assert jobs.parse_message(jobs.quota_message("t", 0.5, 3)) == {"type": "quota", "task": "t", "cpus": 0.5, "ask": 3}
    sample = {"cpu": 0.5, "mem": 0.1, "done": 1, "total": 3, "quota": 2.0}
    assert jobs.parse_message(jobs.usage_message(1.0, {"t": sample}))["tasks"] == {"t": sample}
    assert jobs.parse_message(jobs.usage_message(1.0, {}))["tasks"] == {}  # the fence's probe
    assert jobs.parse_message(jobs.quota_applied("t", None, "no such task"))["cpus"] is None


def test_mesos_durations_and_the_executor_environment() -> None:
    from cosched.mesos.executor import ExecutorSettings, mesos_duration

    assert mesos_duration("15mins") == 900.0
    assert mesos_duration("2secs") == 2.0
    assert mesos_duration("100ms") == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="not a Mesos duration"):
        mesos_duration("soon")
    with pytest.raises(ConfigError, match="MESOS_AGENT_ENDPOINT, MESOS_EXECUTOR_ID not set"):
        ExecutorSettings.from_env({"MESOS_FRAMEWORK_ID": "F"})
    settings = ExecutorSettings.from_env(
        {
            "MESOS_AGENT_ENDPOINT": "127.0.0.1:5051",
            "MESOS_FRAMEWORK_ID": "F",
            "MESOS_EXECUTOR_ID": "cosched-S0",
            "MESOS_CHECKPOINT": "1",
            "MESOS_RECOVERY_TIMEOUT": "1mins",
        }
    )
    assert (settings.agent.port, settings.checkpoint, settings.recovery_timeout) == (5051, True, 60.0)
    agent = {"MESOS_AGENT_ENDPOINT": "127.0.0.1:5051", "MESOS_FRAMEWORK_ID": "F", "MESOS_EXECUTOR_ID": "E"}
    for fence in ("inf", "nan", "0", "-1", "soon", "86401"):  # inf turned the fence off; the others fired it at once
        with pytest.raises(ConfigError, match=f"COSCHED_FENCE must be seconds in \\(0, 86400\\], got '{fence}'"):
            ExecutorSettings.from_env({**agent, "COSCHED_FENCE": fence})
    assert ExecutorSettings.from_env({**agent, "COSCHED_FENCE": "30"}).fence == 30.0


def test_an_executor_sends_the_token_an_authenticating_agent_gave_it() -> None:
    """An agent run with `--authenticate_http_executors` hands each executor a token in
    MESOS_EXECUTOR_AUTHENTICATION_TOKEN and refuses (401) every executor call without it.
    This Mesos build has no such agent (the flag needs Mesos built with SSL), so a stand-in
    agent that checks the header as the agent does answers here."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from cosched.mesos.executor import Executor, ExecutorSettings

    seen: list[str | None] = []

    class Agent(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.headers.get("Authorization"))
            self.send_response(202 if self.headers.get("Authorization") == "Bearer agent-token" else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Agent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        "MESOS_AGENT_ENDPOINT": f"127.0.0.1:{server.server_port}",
        "MESOS_FRAMEWORK_ID": "F",
        "MESOS_EXECUTOR_ID": "cosched-S0",
    }
    try:
        for extra, accepted in (({}, False), ({"MESOS_EXECUTOR_AUTHENTICATION_TOKEN": "agent-token"}, True)):
            executor = Executor(ExecutorSettings.from_env({**env, **extra}), backend=None)  # type: ignore[arg-type]
            assert executor._post(executor._call("MESSAGE", {"data": ""})) is accepted
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [None, "Bearer agent-token"]


@pytest.mark.parametrize(
    ("failure", "state", "answers_after"),
    [
        ("refused", "TASK_FAILED", True),
        ("engine 5xx", "TASK_LOST", True),
        ("engine cut short", "TASK_LOST", True),
        ("engine gone", "TASK_LOST", False),
    ],
)
def test_a_launch_the_agents_engine_fails_is_a_lost_run_and_one_it_refuses_fails_the_job(
    failure: str, state: str, answers_after: bool
) -> None:
    """An engine that refused a job's spec (4xx) fails the job; one gone, or failing on its own (5xx),
    is the machine's fault: reported TASK_FAILED, every job placed on that agent failed at once
    (a helper's run through a proxy answering 500), where the run is lost and queued again. A call
    cut short may have made, even started, the container: it is removed by name once the engine
    answers, before the report; an engine that never answers is the machine's fault (node drained)."""
    from cosched.daemon.docker_backend import EngineUnavailable, LaunchRefused, RunLost
    from cosched.mesos.executor import Executor, ExecutorSettings, container_name

    error = {"refused": LaunchRefused, "engine 5xx": RunLost}.get(failure, EngineUnavailable)
    removed: list[str] = []

    class Engine:
        instance = "mesos-F"

        def launch(self, *args: object, **kwargs: object) -> None:
            raise error(f"the Docker engine: {failure}")

        def remove(self, name: str) -> None:
            if not answers_after or len(removed) < 1:  # the engine answers again after a moment, or never
                removed.append("")
                raise EngineUnavailable("no answer")
            removed.append(name)

    env = {"MESOS_AGENT_ENDPOINT": "127.0.0.1:1", "MESOS_FRAMEWORK_ID": "F", "MESOS_EXECUTOR_ID": "t1"}
    executor = Executor(replace(ExecutorSettings.from_env(env), fence=1.0), backend=Engine())  # type: ignore[arg-type]
    sent: list[tuple[str, str, object]] = []
    executor.update = lambda task_id, state, message="", data=None: sent.append((state, message, data))  # type: ignore[method-assign]
    payload = jobs.JobPayload(7, {"image": "x", "command": ["true"], "cores": 1}, 1.0, 64)
    executor._launch(jobs.job_task("t1", "S0", jobs.executor_info("t1", "F"), payload, 1.0))
    fault = {jobs.ENGINE_FAULT: True} if failure == "engine gone" else None  # its node is drained
    assert sent == [(state, f"could not start: the Docker engine: {failure}", fault)]
    if failure == "engine cut short":
        assert removed[-1] == container_name("mesos-F", "t1")
    if failure == "engine gone":
        assert len(removed) >= 2 and not any(removed)  # asked again until the wait ended


def test_a_request_for_output_and_its_answer_are_checked_and_capped() -> None:
    """`cosched logs` on Mesos: the framework asks an executor for lines, the executor answers with
    text, at most `LOG_BYTES` of it (it travels through the master); anything else is refused."""
    assert jobs.parse_message(jobs.log_message("t1", 20)) == {"type": "log", "task": "t1", "lines": 20}
    answer = jobs.parse_message(jobs.log_answer("t1", "x" * (jobs.LOG_BYTES + 10)))
    assert answer["text"] == "[...]" + "x" * jobs.LOG_BYTES
    for bad in (b'{"type": "log", "task": "t1", "lines": 0}', b'{"type": "log", "lines": 5}'):
        with pytest.raises(jobs.BadPayload, match="log message: needs 'task'"):
            jobs.parse_message(bad)


def test_an_executor_that_never_answers_fails_its_jobs_quota_change_not_the_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A frozen agent's executor never answers a quota change: taken for the engine lost, the pass
    stopped there and the daemon said `Docker engine unreachable` for every job (a helper's run).
    Now that job's change fails alone (the review asks again), and its live output reads as unavailable."""
    from cosched.daemon.docker_backend import QuotaMismatch
    from cosched.mesos import backend as mesos_backend
    from cosched.mesos.runs import Run, Task, new_handle, part_id

    monkeypatch.setattr(mesos_backend, "LOG_TIMEOUT", 0.3)
    backend = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1", quota_timeout=0.3), 1)
    sent: list[str] = []
    monkeypatch.setattr(backend.client, "message", lambda agent, task, data: sent.append(task))
    handle = new_handle(7, 1)
    task = Task(part_id(handle, 0, 1, 1), 7, "A1", 1, state="TASK_RUNNING")
    backend.runs[handle] = Run(handle, 7, 1, {0: task})
    with pytest.raises(QuotaMismatch, match=f"no answer to a quota change of task {task.id} in 0 s"):
        backend.set_quota(handle, 0.5)
    assert backend.live_log(handle, 5) is None
    assert sent == [task.id, task.id]


def test_the_answer_to_an_older_quota_change_is_not_taken_for_the_newer_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each quota message is sent again until answered, and the executor applies messages on a pool:
    the answer to an older change, late, was taken for a newer one's. Changes are numbered, growing
    across restarts (the clock's nanoseconds), and only the latest one's answer is waited for; an
    executor that numbers none is answered as before."""
    from cosched.daemon.docker_backend import QuotaMismatch
    from cosched.mesos import backend as mesos_backend
    from cosched.mesos.runs import Run, Task, new_handle, part_id

    backend = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1", quota_timeout=0.3), 1)
    handle = new_handle(7, 1)
    task = Task(part_id(handle, 0, 1, 1), 7, "A1", 1, state="TASK_RUNNING")
    backend.runs[handle] = Run(handle, 7, 1, {0: task})
    asks: list[int] = []

    def answer(agent: str, task_id: str, data: bytes) -> None:
        ask = jobs.parse_message(data)["ask"]
        asks.append(ask)
        if len(asks) == 1:  # the first change's answer comes late, after the second was asked
            return
        backend.on_message("A1", task_id, jobs.quota_applied(task_id, 0.5, "", asks[0]))  # the late one
        later = threading.Timer(0.05, backend.on_message, ("A1", task_id, jobs.quota_applied(task_id, 0.25, "", ask)))
        later.start()

    monkeypatch.setattr(backend.client, "message", answer)
    before = time.time_ns()
    with pytest.raises(QuotaMismatch, match="no answer to a quota change"):
        backend.set_quota(handle, 0.5)
    backend.set_quota(handle, 0.25)  # raises QuotaMismatch if the late 0.5 is taken for its answer
    assert task.quota == 0.25 and asks[0] >= before and asks[-1] > asks[0]
    backend.on_message("A1", task.id, jobs.quota_applied(task.id, 0.75))  # an executor that numbers none
    assert backend._quota_answers[task.id] == (0.75, "")
    backend.remove(handle)
    assert task.id not in backend._quota_asks  # forgotten with its run


@pytest.mark.parametrize("waits_for", ["offers", "its parts"])
def test_a_launch_withdrawn_fails_at_once_and_takes_no_node_down(waits_for: str) -> None:
    """A job cancelled while its launch waits for offers, or for a gang's parts to start: the launch
    fails at once as its run lost (`_retire` then kills its tasks, held parts removed unstarted),
    not `launch_timeout` later, and no agent is taken for one that made no offer."""
    from cosched.mesos import backend as mesos_backend
    from cosched.mesos.offer_book import Demand, Need
    from cosched.mesos.runs import Run, Task, new_handle, part_id

    backend = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1", launch_timeout=30.0), 2)
    backend.agents, backend.hostnames = ["A1", "A2"], {"A1": "agent1", "A2": "agent2"}
    handle = new_handle(7, 1)
    tasks = {p: Task(part_id(handle, p, 2, 1), 7, agent, 1) for p, agent in enumerate(("A1", "A2"))}
    demand = Demand(handle, (Need("A1", 1.0, 64.0), Need("A2", 1.0, 64.0))) if waits_for == "offers" else None
    launch = mesos_backend._Launch(Run(handle, 7, 2, tasks), {}, demand, time.monotonic())
    backend.launches[handle] = launch
    raised: list[BaseException] = []

    def wait() -> None:
        with backend.cond:
            try:
                backend._wait_launched(launch)
            except BaseException as exc:  # what it raised is the test's
                raised.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)
    started = time.monotonic()
    backend.withdraw(7)
    waiter.join(5)
    assert not waiter.is_alive() and time.monotonic() - started < 2
    assert [type(exc).__name__ for exc in raised] == ["RunLost"] and "its job was cancelled" in str(raised[0])
    assert backend.down == set()


def test_a_run_lost_with_its_agent_says_it_waits_for_the_fence() -> None:
    """A job whose agent the master gave up waits for its executor's fence before it is queued again:
    `queue` showed it running on the node's new agent, where it never ran (a helper's walkthrough)."""
    from cosched.mesos import backend as mesos_backend
    from cosched.mesos.runs import Run, Task, new_handle, part_id

    backend = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1", fence=60.0), 1)
    backend.hostnames.update({"A1": "agent1", "A3": "agent3"})
    backend.agents = ["A1"]  # node 0 is agent1's now
    handle = new_handle(7, 1)
    task = Task(part_id(handle, 0, 1, 1), 7, "A3", 1, state="TASK_RUNNING")
    backend.runs[handle] = Run(handle, 7, 1, {0: task})
    assert backend.waiting() == {}
    task.apply({"state": "TASK_LOST", "source": "SOURCE_MASTER"}, time.monotonic())
    assert backend.waiting() == {7: "lost with agent3: queued again once its executor's fence has passed"}


def test_a_quota_change_for_a_part_that_has_just_ended_is_no_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gang's part killed for another part's end answers a quota change `no such running task`:
    logged at ERROR as `cgroup shows None CPUs, expected 1` (a helper's walkthrough). Its end is on
    its way; the change is moot."""
    from cosched.mesos import backend as mesos_backend
    from cosched.mesos.runs import Run, Task, new_handle, part_id

    backend = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1", quota_timeout=1.0), 1)
    handle = new_handle(7, 1)
    task = Task(part_id(handle, 0, 1, 1), 7, "A1", 1, state="TASK_RUNNING")
    backend.runs[handle] = Run(handle, 7, 1, {0: task})

    def answer(agent: str, task_id: str, data: bytes) -> None:
        ask = jobs.parse_message(data)["ask"]
        backend.on_message("A1", task_id, jobs.quota_applied(task_id, None, jobs.NO_SUCH_TASK, ask))

    monkeypatch.setattr(backend.client, "message", answer)
    backend.set_quota(handle, 0.5)  # raised QuotaMismatch


def test_a_launch_whose_offers_were_used_says_it_waits_for_its_tasks_to_run() -> None:
    """An agent cut off after its offer was used: its task never says it runs, and `cosched queue`
    showed the job RUNNING, with a start, until it did (a helper's walkthrough). The launch now says
    what it waits for, offers first, then its tasks."""
    from cosched.mesos import backend as mesos_backend
    from cosched.mesos.offer_book import Demand, Need
    from cosched.mesos.runs import Run, Task, new_handle, part_id

    backend = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1"), 2)
    backend.hostnames.update({"A1": "agent1", "A2": "agent2"})
    handle = new_handle(7, 1)
    tasks = {p: Task(part_id(handle, p, 2, 1), 7, agent, 1) for p, agent in enumerate(("A1", "A2"))}
    launch = mesos_backend._Launch(Run(handle, 7, 2, tasks), {}, Demand(handle, (Need("A1", 1.0, 64.0),)), 0.0)
    backend.launches[handle] = launch
    assert backend.waiting() == {7: "waiting for offers of agent1"}
    launch.demand = None  # its ACCEPTs sent
    tasks[0].ran = True
    assert backend.waiting() == {7: "waiting for its tasks to run on agent2"}
    tasks[1].ran = True
    assert backend.waiting() == {}


class _DownEngine:
    """An agent's Docker engine that answers nothing until `up`; a container is killed by its pid."""

    instance = "mesos-F"

    def __init__(self) -> None:
        self.up = False
        self.killed: list[str] = []
        self.removed: list[str] = []

    def _answer(self) -> None:
        from cosched.daemon.docker_backend import EngineUnavailable

        if not self.up:
            raise EngineUnavailable("cannot reach the Docker engine")

    def labelled(self, **labels: str) -> list[object]:
        self._answer()
        return []

    def remove(self, container: str) -> None:
        self._answer()
        self.removed.append(container)

    def sample(self, *args: object) -> None:
        self._answer()

    def kill_without_engine(self, container: str) -> bool:
        self.killed.append(container)
        return True


class _EndedEngine:
    """An engine whose containers all exited with `code`."""

    def __init__(self, code: int) -> None:
        self.code, self.removed = code, []  # type: ignore[var-annotated]

    def labelled(self, **labels: str) -> list[object]:
        from cosched.daemon.docker_backend import ContainerInfo

        return [ContainerInfo("c1", 7, "exited")]

    def exit_of(self, container: str) -> object:
        from cosched.daemon.docker_backend import Exit

        return Exit(self.code, 1.0, 2.0, False, 0.5)

    def logs(self, container: str) -> str:
        return "out"

    def remove(self, container: str) -> None:
        self.removed.append(container)


@pytest.mark.parametrize(
    ("code", "killing", "state"), [(0, True, "TASK_FINISHED"), (143, True, "TASK_KILLED"), (3, False, "TASK_FAILED")]
)
def test_an_executor_reports_an_end_by_its_exit_code_and_a_sweep_the_ends_it_found(
    code: int, killing: bool, state: str
) -> None:
    """A container that exited 0 while a kill (a requeue, a walltime) was on its way reported
    TASK_KILLED, and its finished job ran again (a crash audit): exit 0 is the job's own end, as
    the daemon's rule on one host says. A sweep reports, by executor, the ends it found."""
    from cosched.mesos.executor import Executor, ExecutorSettings, _Task

    env = {"MESOS_AGENT_ENDPOINT": "127.0.0.1:1", "MESOS_FRAMEWORK_ID": "F", "MESOS_EXECUTOR_ID": "t1"}
    engine = _EndedEngine(code)
    executor = Executor(ExecutorSettings.from_env(env), backend=engine)  # type: ignore[arg-type]
    sent: list[tuple[str, str, Any]] = []
    executor.update = lambda task_id, state, message="", data=None: sent.append((task_id, state, data))  # type: ignore[method-assign]
    payload = jobs.JobPayload(7, {"image": "x", "command": ["true"], "cores": 1}, 1.0, 64)
    executor.tasks["t1"] = _Task({}, payload, 1.0, container="c1", killing=killing)
    executor._collect_ends()
    assert [(task, told) for task, told, _ in sent] == [("t1", state)] and engine.removed == ["c1"]
    assert sent[0][2]["exit_code"] == code and sent[0][2]["log_tail"] == "out"
    assert sent[0][2].get("asked", False) is (state == "TASK_KILLED")  # a kill asked, not the executor's own
    executor.sweep("sweep-1", ["dead-executor"])
    assert sent[1][:2] == ("sweep-1", "TASK_FINISHED")
    end = {key: value for key, value in sent[0][2].items() if key != "asked"}
    assert sent[1][2] == {"removed": ["c1"], "ended": {"dead-executor": end}}


def test_an_update_the_agent_refused_is_sent_again_until_it_takes_it() -> None:
    """A restarted agent answers 503 until its recovery ends, also to an executor that has subscribed
    again: the TASK_FINISHED sent then went only with a next SUBSCRIBE, which never came, and the job
    stayed running for good (a crash audit, 3 of 3 agent restarts near a job's end). It is now sent
    again, one second later, then twice as long each time, until the agent takes it."""
    from cosched.mesos.executor import RESEND_FIRST, Executor, ExecutorSettings

    env = {"MESOS_AGENT_ENDPOINT": "127.0.0.1:1", "MESOS_FRAMEWORK_ID": "F", "MESOS_EXECUTOR_ID": "t1"}
    executor = Executor(ExecutorSettings.from_env(env), backend=None)  # type: ignore[arg-type]
    answers = [False, False, True, False]
    posted: list[str] = []

    def post(call: dict[str, Any]) -> bool:
        posted.append(call["update"]["status"]["state"])
        return answers.pop(0)

    executor._post = post  # type: ignore[method-assign]
    executor.update("t1", "TASK_FINISHED", data={"exit_code": 0})
    [key] = executor.updates.unsent
    assert executor.updates.unsent[key][1] == RESEND_FIRST
    executor._resend_unsent()  # not due yet
    assert posted == ["TASK_FINISHED"]
    for wait in (2 * RESEND_FIRST, None):
        executor.updates.unsent[key] = (0.0, executor.updates.unsent[key][1])  # due now
        executor._resend_unsent()
        assert executor.updates.unsent.get(key, (0, None))[1] == wait
    assert posted == ["TASK_FINISHED"] * 3 and key in executor.updates.pending  # taken; acknowledged later
    executor.update("t1", "TASK_FINISHED")  # refused, then acknowledged before it was due: not sent again
    [again] = executor.updates.unsent
    del executor.updates.pending[again]
    executor.updates.unsent[again] = (0.0, RESEND_FIRST)
    executor._resend_unsent()
    assert len(posted) == 4 and not executor.updates.unsent


def _fencing(engine: _DownEngine, fence: float) -> tuple[Any, list[str], threading.Thread]:
    """An executor with job task t1 (container c1) running, its agent silent (nothing listens at its
    endpoint), watching with `fence`; the states it reports go to the list returned."""
    from cosched.mesos.executor import Executor, ExecutorSettings, _Task

    env = {"MESOS_AGENT_ENDPOINT": "127.0.0.1:1", "MESOS_FRAMEWORK_ID": "F", "MESOS_EXECUTOR_ID": "t1"}
    settings = replace(ExecutorSettings.from_env(env), fence=fence, sample_interval=fence / 3, poll_interval=0.05)
    executor = Executor(settings, backend=engine)  # type: ignore[arg-type]
    sent: list[str] = []
    executor.update = lambda task_id, state, message="", data=None: sent.append(state)  # type: ignore[method-assign]
    payload = jobs.JobPayload(7, {"image": "x", "command": ["true"], "cores": 1}, 1.0, 64)
    executor.tasks["t1"] = _Task({}, payload, 1.0, container="c1")
    executor.served = True
    watcher = threading.Thread(target=executor._watch, daemon=True)
    watcher.start()
    deadline = time.monotonic() + 10
    while not sent and time.monotonic() < deadline:
        time.sleep(0.02)
    return executor, sent, watcher


def test_an_executor_whose_engine_is_down_too_still_fences_its_jobs() -> None:
    """Its agent silent and its engine down: reading the jobs' ends failed first, and the fence, after
    it in the same step, never ran, nor the usage report whose failure shows the agent's silence.
    Now the fence runs apart, probes the agent, and stops the job by its pid (containerd runs it on
    without dockerd)."""
    engine = _DownEngine()
    executor, sent, watcher = _fencing(engine, fence=0.5)
    executor.stopping.set()
    watcher.join(5)
    assert sent == ["TASK_LOST"] and engine.killed == ["c1"]


@pytest.mark.parametrize("engine_returns", [True, False])
def test_a_container_the_fence_killed_without_the_engine_is_removed_once_the_engine_answers(
    monkeypatch: pytest.MonkeyPatch, engine_returns: bool
) -> None:
    """The fence stops a job by its pid while the engine is down: the exited container stayed in the
    engine for ever, since the executor then left and nobody else removes it. Now the executor stays
    until the engine answers and removes it, for `LEFT_WAIT` s at most, then leaves it, saying so."""
    from cosched.mesos import executor as executor_module

    monkeypatch.setattr(executor_module, "LEFT_WAIT", 1.0)
    engine = _DownEngine()
    executor, sent, watcher = _fencing(engine, fence=0.3)
    try:
        assert sent == ["TASK_LOST"]
        time.sleep(0.3)
        assert not executor.done, "left with its stopped container still in the engine"
        engine.up = engine_returns
        watcher.join(10)
    finally:
        executor.stopping.set()
        watcher.join(5)
    assert executor.done
    assert engine.removed == (["c1"] if engine_returns else [])


@pytest.mark.parametrize("engine_up", [True, False])
def test_an_executor_that_leaves_otherwise_removes_what_the_fence_left_first(
    monkeypatch: pytest.MonkeyPatch, engine_up: bool
) -> None:
    """Only the usual way out waited for the engine to remove a container the fence could only kill;
    an executor leaving because its agent is gone (or refuses it, or shuts it down) left it in the
    engine (a review). `run` now removes it on every way out, within `LEFT_WAIT`."""
    from cosched.daemon.docker_backend import EngineUnavailable
    from cosched.mesos import executor as executor_module
    from cosched.mesos.executor import Executor, ExecutorSettings, _Task

    monkeypatch.setattr(executor_module, "LEFT_WAIT", 0.3)
    removed: list[str] = []

    class Engine:
        instance = "mesos-F"

        def remove(self, container: str) -> None:
            if not engine_up:
                raise EngineUnavailable("cannot reach the Docker engine")
            removed.append(container)

    env = {"MESOS_AGENT_ENDPOINT": "127.0.0.1:1", "MESOS_FRAMEWORK_ID": "F", "MESOS_EXECUTOR_ID": "t1"}
    settings = replace(
        ExecutorSettings.from_env(env), poll_interval=0.05
    )  # no checkpointing: an unreachable agent ends it
    executor = Executor(settings, backend=Engine())  # type: ignore[arg-type]
    payload = jobs.JobPayload(7, {"image": "x", "command": ["true"], "cores": 1}, 1.0, 64)
    executor.tasks["t1"] = _Task({}, payload, 1.0, container="c1", ended=True, left=True)
    assert executor.run() == 1
    assert removed == (["c1"] if engine_up else [])
    assert not executor.tasks["t1"].left


def test_a_container_is_killed_by_its_remembered_pid_and_never_another_process(tmp_path: Path) -> None:
    """The fence's kill when the engine cannot be asked: by a pidfd of the pid remembered at launch,
    checked against its start time, so a pid the kernel gave to another process is left alone."""
    import subprocess

    from cosched.daemon.docker_backend import DockerBackend

    backend = DockerBackend("units", DockerSection())
    job = subprocess.Popen(["sleep", "60"])
    other = subprocess.Popen(["sleep", "60"])
    try:
        backend._remember("c1", job.pid)
        backend._remember("c2", other.pid)
        backend._starts["c2"] += 1  # as if `other` were a later process given the remembered pid
        assert backend.kill_without_engine("c1") and job.wait(5) == -9
        assert not backend.kill_without_engine("c1")  # gone now
        assert not backend.kill_without_engine("c2") and other.poll() is None
        assert not backend.kill_without_engine("never-launched")
    finally:
        for process in (job, other):
            process.kill()
            process.wait()


def test_an_executor_its_agent_refuses_leaves_once_none_of_its_jobs_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent restarted under a new id answers the old executor's subscription `Framework cannot be
    found`: the executor waited for it up to the recovery timeout (15 min), long after its fence had
    stopped its jobs. It leaves once none runs; while one still runs it waits (the fence stops it)."""
    from cosched.mesos import executor as executor_module
    from cosched.mesos.errors import CallError
    from cosched.mesos.executor import Executor, ExecutorSettings, _Task

    def refused(*args: object, **kwargs: object) -> None:
        raise CallError("agent refused SUBSCRIBE: 400 Bad Request: Framework cannot be found")

    monkeypatch.setattr(executor_module, "open_stream", refused)
    env = {"MESOS_AGENT_ENDPOINT": "127.0.0.1:1", "MESOS_FRAMEWORK_ID": "F", "MESOS_EXECUTOR_ID": "t1"}
    settings = replace(ExecutorSettings.from_env(env), checkpoint=True, recovery_timeout=3.0, backoff_max=0.1)
    executor = Executor(settings, backend=object())  # type: ignore[arg-type]
    payload = jobs.JobPayload(7, {"image": "x", "command": ["true"], "cores": 1}, 1.0, 64)
    executor.tasks["t1"] = _Task({"task_id": {"value": "t1"}}, payload, 1.0, container="c1")
    executor.served = True
    started = time.monotonic()
    assert executor._stay_subscribed() == 1
    assert time.monotonic() - started >= 3.0  # a job still ran: it waited out the recovery timeout
    executor.tasks["t1"].ended = True  # fenced
    started = time.monotonic()
    assert executor._stay_subscribed() == 1
    assert time.monotonic() - started < 1.0


def test_a_room_learnt_before_reconciliation_told_of_a_running_task_counts_it_once_sized() -> None:
    """After a restart the agent's first offer may come before reconciliation tells of the job
    running there: its room was learnt without that job's core, which then read as other
    frameworks' (`other frameworks hold 1 core`) until the agent's next offer. Counted in once the
    daemon tells the task's size; a task launched here was in the offer and is not counted twice."""
    from cosched.mesos import backend as mesos_backend
    from cosched.mesos.runs import new_handle, part_id
    from cosched.mesos.shares import Room

    backend = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1"), 1)
    backend.agents = ["A1"]
    with backend.cond:
        backend.rooms["A1"] = Room(1.05, 0.0)  # what the first offer showed: one core free of two
        backend._rooms_learnt["A1"] = time.monotonic()
    assert backend.others_hold(2, 0) == {0: (1, 0)}
    time.sleep(0.01)
    handle = new_handle(7, 1)
    task_id = part_id(handle, 0, 1, 1)
    update = {"task_id": {"value": task_id}, "agent_id": {"value": "A1"}, "state": "TASK_RUNNING"}
    backend.on_update({**update, "source": "SOURCE_MASTER", "reason": "REASON_RECONCILIATION"})
    assert backend.unsized() == [(handle, 7)]
    backend.size(handle, 0, guest=False)
    assert backend.others_hold(2, 0) == {}
    backend.size(handle, 0, guest=False)  # told again: counted once
    assert backend.rooms["A1"].cpus == pytest.approx(2.1)


def test_a_sweep_that_found_a_killed_executors_container_ended_reports_the_jobs_end() -> None:
    """The sweep of a SIGKILLed executor's agent found its container ended on its own (exit 0): the
    run ended, as the job did; it counted as lost and the job ran again (a crash audit). A sweep's
    report without ends (an older executor), or with a malformed one, leaves the run lost."""
    from types import SimpleNamespace

    from cosched.mesos import backend as mesos_backend
    from cosched.mesos.runs import Run, Task, new_handle, part_id

    def swept(ended: Any, failed_first: bool = False) -> tuple[str, int]:
        backend = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1"), 1)
        backend.agents, backend.hostnames = ["A1"], {"A1": "agent1"}
        backend.client = SimpleNamespace(framework_id="F1")  # type: ignore[assignment]
        handle = new_handle(7, 1)
        task = Task(part_id(handle, 0, 1, 1), 7, "A1", 1, ran=True, data={"started": 5.0})
        task.apply({"state": "TASK_FAILED", "source": "SOURCE_AGENT", "reason": "REASON_EXECUTOR_TERMINATED"}, 0.0)
        backend.runs[handle] = Run(handle, 7, 1, {0: task}, run=1)
        with backend.cond:
            backend._want_sweep("A1")
        body = {"removed": ["c1"], **({"ended": ended(task.id)} if ended else {})}
        data = base64.b64encode(json.dumps(body).encode()).decode()
        done = {"state": "TASK_FINISHED", "source": "SOURCE_EXECUTOR", "data": data}
        if failed_first:  # a try that read the end, removed the container, then lost the engine
            failed = {**done, "state": "TASK_FAILED", "message": "cannot sweep: engine gone"}
            where = {"task_id": {"value": backend.sweeps["A1"].task_id}, "agent_id": {"value": "A1"}}
            backend.on_update({**failed, **where})
            done.pop("data")  # the next try finds nothing of it
        sweep = backend.sweeps["A1"]
        assert sweep.killed == [task.id]
        backend.on_update({**done, "task_id": {"value": sweep.task_id}, "agent_id": {"value": "A1"}})
        return backend.containers()[7].state, backend.exit_of(handle).code

    end = {"exit_code": 0, "finished": 9.0, "oom": False, "log_tail": "done", "cpu_seconds": 1.0}
    assert swept(lambda task: {task: end}) == ("exited", 0)
    assert swept(lambda task: {task: {**end, "exit_code": 2}}) == ("exited", 2)
    assert swept(None)[0] == "lost"
    assert swept(lambda task: {task: end}, failed_first=True) == ("exited", 0)  # the end a failed try read
    assert swept(lambda task: {task: {**end, "exit_code": "0"}})[0] == "lost"


class _LateReconcilingMaster:
    """A master's calls as the backend makes them at start: reconciliation's answers come late, a
    wake-up (an offer) before them, and an explicit answer after those of an implicit call."""

    def __init__(self, backend: Any, told: dict[str, Any], answer_marker: bool = True) -> None:
        self.backend, self.told, self.answer_marker = backend, told, answer_marker
        self.calls: list[list[tuple[str, str | None]]] = []
        # the answers to the implicit RECONCILE the client sent on SUBSCRIBED, which the old start-up
        # waited for (a quiet second), come now too
        threading.Timer(0.5, self.backend.on_update, (self.told,)).start()

    def reconcile(self, tasks: Any = ()) -> None:
        tasks = list(tasks)
        self.calls.append(tasks)
        if not tasks:
            threading.Timer(0.5, self.backend.on_update, (self.told,)).start()
        elif self.answer_marker:
            lost = {"task_id": {"value": tasks[0][0]}, "state": "TASK_LOST", "reason": "REASON_RECONCILIATION"}
            threading.Timer(0.6, self.backend.on_update, (lost,)).start()


def test_start_up_waits_for_the_master_to_finish_reconciling_whatever_wakes_it_before() -> None:
    """A daemon SIGKILLed between its ACCEPT and recording the run restarts with the job
    `launching`: only reconciliation tells that its task ran. The start-up waited for a quiet second
    of updates, which any wake-up ended (an offer): recovery listed no run, queued the job again, and
    it ran twice (CI at c5adcd6). It now waits for the answer to an explicit RECONCILE asked after
    the implicit one, which the master gives after all of that one's."""
    from cosched.mesos import backend as mesos_backend
    from cosched.mesos.runs import new_handle, part_id

    backend = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1"), 1)
    backend.agents = ["A1"]
    handle = new_handle(7, 1)
    told = {
        "task_id": {"value": part_id(handle, 0, 1, 1)},
        "agent_id": {"value": "A1"},
        "state": "TASK_FINISHED",
        "source": "SOURCE_MASTER",
        "reason": "REASON_RECONCILIATION",
    }
    master = backend.client = _LateReconcilingMaster(backend, told)  # type: ignore[assignment]

    def wake() -> None:
        with backend.cond:
            backend.cond.notify_all()

    threading.Timer(0.1, wake).start()
    backend._settle()
    assert backend.containers()[7].id == handle  # recovery adopts it (live until its executor's own update)
    assert master.calls[0] == [] and master.calls[1][0][1] == "A1"  # the marker asked on an agent that offered

    silent = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1"), 1)
    silent.client = _LateReconcilingMaster(silent, told, answer_marker=False)  # type: ignore[assignment]
    started = time.monotonic()
    silent._settle(limit=1.0)  # a master that never answers: the start is not held for good
    assert 1.0 <= time.monotonic() - started < 5.0


def test_a_run_lost_on_an_agent_whose_node_another_took_names_the_machine() -> None:
    """Once a spare took its node, a run lost on the dead agent named the agent's id in its reason
    (`TASK_LOST on 1be963c0-...-S1`), not the machine (an operator's walkthrough)."""
    from cosched.mesos import backend as mesos_backend
    from cosched.mesos.runs import Run, Task, new_handle, part_id

    backend = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1"), 2)
    backend.node_hosts, backend.agents = ["agent1", "agent2"], ["S0", "S1"]
    backend.hostnames = {"S0": "agent1", "S1": "agent2"}
    handle = new_handle(7, 1)
    task = Task(part_id(handle, 0, 1, 1), 7, "S1", 1, state="TASK_LOST", message="agent removed", stopped=0.0)
    backend.runs[handle] = Run(handle, 7, 1, {0: task}, run=1)
    with backend.cond:
        backend._take(1, "agent3")
    info = backend.containers()[7]
    assert info.state == "lost" and info.note == "TASK_LOST on agent2: agent removed", info


def test_nodes_mapped_anew_take_drained_machines_last() -> None:
    """Restarted with fewer nodes, the daemon maps the agents anew: the first to offer, in hostname
    order, kept the machine an operator drained to retire and left a healthy one out (a walkthrough
    on a real master). Drained machines come last, and the mapping waits for enough others."""
    from cosched.mesos import backend as mesos_backend

    backend = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1"), 1, put_last=["agent1"])
    backend.hostnames = {"S1": "agent1"}

    def agent3_offers_later() -> None:
        time.sleep(0.3)
        with backend.cond:
            backend.hostnames["S3"] = "agent3"
            backend.cond.notify_all()

    threading.Thread(target=agent3_offers_later, daemon=True).start()
    with backend.cond:
        backend._map_nodes(5.0)
    assert backend.node_hosts == ["agent3"]
    alone = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1"), 1, put_last=["agent1"])
    alone.hostnames = {"S1": "agent1"}
    with alone.cond:
        alone._map_nodes(0.2)  # no other machine: the drained one, for want of any
    assert alone.node_hosts == ["agent1"]


def test_a_restarted_daemon_tells_the_held_parts_of_a_gang_it_adopted_to_start() -> None:
    """The daemon died after one part of a gang was told `go` and before the other: the first runs,
    the second is held. The restarted daemon adopts the run (a part of it ran) and tells the held
    part to start, again every few seconds until it runs; one it has not adopted (recovery has not
    decided on it yet) is told nothing."""
    from cosched.mesos import backend as mesos_backend
    from cosched.mesos.runs import new_handle, part_id

    backend = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1"), 2)
    told: list[tuple[str, str, bytes]] = []
    backend.client.message = lambda agent, executor, data: told.append((agent, executor, data))  # type: ignore[method-assign]
    handle = new_handle(7, 1)
    parts = [part_id(handle, part, 2, 1) for part in range(2)]
    reconciled = {"source": "SOURCE_MASTER", "reason": "REASON_RECONCILIATION"}
    for task_id, agent, state in ((parts[0], "A1", "TASK_RUNNING"), (parts[1], "A2", "TASK_STARTING")):
        backend.on_update({"task_id": {"value": task_id}, "agent_id": {"value": agent}, "state": state, **reconciled})

    def round_at(now: float) -> list[str]:
        with backend.cond:
            work = backend._tell_go(now)
        for call in work:
            call()
        said = [executor for _, executor, data in told if jobs.parse_message(data) == {"type": "go", "task": executor}]
        told.clear()
        return said

    assert round_at(100.0) == []  # not the daemon's yet
    backend.adopt(handle)
    assert round_at(100.0) == [parts[1]]
    assert round_at(101.0) == []  # answered by TASK_RUNNING, else said again
    assert round_at(100.0 + mesos_backend.MESSAGE_RESEND) == [parts[1]]
    backend.on_update({"task_id": {"value": parts[1]}, "agent_id": {"value": "A2"}, "state": "TASK_RUNNING"})
    assert round_at(200.0) == [] and handle not in backend._held


def test_an_executors_container_carries_the_run_its_task_id_names() -> None:
    """The container's `cosched.run` label said 0 beside its name's r1 (a helper's walkthrough)."""
    from cosched.mesos.executor import _run_of
    from cosched.mesos.runs import new_handle, part_id

    assert _run_of(part_id(new_handle(7, 3), 0, 2, 1)) == 3
    assert _run_of("cosched-job-7-1a2b3c-0of1-1c") == 0  # a handle from before runs were numbered
    assert _run_of("t1") == 0


def test_a_revive_while_not_subscribed_is_no_warning_and_a_refused_one_names_its_call_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While a master is elected every round's REVIVE found no subscription: a warning a second,
    `REVIVE: REVIVE: not subscribed to a Mesos master` (a helper's walkthrough). The subscription
    says why it is down; a call the master refuses is still a warning, its name said once."""
    from cosched.mesos import backend as mesos_backend
    from cosched.mesos.errors import CallError, NotSubscribed

    backend = mesos_backend.MesosBackend(mesos_backend.MesosSettings(masters="127.0.0.1:1"), 1)

    def unsubscribed() -> None:
        raise NotSubscribed("REVIVE: not subscribed to a Mesos master")

    def refused() -> None:
        raise CallError("REVIVE: 400 Bad Request")

    with caplog.at_level("DEBUG", logger="cosched.mesos"):
        backend._flow(unsubscribed, "REVIVE")
        backend._flow(refused, "REVIVE")
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "REVIVE" in r.getMessage()]
    assert said == [("DEBUG", "REVIVE: not subscribed to a Mesos master"), ("WARNING", "REVIVE: 400 Bad Request")]
