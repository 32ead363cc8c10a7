"""Jobs that wait for other jobs' ends (`cosched submit --dependency`, sbatch's): the rule, the
text form, and the daemon on the real engine: chains, cascades, workflows, holds, a restart."""

from __future__ import annotations

import argparse
import itertools
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, require_engine, wait_until
from hypothesis import given
from hypothesis import strategies as st

from cosched.daemon.client import ApiError
from cosched.daemon.dependencies import describe, judge, parse, verdict
from workloads.images import busybox_image

KINDS = ("afterok", "afternotok", "afterany")


@pytest.mark.parametrize(
    ("kind", "state", "expected"),
    [
        *[(kind, state, "waiting") for kind in KINDS for state in ("pending", "launching", "running")],
        ("afterok", "done", "met"),
        ("afterok", "failed", "never"),
        ("afterok", "cancelled", "never"),
        ("afternotok", "done", "never"),
        ("afternotok", "failed", "met"),
        ("afternotok", "cancelled", "met"),
        *[("afterany", state, "met") for state in ("done", "failed", "cancelled")],
        *[(kind, None, "never") for kind in KINDS],
        ("singleton", "running", "waiting"),
        ("singleton", "done", "met"),
    ],
)
def test_the_rule_as_sbatch_states_it(kind: str, state: str | None, expected: str) -> None:
    assert verdict(kind, state) == expected


def test_all_are_needed_and_one_that_never_can_be_met_says_which() -> None:
    after = [{"kind": "afterok", "job": 1}, {"kind": "afterany", "workflow": 2}]
    assert judge(after, {("job", 1): "done", ("workflow", 2): "running"}) == ("waiting", "")
    assert judge(after, {("job", 1): "done", ("workflow", 2): "failed"}) == ("met", "")
    assert judge(after, {("job", 1): "cancelled", ("workflow", 2): "running"}) == (
        "never",
        "afterok on job 1, which was cancelled",
    )
    assert judge(after, {("job", 1): "done"})[1] == (
        "afterany on workflow 2, which is not in the state file (never submitted, or purged)"
    )


targets = st.tuples(st.sampled_from((*KINDS, "singleton")), st.booleans(), st.integers(1, 10**12))


@given(st.lists(targets, min_size=1, max_size=8))
def test_the_text_form_reads_back_what_it_writes(items: list[tuple[str, bool, int]]) -> None:
    after = [
        {"kind": kind} if kind == "singleton" else {"kind": kind, ("workflow" if workflow else "job"): number}
        for kind, workflow, number in items
    ]
    assert parse(describe(after)) == after


@pytest.mark.parametrize("text", ["afterok", "after:1", "afterok:x", "afterok:0", "afterok:1,", "afterok:w"])
def test_bad_text_is_one_line_naming_it(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        parse(text)
    assert "\n" not in str(caught.value) and repr(text.split(",")[-1]) in str(caught.value)


# -- the daemon on the real engine -----------------------------------------------------------------------


def test_chains_cascades_and_refusals(tmp_path: Path) -> None:
    """On 2 cores: b waits for a (afterok) and starts only after a ended; c fails, so d (afterok:c)
    is cancelled with Slurm's reason, and so is e (afterok:d), while f (afternotok:c) and g
    (afterany:c) run. A submission whose dependency already can never be met is refused."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon = DaemonProcess(tmp_path, cores=2)
    daemon.start()

    def job(command: str, *after: str) -> int:
        spec = {"image": image, "command": ["sh", "-c", command], "cores": 1, "walltime": 60}
        return daemon.submit(**spec, **({"after": parse(",".join(after))} if after else {}))

    try:
        a = job("sleep 3")
        b = job("true", f"afterok:{a}")
        c = job("exit 3")
        d = job("true", f"afterok:{c}")
        e = job("true", f"afterok:{d}")
        f = job("true", f"afternotok:{c}")
        g = job("true", f"afterany:{c}")
        time.sleep(1)
        assert daemon.job(b)["state"] == "pending" and daemon.job(b)["reason"] == "Dependency"
        assert f"{b:>6}" in daemon.cli("queue") and "Dependency" in daemon.cli("queue")
        assert f"after: afterok:{a}" in daemon.cli("status", str(b))
        # b at least; gauges are set when a pass ends, and a pass waits on its launches (a's, c's)
        wait_until(lambda: _waiting_gauge(daemon) >= 1, 30, "cosched_jobs_waiting_dependency >= 1")
        ended = daemon.wait_final([a, b, c, d, e, f, g], 60)
        assert [ended[i]["state"] for i in (a, b, c, d, e, f, g)] == [
            "done",
            "done",
            "failed",
            "cancelled",
            "cancelled",
            "done",
            "done",
        ]
        assert ended[b]["start"] >= ended[a]["end"]
        assert ended[d]["reason"] == f"DependencyNeverSatisfied: afterok on job {c}, which failed"
        assert ended[e]["reason"] == f"DependencyNeverSatisfied: afterok on job {d}, which was cancelled"
        assert ended[d]["start"] is None and ended[e]["start"] is None
        for after, why in ((f"afterok:{c}", f"afterok on job {c}, which failed"), ("afterany:99999", "job 99999")):
            with pytest.raises(ApiError) as refused:
                job("true", after)
            assert "(HTTP 422)" in str(refused.value) and why in str(refused.value)
    finally:
        daemon.cleanup(engine)


def test_a_workflow_a_hold_and_a_restart(tmp_path: Path) -> None:
    """A job waits for a whole workflow (afterok:wN): it starts once every stage succeeded. Another
    waits (afterany) for a long job; held by its user meanwhile, released before the long job ends,
    it still waits; the daemon is SIGKILLed and started again: still waiting. Once the long job is
    cancelled, the user's second hold keeps it pending (JobHeldUser); released, it runs."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon = DaemonProcess(tmp_path, cores=2)
    daemon.start()
    base = {"image": image, "cores": 1, "walltime": 60}
    try:
        flow = daemon.client.call(
            "POST",
            "/v1/workflows",
            {**base, "name": "two", "command": ["sleep", "1"], "stages": [{"name": "x"}, {"name": "y"}]},
        )
        after_flow = daemon.submit(**base, command=["true"], after=parse(f"afterok:w{flow['id']}"))
        long = daemon.submit(**base, command=["sleep", "600"])
        waiter = daemon.submit(**base, command=["true"], after=parse(f"afterany:{long}"))
        stages = daemon.wait_final(flow["jobs"], 30)
        ended = daemon.wait_final([after_flow], 30)[after_flow]
        assert ended["state"] == "done" and ended["start"] >= max(s["end"] for s in stages.values())

        daemon.cli("hold", str(waiter))
        daemon.cli("release", str(waiter))
        time.sleep(1)  # released by its user, it waits on for its dependency
        assert daemon.job(waiter)["reason"] == "Dependency"
        daemon.signal(signal.SIGKILL)
        daemon.start()
        time.sleep(1)
        assert daemon.job(waiter)["state"] == "pending" and "Dependency" in daemon.cli("queue")
        daemon.cli("hold", str(waiter))
        daemon.client.call("DELETE", f"/v1/jobs/{long}")
        daemon.wait_final([long], 30)
        time.sleep(1.5)  # passes every 0.2 s: the dependency is met, the hold is not
        assert daemon.job(waiter)["state"] == "pending" and daemon.job(waiter)["reason"] == "JobHeldUser"
        daemon.cli("release", str(waiter))
        assert daemon.wait_final([waiter], 30)[waiter]["state"] == "done"
    finally:
        daemon.cleanup(engine)


def test_singleton_jobs_of_one_name_run_one_after_another(tmp_path: Path) -> None:
    """`--dependency singleton` on 2 cores: three jobs named `step` run one at a time, in the order
    they were submitted, while a singleton of another name runs beside the first."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon = DaemonProcess(tmp_path, cores=2)
    daemon.start()
    try:
        spec = {"image": image, "command": ["sleep", "1"], "cores": 1, "walltime": 60, "after": parse("singleton")}
        steps = [daemon.submit(**spec, name="step") for _ in range(3)]
        other = daemon.submit(**spec, name="other")
        ended = daemon.wait_final([*steps, other], 60)
    finally:
        daemon.cleanup(engine)
    assert {job["state"] for job in ended.values()} == {"done"}
    for before, after in itertools.pairwise(steps):
        assert ended[after]["start"] >= ended[before]["end"] - 0.5, ended
    assert ended[other]["start"] < ended[steps[0]]["end"]


def _waiting_gauge(daemon: DaemonProcess) -> float:
    with urllib.request.urlopen(daemon.client.url + "/metrics", timeout=10) as answer:
        lines = answer.read().decode().splitlines()
    [gauge] = [line for line in lines if line.startswith("cosched_jobs_waiting_dependency ")]
    return float(gauge.split()[1])
