"""The rules that tell a run ended by its job from one lost to its machines (pure, no cluster).

The status updates below are shaped as the real master and agents send them (seen in
tests/test_daemon_mesos_faults.py): an executor's own end carries data, a killed executor's
task comes back TASK_FAILED from SOURCE_AGENT, a removed agent's as TASK_LOST from the master.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from cosched.mesos.runs import RECONCILED_GRACE, Run, Task, new_handle, parse_task, part_id


def status(state: str, source: str = "SOURCE_EXECUTOR", reason: str = "", **data: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"state": state, "source": source}
    if reason:
        body["reason"] = reason
    if data:
        body["data"] = base64.b64encode(json.dumps(data).encode()).decode()
    return body


def gang(parts: int = 2) -> Run:
    handle = new_handle(7, 1)
    run = Run(handle, 7, parts)
    for part in range(parts):
        run.tasks[part] = Task(part_id(handle, part, parts, 1), 7, f"A{part + 1}", 1)
    return run


def test_task_ids_name_their_run_part_and_cores() -> None:
    handle = new_handle(42, 3)
    name = parse_task(part_id(handle, 1, 3, 4))
    assert name is not None and (name.job_id, name.handle, name.part, name.parts, name.cores) == (42, handle, 1, 3, 4)
    assert name.run == 3
    before = parse_task("cosched-job-42-0123abcd-0of1-4c")  # a task of a daemon from before runs were numbered
    assert before is not None and (before.handle, before.run) == ("cosched-job-42-0123abcd", None)
    assert parse_task("cosched-sweep-abc") is None and parse_task("cosched-job-x") is None


@pytest.mark.parametrize(
    ("update", "agent_gone", "outcome"),
    [
        (status("TASK_RUNNING"), False, "live"),
        (status("TASK_FINISHED", exit_code=0), False, "ended"),
        (status("TASK_FAILED", exit_code=3), False, "ended"),  # the job's own failure
        (status("TASK_FAILED"), False, "ended"),  # "could not start": its image, its command
        (status("TASK_KILLED"), False, "lost"),  # our executor removed its container on its way out
        (status("TASK_KILLED", exit_code=137, asked=True), False, "ended"),  # a kill asked before a restart
        (status("TASK_FAILED", "SOURCE_AGENT", "REASON_EXECUTOR_TERMINATED"), False, "sweep"),
        (status("TASK_FAILED", "SOURCE_AGENT", "REASON_EXECUTOR_TERMINATED"), True, "lost"),
        (status("TASK_LOST", "SOURCE_MASTER", "REASON_AGENT_REMOVED"), True, "lost"),
        (status("TASK_ERROR", "SOURCE_MASTER"), False, "ended"),  # the master refused the task itself
    ],
)
def test_what_ended_a_task(update: dict[str, Any], agent_gone: bool, outcome: str) -> None:
    task = Task("t", 7, "A1", 1)
    task.apply(update, now=0.0)
    assert task.outcome(agent_gone, now=0.0) == outcome


def test_our_kill_is_an_end_and_a_sweep_makes_a_killed_executors_task_lost() -> None:
    killed = Task("t", 7, "A1", 1, killed=True)
    killed.apply(status("TASK_KILLED", exit_code=137), now=0.0)
    assert killed.outcome(False, 0.0) == "ended"
    orphan = Task("t", 7, "A1", 1)
    orphan.apply(status("TASK_FAILED", "SOURCE_AGENT", "REASON_EXECUTOR_TERMINATED"), now=0.0)
    orphan.swept = True
    assert orphan.outcome(False, 0.0) == "lost"


def test_a_killed_executors_container_the_sweep_found_ended_on_its_own_is_the_jobs_end() -> None:
    """Its executor SIGKILLed after its job finished, but before it collected the container: the
    run counted as lost and the job ran again (a crash audit). The sweep found the container ended:
    the job's end, as its exit code says; the agent's resent TASK_FAILED changes nothing of it."""
    run = gang()
    for task in run.tasks.values():
        task.apply(status("TASK_RUNNING", started=5.0), 0.0)
    executor_died = status("TASK_FAILED", "SOURCE_AGENT", "REASON_EXECUTOR_TERMINATED")
    run.tasks[0].apply(executor_died, 1.0)
    run.tasks[0].swept = True
    run.tasks[0].found_ended({"exit_code": 0, "finished": 9.0, "oom": False, "log_tail": "ok", "cpu_seconds": 2.0})
    run.tasks[0].apply(executor_died, 11.0)  # resent by the agent until acknowledged
    assert run.tasks[0].outcome(False, 11.0) == "ended"
    assert run.state(lambda agent: False, 11.0, {}).state == "running"  # its other part runs on: not broken
    run.tasks[1].apply(status("TASK_FINISHED", exit_code=0, finished=10.0), 12.0)
    assert run.state(lambda agent: False, 12.0, {}).state == "exited"
    assert run.exit() == (0, 5.0, 10.0, False, 2.0)
    failed = Task("t", 7, "A1", 1)
    failed.apply(executor_died, 0.0)
    failed.found_ended({"exit_code": 137, "finished": 9.0, "oom": True, "log_tail": "", "cpu_seconds": None})
    assert (failed.state, failed.message, failed.outcome(False, 0.0)) == ("TASK_FAILED", "out of memory", "ended")


def test_a_terminal_state_from_reconciliation_waits_for_the_agents_own_update() -> None:
    task = Task("t", 7, "A1", 1)
    task.apply(status("TASK_FAILED", "SOURCE_MASTER", "REASON_RECONCILIATION"), now=100.0)
    assert task.outcome(False, now=100.0 + RECONCILED_GRACE - 1) == "live"
    assert task.outcome(False, now=100.0 + RECONCILED_GRACE) == "ended"
    task.apply(status("TASK_FAILED", exit_code=3, log_tail="boom"), now=101.0)  # the agent's own, resent
    assert task.outcome(False, now=101.0) == "ended" and task.data["exit_code"] == 3
    # A later summary of the same end changes nothing.
    task.apply(status("TASK_FAILED", "SOURCE_MASTER", "REASON_RECONCILIATION"), now=102.0)
    assert task.reconciled is None and task.source == "SOURCE_EXECUTOR"
    lost = Task("t", 7, "A1", 1)
    lost.apply(status("TASK_LOST", "SOURCE_MASTER", "REASON_RECONCILIATION"), now=0.0)
    assert lost.outcome(True, now=0.0) == "lost"


def test_a_gang_with_a_failed_part_kills_the_rest_and_ends_as_that_part() -> None:
    run = gang()
    run.tasks[0].apply(status("TASK_RUNNING"), 0.0)
    run.tasks[1].apply(status("TASK_FAILED", exit_code=3, log_tail="boom"), 0.0)
    state = run.state(lambda agent: False, 0.0, {})
    assert (state.state, state.kill) == ("running", [run.tasks[0]])
    run.tasks[0].killed = True
    run.tasks[0].apply(status("TASK_KILLED", exit_code=137), 0.0)
    assert run.state(lambda agent: False, 0.0, {}).state == "exited"
    assert run.exit()[0] == 3 and "[part 1] boom" in run.logs()
    assert run.exit()[4] is None  # no executor sampled either part


def test_the_cpu_a_gang_used_is_the_sum_of_what_its_executors_last_sampled() -> None:
    run = gang(3)
    run.tasks[0].apply(status("TASK_FINISHED", exit_code=0, cpu_seconds=12.5), 0.0)
    run.tasks[1].apply(status("TASK_FINISHED", exit_code=0, cpu_seconds=7.5), 0.0)
    run.tasks[2].apply(status("TASK_FINISHED", exit_code=0, cpu_seconds=None), 0.0)  # ended before a sample
    assert run.exit() == (0, 0.0, 0.0, False, 20.0)


def test_a_gang_with_a_lost_part_is_lost_after_its_sweep() -> None:
    run = gang()
    run.tasks[0].apply(status("TASK_RUNNING"), 0.0)
    run.tasks[1].apply(status("TASK_FAILED", "SOURCE_AGENT", "REASON_EXECUTOR_TERMINATED"), 0.0)
    assert run.state(lambda agent: False, 0.0, {}).kill == [run.tasks[0]]
    run.tasks[0].killed = True
    run.tasks[0].apply(status("TASK_KILLED", exit_code=137), 0.0)
    waiting = run.state(lambda agent: False, 0.0, {})
    assert (waiting.state, waiting.sweep) == ("running", [run.tasks[1]])
    run.tasks[1].swept = True
    lost = run.state(lambda agent: False, 0.0, {"A2": "agent2"})
    assert lost.state == "lost" and lost.note.startswith("TASK_FAILED on agent2")


def test_a_lost_agents_run_waits_for_its_executors_fence_and_lives_on_if_the_agent_returns() -> None:
    """A frozen or cut-off agent is lost to the master while its executor and container run on:
    counted lost at once, the job ran twice (a helper's run: 20 s of two copies). The run waits
    `fence_wait` (its executor stops the job after `fence`), and is live again if the agent comes
    back meanwhile (the master re-sends TASK_RUNNING)."""
    run = gang(1)
    task = run.tasks[0]
    task.apply(status("TASK_RUNNING"), 0.0)
    task.apply(status("TASK_LOST", "SOURCE_MASTER", "REASON_AGENT_REMOVED"), 100.0)
    assert task.outcome(True, now=129.0, fence_wait=30.0) == "fence"
    waiting = run.state(lambda agent: True, 129.0, {"A1": "agent1"}, fence_wait=30.0)
    assert (waiting.state, waiting.sweep) == ("running", [])
    assert waiting.note == "agent agent1 lost: waiting for its executor to stop the job"
    assert run.state(lambda agent: True, 130.0, {}, fence_wait=30.0).state == "lost"
    task.apply(status("TASK_LOST", "SOURCE_MASTER", "REASON_RECONCILIATION"), 125.0)  # a later word: same loss
    assert task.outcome(True, now=130.0, fence_wait=30.0) == "lost"
    task.apply(status("TASK_RUNNING", "SOURCE_MASTER"), 131.0)  # the agent is back: the run goes on
    assert run.state(lambda agent: False, 131.0, {}, fence_wait=30.0).state == "running"
    # the executor's own fence reports the loss: lost at once, not the job's end
    task.apply(status("TASK_LOST", message="stopped: no answer from agent"), 140.0)
    assert task.outcome(False, now=140.0, fence_wait=30.0) == "lost"


def test_a_part_that_failed_while_starting_but_may_still_run_is_settled_before_the_run_is_given_up() -> None:
    """A launch gave up at a part's first failure and the job was queued again at once. Its agent cut
    off (lost to the master, not dead) or its executor killed after it started the container, that
    part's copy ran on beside the next run. Now the start waits for the fence, or for a sweep."""
    run = gang(2)
    run.tasks[0].apply(status("TASK_RUNNING"), 0.0)
    assert run.start_failure(lambda task: "live") is None  # part 1 still staging
    # its executor killed on a live agent: settled by a sweep of the agent, then lost
    run.tasks[1].apply(status("TASK_FAILED", "SOURCE_AGENT", "REASON_EXECUTOR_TERMINATED"), 1.0)
    failure = run.start_failure(lambda task: task.outcome(False, 1.0, 31.0))
    assert failure is not None and (failure.verdict, failure.settling) == ("settling", (run.tasks[1],))
    run.tasks[1].swept = True
    failure = run.start_failure(lambda task: task.outcome(False, 2.0, 31.0))
    assert failure is not None and failure.verdict == "lost" and failure.why.startswith("TASK_FAILED")
    # its agent lost to the master: settled once the executor's fence has passed
    run = gang(1)
    run.tasks[0].apply(status("TASK_LOST", "SOURCE_MASTER", "REASON_AGENT_REMOVED"), 100.0)
    assert run.start_failure(lambda task: task.outcome(True, 130.0, 31.0)).verdict == "settling"  # type: ignore[union-attr]
    assert run.start_failure(lambda task: task.outcome(True, 131.0, 31.0)).verdict == "lost"  # type: ignore[union-attr]
    # the executor's own word: lost (its engine is gone) or the job's own failure (refused), at once;
    # and a task the agent dropped never reached an executor: lost at once too
    for state, source, verdict in (
        ("TASK_LOST", "SOURCE_EXECUTOR", "lost"),
        ("TASK_FAILED", "SOURCE_EXECUTOR", "refused"),
        ("TASK_DROPPED", "SOURCE_AGENT", "lost"),
    ):
        run = gang(1)
        run.tasks[0].apply(status(state, source), 0.0)
        assert run.start_failure(lambda task: task.outcome(False, 0.0, 31.0)).verdict == verdict  # type: ignore[union-attr]


def test_a_gang_whose_part_the_master_never_heard_of_is_lost() -> None:
    run = gang(3)
    del run.tasks[2]  # a restarted daemon rebuilt the run from reconciliation: two of three parts
    for task in run.tasks.values():
        task.apply(status("TASK_RUNNING"), 0.0)
    assert len(run.state(lambda agent: False, 0.0, {}).kill) == 2
    for task in run.tasks.values():
        task.killed = True
        task.apply(status("TASK_KILLED", exit_code=137), 0.0)
    assert run.state(lambda agent: False, 0.0, {}) == ("lost", "a part was never launched", [], [])


def test_a_gang_none_of_whose_parts_started_is_created_and_one_whole_is_told_to_start() -> None:
    """Parts are held (TASK_STARTING) until every one is: the daemon that died between two agents'
    ACCEPTs left part 0 alone, and it ran (a crash audit). A restarted daemon finds a gang with a
    part never launched `created`, which recovery removes and queues again: nothing of it ran. One
    whose parts are all there is adopted (`running`), and its held parts told to start."""
    run = gang(3)
    del run.tasks[2]  # its ACCEPT never sent
    run.tasks[0].apply(status("TASK_STARTING"), 0.0)
    assert run.state(lambda agent: False, 0.0, {}).state == "created" and run.to_start() == []
    run.tasks[2] = Task(part_id(run.handle, 2, 3, 1), 7, "A3", 1)  # launched: staging, not yet held
    assert run.state(lambda agent: False, 0.0, {}).state == "running" and run.to_start() == []
    run.tasks[1].apply(status("TASK_STARTING"), 0.0)
    run.tasks[2].apply(status("TASK_STARTING"), 0.0)
    assert run.to_start() == list(run.tasks.values())  # whole: every part told
    run.tasks[0].apply(status("TASK_RUNNING"), 0.0)  # one started: the others still told
    assert run.state(lambda agent: False, 0.0, {}).state == "running"
    run.tasks[0].apply(status("TASK_FINISHED", exit_code=0), 0.0)  # even once it ended
    assert run.to_start() == [run.tasks[1], run.tasks[2]]
    run.tasks[1].killed = True  # being given up: none is told
    assert run.to_start() == []


def test_a_held_part_that_ended_unstarted_leaves_its_gang_created_and_a_single_task_is_never_held() -> None:
    run = gang()
    run.tasks[0].apply(status("TASK_STARTING"), 0.0)
    run.tasks[1].apply(status("TASK_LOST", withheld=True), 0.0)  # never told to start in time
    assert run.state(lambda agent: False, 0.0, {}).state == "created"
    run.tasks[1].data.pop("withheld")  # lost otherwise (its agent gone): not known never to have run
    assert run.state(lambda agent: False, 0.0, {}).state == "running"
    expected = gang()  # a gang the state file records running, unanswered after a failover: staging
    assert expected.state(lambda agent: False, 0.0, {}).state == "running"  # adopted, never killed
    single = Run(new_handle(8, 1), 8, 1, {0: Task(part_id(new_handle(8, 1), 0, 1, 1), 8, "A1", 1)})
    assert single.state(lambda agent: False, 0.0, {}).state == "running"  # staging: adopted, as before


def test_usage_of_a_gang_weighs_parts_by_their_cores_and_is_none_until_sampled_under_its_quota() -> None:
    run = gang()
    run.tasks[1].cores = 3
    run.tasks[0].usage = {"cpu": 1.0, "mem": 0.2, "done": 1, "total": 2, "quota": 0.5}
    assert run.usage(2.0) is None, "not before every part reported"
    run.tasks[1].usage = {"cpu": 0.0, "mem": 0.5, "done": 0, "total": 2, "quota": 1.5}
    assert run.usage(2.0) == (0.25, 0.5, 1, 4)
    # The job's quota changed since the parts were sampled: their samples are of another job.
    assert run.usage(1.0) is None
    run.tasks[0].usage = {"cpu": 0.6, "mem": 0.2, "done": 1, "total": 2, "quota": 0.25}
    assert run.usage(1.0) is None, "not before every part was sampled under its new share"
    run.tasks[1].usage = {"cpu": 1.0, "mem": 0.5, "done": 1, "total": 2, "quota": 0.75}
    assert run.usage(1.0) == (0.9, 0.5, 2, 4)
    assert run.share(run.tasks[1]) == 0.75
