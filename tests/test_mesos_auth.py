"""Framework authentication on a REAL master that demands it (`--authenticate_http_frameworks`,
basic authenticator, a credentials file): without credentials or with a wrong secret SUBSCRIBE is
refused with one line and the client stops; with `[mesos] principal` and `secret_file` the daemon
subscribes as that principal and runs a job on the agents."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_support import require_engine
from mesos_support import Cluster, Recorder, finish, framework_id_of, mesos_daemon, start_cluster, stop_cluster

from cosched.daemon.config import from_dict, validate
from cosched.errors import ConfigError
from cosched.mesos.backend import read_secret
from workloads.images import busybox_image

PRINCIPAL, SECRET = "cosched", "s3cret-only-root-reads"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = Path(tmp_path_factory.mktemp("mesos-auth"))
    credentials = run_dir / "credentials.json"
    credentials.write_text(json.dumps({"credentials": [{"principal": PRINCIPAL, "secret": SECRET}]}))
    credentials.chmod(0o600)
    flags = {
        "authenticate_http_frameworks": "true",
        "http_framework_authenticators": "basic",
        "credentials": str(credentials),
    }
    started = start_cluster(run_dir, cpus=2, mem=2048, master=flags)
    try:
        yield started
    finally:
        stop_cluster(started)


@pytest.mark.parametrize(("principal", "secret"), [("", ""), (PRINCIPAL, "wrong")])
def test_a_master_that_authenticates_refuses_a_framework_without_the_right_secret(
    cluster: Cluster, principal: str, secret: str
) -> None:
    client = cluster.client(Recorder(), "cosched-auth-refused", principal=principal, secret=secret).start()
    try:
        assert not client.wait_subscribed(15)
        assert client.failure is not None and "refused SUBSCRIBE: 401" in client.failure, client.failure
        assert "\n" not in client.failure and SECRET not in client.failure
    finally:
        client.stop()


def test_the_daemon_authenticates_as_its_principal_and_runs_a_job(cluster: Cluster, tmp_path: Path) -> None:
    image = busybox_image(require_engine())
    secret_file = tmp_path / "mesos.secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    daemon = mesos_daemon(
        cluster, tmp_path, "cosched-auth", mesos=f'principal = "{PRINCIPAL}"\nsecret_file = "{secret_file}"'
    )
    try:
        job = daemon.submit(image=image, command=["true"], cores=1, memory_mib=64, walltime=60)
        assert daemon.wait_final([job], 60)[job]["state"] == "done"
        framework = cluster.framework(framework_id_of(daemon))
        assert framework is not None and framework["principal"] == PRINCIPAL
        assert SECRET not in daemon.log.read_text()
    finally:
        finish(cluster, daemon)


def test_an_unreadable_empty_or_shared_secret_file_is_one_line(tmp_path: Path) -> None:
    """A secret others may read was accepted: with it and the framework's id, a local user could
    subscribe as this framework and launch tasks as `mesos.user` on every agent."""
    with pytest.raises(ConfigError, match=r"mesos\.secret_file: cannot open .*: No such file"):
        read_secret(str(tmp_path / "absent"))
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "empty").chmod(0o600)
    with pytest.raises(ConfigError, match=r"mesos\.secret_file: .* is empty"):
        read_secret(str(tmp_path / "empty"))
    shared = tmp_path / "shared"
    shared.write_text(SECRET + "\n")
    shared.chmod(0o644)
    with pytest.raises(ConfigError, match=r"mesos\.secret_file: .* readable or writable by others \(mode 0644\)"):
        read_secret(str(shared))
    shared.chmod(0o600)
    assert read_secret(str(shared)) == SECRET


@pytest.mark.parametrize("keys", [{"principal": PRINCIPAL}, {"secret_file": "/etc/cosched/mesos.secret"}])
def test_a_principal_needs_a_secret_file_and_the_other_way_round(keys: dict[str, str]) -> None:
    document = {"backend": {"kind": "mesos"}, "mesos": {"masters": "m1:5050", **keys}}
    with pytest.raises(ConfigError, match=r"mesos\.principal and mesos\.secret_file: give both"):
        validate(from_dict(document))
