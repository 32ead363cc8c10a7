"""The operator's daemon commands as a person reads them (cosched/daemon/commands.py).

The API answers are real shapes (as `views.job_status` and the DELETE endpoint return
them); the HTTP hop is replaced by a recording client so that each test pins what is
printed and the exit status, which is what a script or an operator acts on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from cosched.cli import main
from cosched.daemon import commands
from cosched.daemon.client import ApiError
from tests.test_cli import assert_one_error


class Answers:
    """A client that answers each (method, path) from a table and records the calls."""

    def __init__(self, table: dict[tuple[str, str], Any]) -> None:
        self.table, self.calls = table, []

    def call(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append((method, path))
        return self.table[(method, path)]

    def submit(self, path: str, body: Any) -> Any:
        return self.call("POST", path, body)


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], answers: Answers, *argv: str):
    monkeypatch.setattr(commands, "_client", lambda args: answers)
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cancel_of_a_finished_job_is_an_error(monkeypatch, capsys) -> None:
    answers = Answers({("DELETE", "/v1/jobs/3"): {"id": 3, "state": "done"}})
    rc, out, err = run(monkeypatch, capsys, answers, "cancel", "3")
    assert rc == 1
    assert out == ""
    assert err.strip() == "cosched: error: job 3 already done; nothing to cancel"


def test_cancel_of_a_running_job_and_a_finished_one(monkeypatch, capsys) -> None:
    answers = Answers(
        {
            ("DELETE", "/v1/jobs/1"): {"id": 1, "state": "running"},
            ("DELETE", "/v1/jobs/2"): {"id": 2, "state": "failed"},
        }
    )
    rc, out, err = run(monkeypatch, capsys, answers, "cancel", "1", "2")
    assert rc == 1  # one of them could not be cancelled
    assert out.strip() == "job 1: was running, cancel requested"
    assert "job 2 already failed" in err
    assert answers.calls == [("DELETE", "/v1/jobs/1"), ("DELETE", "/v1/jobs/2")]


class _Refusing(Answers):
    """Answers, where a missing (method, path) is the daemon's 404."""

    def call(self, method: str, path: str, body: Any = None) -> Any:
        if (method, path) not in self.table:
            self.calls.append((method, path))
            raise ApiError(f"job {path.rsplit('/', 1)[-1]}: no such job (HTTP 404)")
        return super().call(method, path, body)


def test_cancel_goes_on_past_a_refused_id(monkeypatch, capsys) -> None:
    """As scancel: a mistyped id is an error (exit 1), and the jobs after it are still cancelled
    (`cosched cancel 99999 71` left 71 queued)."""
    answers = _Refusing({("DELETE", "/v1/jobs/71"): {"id": 71, "state": "pending"}})
    rc, out, err = run(monkeypatch, capsys, answers, "cancel", "99999", "71")
    assert rc == 1
    assert err.strip() == "cosched: error: job 99999: no such job (HTTP 404)"
    assert out.strip() == "job 71: was pending, cancel requested"
    assert answers.calls == [("DELETE", "/v1/jobs/99999"), ("DELETE", "/v1/jobs/71")]


def test_status_prints_units_not_reprs(monkeypatch, capsys) -> None:
    status = {
        "id": 7,
        "name": "blast.blastn",
        "state": "running",
        "reason": None,
        "image": "cosched/workflows:abc",
        "command": ["python3", "-m", "workloads.stages", "blast", "blastn", "--dir", "/srv/a b"],
        "cores": 2,
        "cpus": [0, 1],
        "quota": 1.5,
        "host": None,
        "walltime": 600.0,
        "memory_mib": 2048,
        "app_class": "blast.blastn",
        "workflow": 2,
        "stage": "blastn",
        "exit_code": None,
        "runtime": None,
        "usage": {"cpu": 0.8712, "mem": 0.0391, "tasks_done": 3, "tasks": 8},
        "submit": 1.0,
        "start": 2.0,
        "end": None,
        "log_tail": "",
    }
    rc, out, _ = run(monkeypatch, capsys, Answers({("GET", "/v1/jobs/7"): status}), "status", "7")
    assert rc == 0
    lines = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in out.splitlines()}
    assert lines["command"] == "python3 -m workloads.stages blast blastn --dir '/srv/a b'"
    assert lines["cpus"] == "0-1"
    assert lines["quota"] == "1.5 CPUs"
    assert lines["walltime"] == "600 s"
    assert lines["memory"] == "2048 MiB"
    assert lines["usage"] == "CPU 87% of its quota, memory 4% of its limit, tasks 3/8"
    assert "{" not in out and "0.8712" not in out  # no Python dict, no raw floats
    assert lines["end"] == "N/A"
    # Once it ended: the CPU its cgroup counted beside the core-seconds it held (seff's two numbers).
    ended = {**status, "state": "done", "runtime": 100.0, "cpu_seconds": 50.0, "usage": None, "end": 102.0}
    rc, out, _ = run(monkeypatch, capsys, Answers({("GET", "/v1/jobs/7"): ended}), "status", "7")
    lines = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in out.splitlines()}
    assert lines["cpu used"] == "50.0 s of 200.0 core-seconds held"
    # Its quota changes, which daemon.md promises `status` shows (they were in --json only).
    changes = [{"seq": n, "at": 10.0 + n, "job_id": 7, "cpus": 2.0 - n % 2, "applied": 10.5 + n} for n in range(12)]
    changes[-1]["applied"] = None
    answer = {**ended, "quota_changes": changes}
    rc, out, _ = run(monkeypatch, capsys, Answers({("GET", "/v1/jobs/7"): answer}), "status", "7")
    shown = out.split("  quota changes:", 1)[1].splitlines()
    assert shown[0] == " (the last 10; 2 earlier)" and len(shown) == 11, shown
    assert shown[-1].endswith("1 CPUs, not applied") and ", applied " in shown[-2]


def test_submit_help_states_the_defaults(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["submit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 1)" in text and "(default: 3600.0)" in text
    assert "default_memory_per_core per core, 1024 unless set" in text
    assert "share of a node" not in text


def test_non_utf8_workflow_file_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "wf.toml"
    path.write_bytes(b'[workflow]\nname = "caf\xe9"\n')
    rc = main(["submit", "--workflow", str(path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip() == f"cosched: error: {path}: not UTF-8 text (byte 22); TOML files are UTF-8"
    assert "Traceback" not in err


WORKFLOW = '[workflow]\nname = "w"\nimage = "x"\ncores = 1\nwalltime = 30\n[[stage]]\nname = "a"\ncommand = ["true"]\n'


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--begin", "+3600"], "not --begin:"),  # was submitted to start at once
        (["--array", "0-3%2", "--cores", "2"], "not --cores, --array:"),  # one workflow, not an array
        (["--", "echo", "hi"], "not a command:"),
    ],
)
def test_job_options_beside_a_workflow_file_are_refused_not_dropped(
    monkeypatch, capsys, tmp_path: Path, options: list[str], named: str
) -> None:
    path = tmp_path / "wf.toml"
    path.write_text(WORKFLOW)
    answers = Answers({("POST", "/v1/workflows"): {"id": 1, "jobs": [1]}})
    rc, _, err = run(monkeypatch, capsys, answers, "submit", "--workflow", str(path), *options)
    assert_one_error(rc, err, named, "[workflow]")
    assert answers.calls == []  # nothing submitted
    # what does apply to a workflow still goes through, and the defaults are no option given
    rc, out, _ = run(monkeypatch, capsys, answers, "submit", "--workflow", str(path), "--no-cosched")
    assert (rc, out.strip()) == (0, "Submitted workflow 1 (first jobs [1])")


def test_a_jobs_own_words_never_reach_the_terminal_raw(monkeypatch, capsys) -> None:
    """A hostile job's log tail, command and the reason quoting it may hold escape sequences (here:
    retitle the terminal, write its clipboard, clear the screen) and a right-to-left override: the
    commands print them as visible escapes; `--json` prints the API's JSON, which escapes them."""
    from cosched.daemon.client import Client

    hostile = "\x1b]0;owned\x07\x1b]52;c;ZWNobyBvd25lZA==\x07\x1b[2J\u202eexe.txt"
    status = {
        "id": 7,
        "name": "job",
        "user": "mallory",
        "state": "failed",
        "reason": f"could not start: exec: {hostile!s}: not found",
        "image": "cosched/busybox:1",
        "command": ["sh", "-c", hostile],
        "cores": 1,
        "walltime": 60.0,
        "exit_code": 1,
        "submit": 1.0,
        "start": 2.0,
        "end": 3.0,
        "log_tail": f"line one\n{hostile}\n\tindented",
    }
    monkeypatch.setattr(Client, "call", lambda self, method, path, body=None, headers=None: status)
    assert main(["status", "7"]) == 0
    out = capsys.readouterr().out
    assert not any(char in out for char in "\x1b\x07\u202e")
    assert out.count("\\x1b]0;owned\\x07\\x1b]52;c;ZWNobyBvd25lZA==\\x07\\x1b[2J\\u202eexe.txt") == 3
    assert "    line one\n" in out and "\tindented" in out  # newlines and tabs are the log's own layout
    assert main(["status", "7", "--json"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and json.loads(out)["log_tail"] == status["log_tail"]


def test_queue_shows_each_jobs_user_and_filters_by_one(monkeypatch, capsys) -> None:
    row = {"cores": 1, "quota": None, "start": None, "reason": "Priority", "state": "pending"}
    rows = [{**row, "id": 1, "name": "a", "user": "alice"}, {**row, "id": 2, "name": "b", "user": ""}]
    answers = Answers({("GET", "/v1/queue"): rows})
    rc, out, _ = run(monkeypatch, capsys, answers, "queue")
    assert rc == 0
    header, _, first, second = out.splitlines()
    assert header.split()[:4] == ["JOBID", "NAME", "USER", "STATE"]
    assert first.split()[:3] == ["1", "a", "alice"]
    assert second.split()[:3] == ["2", "b", "-"]  # no user: submitted with the shared token or none
    rc, out, _ = run(monkeypatch, capsys, answers, "queue", "-u", "alice", "--json")
    assert [r["id"] for r in json.loads(out)] == [1]


def test_cancel_of_every_job_of_a_user(monkeypatch, capsys) -> None:
    row = {"cores": 1, "quota": None, "start": None, "reason": "Priority", "state": "pending"}
    answers = Answers(
        {
            ("GET", "/v1/queue"): [{**row, "id": 4, "user": "alice"}, {**row, "id": 5, "user": "bob"}],
            ("DELETE", "/v1/jobs/4"): {"id": 4, "state": "pending"},
        }
    )
    rc, out, _ = run(monkeypatch, capsys, answers, "cancel", "-u", "alice")
    assert (rc, out.strip()) == (0, "job 4: was pending, cancel requested")
    assert answers.calls == [("GET", "/v1/queue"), ("DELETE", "/v1/jobs/4")]
    rc, _, err = run(monkeypatch, capsys, answers, "cancel")
    assert rc == 2 and err.strip() == "cosched: error: cancel needs job ids, --user USER or --workflow ID"


def test_cancel_of_a_workflow_cancels_its_stages_that_run_or_wait(monkeypatch, capsys) -> None:
    stages = {
        "a": {"state": "done", "job": 1},
        "b": {"state": "running", "job": 2},
        "c": {"state": "pending", "job": 3},
        "d": {"state": "waiting", "job": None},
    }
    answers = Answers(
        {
            ("GET", "/v1/workflows/9"): {"id": 9, "stages": stages},
            ("DELETE", "/v1/jobs/2"): {"id": 2, "state": "running"},
            ("DELETE", "/v1/jobs/3"): {"id": 3, "state": "pending"},
        }
    )
    rc, out, _ = run(monkeypatch, capsys, answers, "cancel", "--workflow", "9")
    assert rc == 0
    assert out.splitlines() == ["job 2: was running, cancel requested", "job 3: was pending, cancel requested"]


ODD_ANSWERS = [{"odd": 1}, [1, 2], "text", None, 7, [{"id": "x"}], {"id": 1, "state": 5, "start": "x", "walltime": "y"}]
CLIENT_COMMANDS = [
    ["submit", "--image", "x", "true"],
    ["queue"],
    ["queue", "--user", "a"],
    ["history"],
    ["history", "--by", "user"],
    ["status", "1"],
    ["cancel", "1"],
    ["cancel", "--user", "bob"],
    ["hold", "1"],
    ["release", "1"],
    ["logs", "1"],
    ["requeue", "1"],
    ["update", "1", "--walltime", "5"],
    ["nodes"],
    ["shares"],
    ["drain", "0", "--reason", "x"],
    ["resume", "0"],
    ["explain", "1", "--url", "http://127.0.0.1:1"],
]


@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=repr)
def test_an_answer_of_another_shape_is_one_line(monkeypatch, capsys, answer: Any) -> None:
    """A daemon of another version (or another service answering JSON) answers every command
    with a shape this client does not read: each command ends in one line, never a traceback."""
    for argv in CLIENT_COMMANDS:
        rc, _, err = run(monkeypatch, capsys, Answers(_Every(answer)), *argv)
        if rc == 0:  # an answer a command can take as it is (an empty list, a number as an id)
            assert "Traceback" not in err, (argv, err)
            continue
        if rc == 1:  # read, and said to be a refusal (`cancel` of a job in a state it names)
            assert len(err.splitlines()) == 1, (argv, err)
            continue
        assert_one_error(rc, err, "cannot read the daemon's answer")


class _Every(dict):
    """The same answer to every (method, path)."""

    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer = answer

    def __missing__(self, key: tuple[str, str]) -> Any:
        return self.answer


def test_a_history_window_that_ends_before_it_begins_is_refused(monkeypatch, capsys) -> None:
    """`--since 1h --until 2h` asked for jobs that ended less than an hour ago and more than two: it
    was an empty table, as if nothing had run."""
    answers = Answers({})
    rc, _, err = run(monkeypatch, capsys, answers, "history", "--since", "1h", "--until", "2h")
    assert_one_error(rc, err, "--until 7200 s ago is not after --since 3600 s ago")
    assert answers.calls == []


def test_logs_says_which_option_is_out_of_range_before_asking(capsys) -> None:
    """`cosched logs 3 -n 0` printed the API's refusal of its own field, `lines: ...`, not the option."""
    for lines in ("0", "10001", "x"):
        with pytest.raises(SystemExit):
            main(["logs", "3", "-n", lines])
        assert f"argument -n/--lines: expected 1 to 10000 lines, got '{lines}'" in capsys.readouterr().err


def test_nodes_cuts_a_long_drain_reason_in_its_table_and_prints_it_whole_below(monkeypatch, capsys) -> None:
    """A daemon's own drain names the machine's error: the STATE column was over 200 characters wide,
    and the reason, cut at 200, ended mid-word (a helper's walkthrough)."""
    long = "job 2 could not start there: cannot reach the Docker engine at unix:///run/docker.sock: refused"
    drains = [{"reason": long, "since": 100.0, "by": "cosched", "state": "drained", "host": "agent2"}, None]
    rows = [
        {"node": n, "hostname": f"agent{n + 1}", "agent": f"A{n}", "up": True, "allocated": 0, "cores": 4,
         "lent": 0, "used": 0, "jobs": [], "drain": drain}
        for n, drain in enumerate(drains)
    ]  # fmt: skip
    rows[1]["drain"] = {"reason": "PSU", "since": 100.0, "by": "root", "state": "draining", "host": "agent2"}
    rc, out, _ = run(monkeypatch, capsys, Answers({("GET", "/v1/nodes"): rows}), "nodes")
    table, below = out.split("\n" + "node0: ", 1)
    assert rc == 0 and "drained (job 2 could not start there: cannot r...)" in table and "draining (PSU)" in table
    assert max(len(line) for line in table.splitlines()) < 120
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(100))
    assert below.strip() == f"drained by cosched since {since}: {long}"
