"""A real Mesos master and agents for the scheduler-client tests, and a handler that records events.

The cluster comes from ../shared/mesos (a Mesos 1.12 build and `local-cluster.sh`). Without it the tests
skip, except under CI (CI=true), where they fail: a broken set-up must not pass by skipping. Mesos is
installed to /opt/mesos (as root) when absent, as on a fresh CI machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import math
import os
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from daemon_support import wait_until

from cosched.mesos import EventHandler, SchedulerClient, SchedulerConfig

SHARED_MESOS = Path(__file__).resolve().parents[1].parent / "shared" / "mesos"
SCRIPT = SHARED_MESOS / "local-cluster.sh"
MESOS_HOME = Path(os.environ.get("MESOS_HOME", "/opt/mesos"))
AGENTS = 2
ZOOKEEPER = Path("/usr/share/zookeeper/bin/zkServer.sh")
INSTALL_LOCK = Path(tempfile.gettempdir()) / "cosched-mesos-install.lock"


def unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"under CI the Mesos tests must run: {reason}")
    pytest.skip(reason)


def free_port_run(count: int) -> int:
    """A port p with p .. p+count-1 free (the master takes p, agent i takes p+i)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = int(sock.getsockname()[1])
        if base + count > 65535:
            continue
        try:
            for port in range(base, base + count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no run of {count} free ports")


@dataclass
class Cluster:
    port: int
    run_dir: Path
    env: dict[str, str]

    @property
    def master(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def zookeeper(self) -> str:
        """The ZooKeeper group its master is elected in (a cluster started with `zookeeper`)."""
        return f"zk://127.0.0.1:{self.env['ZK_PORT']}/mesos"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://{self.master}{path}", timeout=10) as response:
            return json.load(response)

    def state(self) -> Any:
        return self.get("/master/state")

    def framework(self, framework_id: str) -> dict[str, Any] | None:
        state = self.state()
        for entry in state["frameworks"] + state.get("completed_frameworks", []):
            if entry["id"] == framework_id:
                return dict(entry)
        return None

    def task_states(self, framework_id: str) -> list[str]:
        """States of the framework's tasks the master holds (terminal ones until acknowledged)."""
        framework = self.framework(framework_id) or {"tasks": []}
        return [task["state"] for task in framework["tasks"]]

    def metric(self, framework_name: str, framework_id: str, name: str) -> float:
        """A per-framework counter of /metrics/snapshot, e.g. 'offers/sent', 'offers/declined', 'calls/revive'."""
        snapshot = self.get("/metrics/snapshot")
        return float(snapshot.get(f"master/frameworks/{framework_name}/{framework_id}/{name}", 0.0))

    def teardown_everything(self) -> None:
        """Operator TEARDOWN of every framework still known, so no task outlives the cluster (posix launcher)."""
        for entry in self.state()["frameworks"]:
            data = urllib.parse.urlencode({"frameworkId": entry["id"]}).encode()
            urllib.request.urlopen(f"http://{self.master}/master/teardown", data=data, timeout=10).close()
        deadline = time.monotonic() + 20
        while self.state()["frameworks"] and time.monotonic() < deadline:
            time.sleep(0.2)

    def restart_master(self) -> None:
        """Kill the master and start it again (agents and tasks stay); needs the ZooKeeper set-up to recover."""
        subprocess.run(["bash", str(SCRIPT), "restart-master"], env=self.env, check=True, timeout=60)

    @contextlib.contextmanager
    def master_stopped(self) -> Iterator[None]:
        """SIGSTOP this cluster's master, SIGCONT it at the end whatever happens: its connections stay
        open and nothing comes on them, no heartbeat either (a hung master, or a half-open link)."""
        pid = int((self.run_dir / "master.pid").read_text())
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    @contextlib.contextmanager
    def agent_stopped(self, index: int) -> Iterator[None]:
        """SIGSTOP agent `index`, SIGCONT it at the end whatever happens: its executors and their
        containers run on, cut off from it (a frozen machine's agent, or a network partition)."""
        pid = int((self.run_dir / f"agent{index}.pid").read_text())
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    def crash_and_restart_agent(self, index: int) -> None:
        """SIGKILL agent `index` (its executors and tasks live on: posix launcher) and start it again
        with the same flags; it recovers its checkpointed executors, which must re-subscribe."""
        self.start_agent(index, self.kill_agent(index))

    def kill_agent(self, index: int) -> list[bytes]:
        """SIGKILL agent `index` (what it started lives on: posix launcher); its command line, to start it again."""
        pid_file = self.run_dir / f"agent{index}.pid"
        pid = int(pid_file.read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 10, f"agent{index} to die")
        return argv

    def start_agent(self, index: int, argv: list[bytes]) -> None:
        with open(self.run_dir / f"agent{index}.out", "ab") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        (self.run_dir / f"agent{index}.pid").write_text(str(process.pid))

    def agent_id(self, hostname: str) -> str:
        [agent] = [a["id"] for a in self.state()["slaves"] if a["hostname"] == hostname]
        return str(agent)

    def active_agents(self) -> int:
        return sum(1 for a in self.state()["slaves"] if a.get("active"))

    def client(
        self,
        handler: EventHandler,
        name: str,
        framework_id: str | None = None,
        on_framework_id: Callable[[str], None] | None = None,
        **config: Any,
    ) -> SchedulerClient:
        settings = SchedulerConfig(masters=[self.master], name=name, user="root", failover_timeout=3600, **config)
        return SchedulerClient(settings, handler, framework_id=framework_id, on_framework_id=on_framework_id)


def executor_pids(framework_id: str, agent_id: str) -> dict[int, str]:
    """The processes of the framework's executors on one agent (shells and Pythons) and their
    executor ids, found by the environment the agent gave them: the test's own cluster started them."""
    found = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            env = dict(line.split(b"=", 1) for line in environ.read_bytes().split(b"\0") if b"=" in line)
        except OSError:
            continue
        if env.get(b"MESOS_FRAMEWORK_ID") == framework_id.encode() and f"/slaves/{agent_id}/".encode() in env.get(
            b"MESOS_DIRECTORY", b""
        ):
            found[int(environ.parent.name)] = env[b"MESOS_EXECUTOR_ID"].decode()
    return found


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def start_cluster(
    run_dir: Path,
    zookeeper: bool = False,
    cpus: float = 1,
    mem: int = 1024,
    master: dict[str, str] | None = None,
    agents: int = AGENTS,
) -> Cluster:
    """A master and `agents` agents (`cpus` and `mem` MiB each) on free ports; with `zookeeper`, a
    ZooKeeper and a replicated-log registry too. `master` sets master flags (through the environment,
    which agents read only for flags of their own), e.g. {"agent_ping_timeout": "1secs"}."""
    if not SCRIPT.exists():
        unavailable(f"{SCRIPT} is absent (the shared Mesos build)")
    env = dict(os.environ, MESOS_RUN=str(run_dir), MESOS_HOME=str(MESOS_HOME))
    env.pop("MESOS_ZK", None)
    env.update({f"MESOS_{flag.upper()}": value for flag, value in (master or {}).items()})
    if zookeeper:
        env.update(MESOS_ZK="1", ZK_PORT=str(free_port_run(1)))
    _install_once(env, zookeeper)
    env["MESOS_PORT"] = str(free_port_run(agents + 1))
    subprocess.run(["bash", str(SCRIPT), "start", str(agents), str(cpus), str(mem)], env=env, check=True, timeout=120)
    return Cluster(int(env["MESOS_PORT"]), run_dir, env)


def _install_once(env: dict[str, str], zookeeper: bool) -> None:
    """Install Mesos (and ZooKeeper) when absent, one installer at a time on the machine: on a
    fresh machine both pytest workers reach their first Mesos test together, and two installs at
    once would fight over dpkg's lock and unpack one tarball over the other's."""
    with open(INSTALL_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (MESOS_HOME / "sbin" / "mesos-master").exists() and (not zookeeper or ZOOKEEPER.exists()):
            return
        if os.geteuid() != 0:
            unavailable(f"Mesos (or ZooKeeper) is not installed in {MESOS_HOME} and installing it needs root")
        done = subprocess.run(["bash", str(SCRIPT), "install"], env=env, timeout=900, capture_output=True, text=True)
        if done.returncode:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            pytest.fail(f"{SCRIPT} install failed ({done.returncode}): {last[0]}")


def stop_cluster(cluster: Cluster) -> None:
    try:
        cluster.teardown_everything()
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=cluster.env, check=False, timeout=60)


def command_task(task_id: str, agent_id: str, command: str, cpus: float = 0.1, mem: float = 32) -> dict[str, Any]:
    """A TaskInfo run by Mesos's command executor."""
    return {
        "name": task_id,
        "task_id": {"value": task_id},
        "agent_id": {"value": agent_id},
        "resources": [
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": mem}},
        ],
        "command": {"value": command, "shell": True},
    }


class Recorder(EventHandler):
    """Records every event; tests wait on it with a bound."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.subscribed: list[str] = []
        self.offers: list[dict[str, Any]] = []
        self.rescinded: list[str] = []
        self.updates: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.disconnects: list[str] = []

    def _add(self, items: list[Any], *values: Any) -> None:
        with self.cond:
            items.extend(values)
            self.cond.notify_all()

    def on_subscribed(self, framework_id: str, subscribed: dict[str, Any]) -> None:
        self._add(self.subscribed, framework_id)

    def on_offers(self, offers: list[dict[str, Any]]) -> None:
        self._add(self.offers, *offers)

    def on_rescind(self, offer_id: str) -> None:
        self._add(self.rescinded, offer_id)

    def on_update(self, status: dict[str, Any]) -> None:
        self._add(self.updates, status)

    def on_error(self, message: str) -> None:
        self._add(self.errors, message)

    def on_disconnected(self, reason: str) -> None:
        self._add(self.disconnects, reason)

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        with self.cond:
            result = self.cond.wait_for(predicate, timeout)
        assert result, f"timed out after {timeout} s waiting for {what}"
        return result

    def states(self, task_id: str) -> list[str]:
        with self.cond:
            return [u["state"] for u in self.updates if u["task_id"]["value"] == task_id]

    def updates_since(self, index: int, task_id: str, reason: str) -> list[dict[str, Any]]:
        """Updates for `task_id` with `reason`, among those received after the first `index`."""
        with self.cond:
            return [u for u in self.updates[index:] if u["task_id"]["value"] == task_id and u.get("reason") == reason]

    def offers_from(self, hostname: str) -> list[dict[str, Any]]:
        with self.cond:
            return [o for o in self.offers if o["hostname"] == hostname]


EXECUTOR = f"{shlex.quote(sys.executable)} -m cosched.mesos.executor"
"""How the test agents start the executor: this interpreter, which has cosched installed."""


def mesos_daemon(
    cluster: Cluster,
    root: Path,
    name: str,
    *,
    cosched: str = "none",
    mesos: str = "",
    policies: str = "",
    data_roots: bool = False,
    docker: str = "",
    masters: str = "",
    api: str = "",
    token: str = "",
    fence: float = 1.0,
) -> Any:
    """A started `cosched daemon` whose 2 nodes of 1 core are the cluster's two agents; `mesos`,
    `policies`, `docker` and `api` add keys to those tables; `data_roots` makes `root` the jobs' data
    root; `masters` replaces the master's address (e.g. the cluster's ZooKeeper group); `token` is
    the test client's. `fence` is short, so a lost agent's jobs run elsewhere 31 s after."""
    from daemon_support import DaemonProcess

    daemon = DaemonProcess(
        root,
        cores=2,
        cluster="nodes = 2\nmemory_mib = 1536",
        data_roots=data_roots,
        docker=docker,
        api=api,
        token=token,
        extra=(
            f'[backend]\nkind = "mesos"\n[mesos]\nmasters = "{masters or cluster.master}"\nname = "{name}"\n'
            f'executor_command = "{EXECUTOR}"\nfence = {fence}\n{mesos}\n'
            f'[policies]\ncosched = "{cosched}"\n{policies}\n'
        ),
    )
    daemon.start(timeout=60)
    return daemon


def nodes_shown(daemon: Any) -> str:
    """What `cosched nodes` prints for the daemon: the operator's view of its agents."""
    return subprocess.run(
        [sys.executable, "-m", "cosched.cli", "nodes", "--url", daemon.client.url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def finish(cluster: Cluster, daemon: Any) -> None:
    """After a test: stop the daemon, tear its framework down (no task outlives the test), check
    none of its containers is left, and wait for both agents (a test may have restarted one)."""
    from daemon_support import require_engine

    from cosched.mesos.executor import instance_of

    daemon.stop()
    cluster.teardown_everything()
    try:
        label = {"label": f"cosched.instance={instance_of(framework_id_of(daemon))}"}
    except (OSError, TypeError, sqlite3.Error):
        label = None  # it never subscribed
    if label is not None:
        engine = require_engine()
        wait_until(lambda: not containers_left(engine, label), 30, "no container of the framework left")
    wait_until(lambda: cluster.active_agents() == AGENTS, 60, "both agents registered")


def containers_left(engine: Any, filters: dict[str, Any]) -> list[Any]:
    """The containers (running or not) that match `filters`. Docker lists ids, then inspects each:
    one an executor removes in between is not left, and must not fail the listing (seen in CI)."""
    return list(engine.containers.list(all=True, filters=filters, ignore_removed=True))


def framework_id_of(daemon: Any) -> str:
    with daemon.db() as db:
        return str(json.loads(db.execute("SELECT value FROM meta WHERE key = 'framework_id'").fetchone()[0]))


@dataclass
class Container:
    """One container a job's task ran in, from the engine's own event log."""

    task: str
    started: float
    ended: float | None
    exit_code: int | None

    @property
    def run(self) -> str:
        """The run it belonged to (one launch of a job; the task id less its part)."""
        return self.task.rsplit("-", 2)[0]


class ContainerEvents:
    """The engine's events for cosched's containers from now on, read as they happen.

    dockerd keeps only its last 256 events, and other tests on the same engine (another pytest
    worker's among them) can push a job's `start` out before the test reads it; a stream opened at
    the test's start keeps them all. The engine's history is merged in at reading time, so an event
    the stream has not handed over yet is not missed either."""

    FILTERS: ClassVar[dict[str, str]] = {"type": "container", "label": "cosched.instance"}

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.since = int(time.time())
        self._stream = engine.events(since=self.since, filters=self.FILTERS, decode=True)
        self._read: list[dict[str, Any]] = []
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        with contextlib.suppress(Exception):  # the stream ends when closed
            self._read.extend(self._stream)

    def close(self) -> None:
        self._stream.close()

    def containers(self, framework_id: str) -> dict[int, list[Container]]:
        """Every container of the framework's jobs that started since the log opened, by job: what
        really ran, whatever the daemon or Mesos believe."""
        from cosched.mesos.executor import instance_of

        history = self.engine.events(since=self.since, until=int(time.time()) + 1, filters=self.FILTERS, decode=True)
        events = {(e["Actor"]["ID"], e["Action"], e["timeNano"]): e for e in [*list(self._read), *history]}
        instance = instance_of(framework_id)
        seen: dict[str, Container] = {}
        jobs: dict[int, list[Container]] = {}
        for event in sorted(events.values(), key=lambda e: e["timeNano"]):
            attributes = event["Actor"]["Attributes"]
            if attributes.get("cosched.instance") != instance:
                continue
            when = event["timeNano"] / 1e9
            cid = event["Actor"]["ID"]
            if event["Action"] == "start":
                seen[cid] = Container(attributes.get("cosched.task", ""), when, None, None)
                jobs.setdefault(int(attributes["cosched.job"]), []).append(seen[cid])
            elif event["Action"] == "die" and cid in seen:
                seen[cid].ended = when
                seen[cid].exit_code = int(attributes.get("exitCode", -1))
        return jobs


def assert_ran_once(containers: list[Container]) -> None:
    """One run of the job ended with every part exiting 0, and no two runs ever overlapped."""
    runs: dict[str, list[Container]] = {}
    for container in containers:
        runs.setdefault(container.run, []).append(container)
    done = [run for run, parts in runs.items() if all(c.exit_code == 0 for c in parts)]
    assert len(done) == 1, {run: [(c.task, c.exit_code) for c in parts] for run, parts in runs.items()}
    spans = sorted((min(c.started for c in parts), max(c.ended or math.inf for c in parts)) for parts in runs.values())
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start, f"two runs of one job overlapped: {spans}"
