"""The operator's commands, shaped like Slurm's: submit, queue, status, cancel, hold, release, explain, nodes,
drain, resume.

Each is a thin call to the daemon's API; `--json` prints the API's answer as is.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import shlex
import sys
import time
import tomllib
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from cosched.daemon import dependencies
from cosched.daemon.client import LOG_LINES, ApiError, Client
from cosched.daemon.cpus import ranges
from cosched.errors import ConfigError, CoschedError
from cosched.policies.asax import loss_outcome
from cosched.reporting.report import format_table, shortened

FINAL_STATES = ("done", "failed", "cancelled")

Handler = Callable[[argparse.Namespace], int]


def _reads_answers(handler: Handler) -> Handler:
    """`handler`, with an answer it cannot read ended in one line rather than a traceback.

    Why: the commands read the answers of this version's daemon; a daemon of another version,
    or another service answering JSON on its port, gives them other shapes.
    """

    @functools.wraps(handler)
    def reading(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except CoschedError:  # said on purpose, some of them ValueErrors
            raise
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise ApiError(
                f"cannot read the daemon's answer ({type(exc).__name__}: {exc}): is it another version of cosched?"
            ) from None

    return reading


def add_commands(commands: Any, parser_class: type) -> None:
    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--url", help="daemon API (default: $COSCHED_URL or http://127.0.0.1:6817)")
        parser.add_argument("--json", action="store_true", help="print the API's JSON answer")
        parser.add_argument("--ca-file", help="CA certificates of an https daemon (default: $COSCHED_CA_FILE)")

    dp = commands.add_parser("daemon", help="run the co-scheduling daemon on the local Docker engine")
    dp.add_argument("--config", type=Path, help="TOML settings (default: the embedded defaults)")
    dp.set_defaults(handler=_daemon)

    sp = commands.add_parser("submit", help="submit a job (image and command) or a workflow (TOML file)")
    sp.add_argument("--workflow", type=Path, help="a workflow TOML file instead of a single job")
    sp.add_argument("--image", help="container image in the local engine")
    sp.add_argument("--cores", type=int, default=1, help="cores of the job's gang (default: %(default)s)")
    sp.add_argument(
        "--memory",
        type=int,
        help="MiB for the whole job (default: the daemon's cluster.default_memory_per_core per core, 1024 unless set)",
    )
    sp.add_argument(
        "--walltime", type=float, default=3600.0, help="seconds; the job is killed after it (default: %(default)s)"
    )
    sp.add_argument("--app-class", default="unknown", help="application class ASAx learns about")
    sp.add_argument("--tasks", type=int, default=1, help="tasks the job reports progress in")
    sp.add_argument("--serial", action="store_true", help="the job uses one core at a time")
    sp.add_argument(
        "--span",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="its cores may come from several nodes (on Mesos: one task per agent); default: yes on one host "
        "(its nodes are parts of it), no on Mesos",
    )
    sp.add_argument(
        "--begin",
        help="earliest start, as sbatch --begin: epoch seconds, +SECONDS or now+SECONDS (held until then)",
    )
    sp.add_argument(
        "--latest-start",
        help="latest start, same forms: a job still pending then fails (a deferrable job's window end)",
    )
    sp.add_argument(
        "--no-cosched",
        action="store_true",
        help="co-scheduling leaves it alone: its cores are never lent, and it never runs on another's",
    )
    sp.add_argument(
        "--dependency",
        type=dependencies.parse,
        help="start only after other jobs ended so, as sbatch --dependency (all needed): afterok:12:13, "
        "afternotok:12, afterany:12, a workflow as w7 (afterok:w7: every stage of it succeeded), singleton "
        "(after your earlier jobs of its name); cancelled once one can never be met",
    )
    sp.add_argument(
        "--array",
        type=_array,
        metavar="INDICES",
        help="a job array, as sbatch --array: 0-99, 1,3,5-7 or 0-20:2 (at most 1024 tasks), and %%N to run at "
        "most N at once (0-99%%4); each task gets $COSCHED_ARRAY_INDEX; submitted as a workflow of independent "
        "stages (status, cancel: --workflow ID)",
    )
    sp.add_argument("--name", default="job")
    sp.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    sp.add_argument("--data-dir", action="append", default=[], help="host directory to mount (under a data root)")
    sp.add_argument("command", nargs="*", help="command and arguments (after --)")
    common(sp)
    sp.set_defaults(handler=_submit, job_defaults={dest: sp.get_default(dest) for dest in JOB_ONLY})

    qp = commands.add_parser("queue", help="pending and running jobs, with pending reason and expected start")
    qp.add_argument("--user", "-u", help="only this user's jobs (as squeue -u)")
    common(qp)
    qp.set_defaults(handler=_queue)

    hi = commands.add_parser(
        "history",
        help="jobs that ended: waits, elapsed, core-hours, exit codes (as sacct); --totals per user (as sreport)",
    )
    hi.add_argument("--user", "-u", help="only this user's jobs")
    hi.add_argument("--since", type=_duration, default=86400.0, help="ended at most this long ago: 3600, 12h, 7d (1d)")
    hi.add_argument("--until", type=_duration, help="and at least this long ago (default: now)")
    hi.add_argument("--state", choices=FINAL_STATES, help="only jobs that ended so")
    hi.add_argument("--limit", type=int, default=1000, help="at most this many jobs, oldest end first (1000)")
    hi.add_argument("--totals", action="store_true", help="per user: jobs by how they ended, core-hours, mean wait")
    hi.add_argument(
        "--by", choices=("user", "app_class"), default="user", help="with --totals: per user, or per application class"
    )
    common(hi)
    hi.set_defaults(handler=_history)

    st = commands.add_parser("status", help="one job (or --workflow one workflow) in full")
    st.add_argument("id", type=int)
    st.add_argument("--workflow", action="store_true", help="the id is a workflow's")
    common(st)
    st.set_defaults(handler=_status)

    cp = commands.add_parser("cancel", help="cancel jobs (running ones are killed)")
    cp.add_argument("ids", type=int, nargs="*")
    cp.add_argument("--user", "-u", help="every pending and running job of this user (as scancel -u)")
    cp.add_argument("--workflow", type=int, metavar="ID", help="every pending and running stage of a workflow")
    common(cp)
    cp.set_defaults(handler=_cancel)

    for verb, words in (("hold", "keep pending jobs from starting"), ("release", "let held jobs start again")):
        hp = commands.add_parser(verb, help=f"{words} (as scontrol {verb}; your own jobs, or any as an operator)")
        hp.add_argument("ids", type=int, nargs="+")
        common(hp)
        hp.set_defaults(handler=_hold, held=verb == "hold")

    lp = commands.add_parser("logs", help="the last lines of a job's output: live while it runs (as tail of its file)")
    lp.add_argument("id", type=int)
    lp.add_argument("-n", "--lines", type=_log_lines, default=20, help=f"lines (default: 20; at most {LOG_LINES})")
    common(lp)
    lp.set_defaults(handler=_logs)

    rp = commands.add_parser(
        "requeue",
        help="kill running jobs and queue them again (as scontrol requeue; your own, or any as an operator)",
    )
    rp.add_argument("ids", type=int, nargs="+")
    common(rp)
    rp.set_defaults(handler=_requeue)

    up = commands.add_parser(
        "update",
        help="change queued or running jobs' walltime (as scontrol update TimeLimit; lower your own, "
        "or raise any as an operator)",
    )
    up.add_argument("ids", type=int, nargs="+")
    up.add_argument("--walltime", type=float, required=True, help="seconds from the job's start")
    common(up)
    up.set_defaults(handler=_update)

    tp = commands.add_parser(
        "token",
        help="mint a user's API token (needs the daemon's signing key; made if absent)",
        description="Print COSCHED_TOKEN=<token> for USER, signed with the daemon's api.key_file "
        "(as Slurm's `scontrol token`): `export $(cosched token alice)`.",
    )
    tp.add_argument("user", help="who the token names: they own what they submit, and cancel only that")
    tp.add_argument("--config", type=Path, help="the daemon's TOML settings, for api.key_file")
    tp.add_argument("--key-file", type=Path, help="the signing key (default: the config's api.key_file)")
    tp.add_argument("--lifetime", type=_duration, default=30 * 86400.0, help="e.g. 3600, 12h, 30d (default: 30d)")
    tp.add_argument(
        "--revoke",
        action="store_true",
        help="instead, refuse every token of USER issued until now (a new one works); the daemon sees it at once",
    )
    tp.set_defaults(handler=_token)

    np_ = commands.add_parser(
        "nodes", help="nodes (CPUs, or Mesos agents), allocated cores, lent quota, CPU used, jobs"
    )
    common(np_)
    np_.set_defaults(handler=_nodes)

    shp = commands.add_parser(
        "shares",
        help="each user's decayed usage and fair-share factor, as Slurm's sshare (queue policy fairshare)",
    )
    common(shp)
    shp.set_defaults(handler=_shares)

    drp = commands.add_parser(
        "drain",
        help="take nodes out of service: no job starts there, running ones finish (operators only)",
        description="As Slurm's `scontrol update nodename=N state=drain reason=...`: the node's free cores "
        "leave the pool now, its running jobs finish, and it stays out (across restarts) until `cosched resume`.",
    )
    drp.add_argument("nodes", nargs="+", help="node numbers (1 or node1) or Mesos agent hostnames")
    drp.add_argument("--reason", required=True, help="why, shown by `cosched nodes`")
    common(drp)
    drp.set_defaults(handler=_drain)

    rsp = commands.add_parser("resume", help="give drained nodes back to the scheduler (operators only)")
    rsp.add_argument("nodes", nargs="+", help="node numbers (1 or node1) or Mesos agent hostnames")
    common(rsp)
    rsp.set_defaults(handler=_resume)


def add_explain_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="daemon API (without --log)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--ca-file", help="CA certificates of an https daemon (default: $COSCHED_CA_FILE)")


def _client(args: argparse.Namespace) -> Client:
    """The token comes from $COSCHED_TOKEN only: any user of the host reads a command line (ps)."""
    kind = Client if args.json else _ForPeople
    return kind(args.url, ca_file=args.ca_file)


class _ForPeople(Client):
    """The client of commands that print for a person: no string of an answer reaches the terminal raw.

    Why: a job's log tail, its command and the reasons quoting them are the job's own
    words, and a job is hostile (docs/security.md): escape sequences printed raw would
    drive the operator's terminal (retitle it, write its clipboard, hide lines), and
    bidirectional controls make a line read other than it is. `--json` escapes them itself.
    """

    def call(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        return printable(super().call(method, path, body, headers))


def printable(value: Any) -> Any:
    """`value` (an API answer) with every control or format character of its strings shown
    as an escape (`\\x1b`, `\\u202e`), newlines and tabs kept."""
    if isinstance(value, str):
        return "".join(_escaped(char) for char in value) if not value.isprintable() else value
    if isinstance(value, list):
        return [printable(item) for item in value]
    if isinstance(value, dict):
        return {key: printable(item) for key, item in value.items()}
    return value


def _escaped(char: str) -> str:
    if char in "\n\t" or unicodedata.category(char) not in ("Cc", "Cf", "Zl", "Zp"):
        return char
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def _daemon(args: argparse.Namespace) -> int:
    from cosched.daemon.config import load_config
    from cosched.daemon.run import serve

    serve(load_config(args.config))
    return 0


def _log_lines(text: str) -> int:
    """`-n`: 1 to `LOG_LINES` (the API's 422 named its own field, `lines`)."""
    if not text.isdigit() or not 1 <= int(text) <= LOG_LINES:
        raise argparse.ArgumentTypeError(f"expected 1 to {LOG_LINES} lines, got {text!r}")
    return int(text)


def _duration(text: str) -> float:
    """Seconds from `90`, `90s`, `15m`, `12h` or `30d`."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or a number with s, m, h or d, got {text!r}") from None
    if not 0 < seconds < 10 * 365 * 86400:
        raise argparse.ArgumentTypeError(f"must be more than 0 and less than ten years, got {text!r}")
    return seconds


def _token(args: argparse.Namespace) -> int:
    from cosched.daemon.config import load_config
    from cosched.daemon.identity import create_key, load_key, mint, revocations_path, revoke

    key_file = args.key_file or load_config(args.config).api.key_file
    if not key_file:
        raise ConfigError("token: no signing key: give --key-file or a --config whose api.key_file is set")
    path = Path(key_file).expanduser()
    if args.revoke:
        at = revoke(path, args.user)
        print(
            f"cosched: {args.user}'s tokens issued before {_when(at)} are refused ({revocations_path(path)})",
            file=sys.stderr,
        )
        return 0
    if create_key(path):
        then = "restart the daemon" if not args.key_file else f"set api.key_file = {str(path)!r} and restart the daemon"
        print(f"cosched: made a new signing key {path}: {then}", file=sys.stderr)
    print(f"COSCHED_TOKEN={mint(load_key(path), args.user, args.lifetime)}")
    print(f"cosched: a token for {args.user}, valid until {_when(time.time() + args.lifetime)}", file=sys.stderr)
    return 0


JOB_ONLY = {
    "image": "--image",
    "cores": "--cores",
    "memory": "--memory",
    "walltime": "--walltime",
    "app_class": "--app-class",
    "tasks": "--tasks",
    "serial": "--serial",
    "span": "--span",
    "begin": "--begin",
    "latest_start": "--latest-start",
    "array": "--array",
    "name": "--name",
    "env": "--env",
    "data_dir": "--data-dir",
    "command": "a command",
}
"""`cosched submit`'s options for a single job, which a workflow takes from its file instead."""


def _ignored_by_a_workflow(args: argparse.Namespace) -> list[str]:
    """The job options given beside --workflow: the file's tables say what its stages run, so
    these were dropped without a word (`--begin +3600` started the workflow at once)."""
    defaults = getattr(args, "job_defaults", {})
    given = {dest: getattr(args, dest) for dest in JOB_ONLY if dest in defaults}
    # a positional's default is None where argparse gives []: neither was typed
    return [JOB_ONLY[dest] for dest, value in given.items() if value != defaults[dest] and (value or defaults[dest])]


@_reads_answers
def _submit(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.workflow is not None:
        ignored = _ignored_by_a_workflow(args)
        if ignored:
            raise ConfigError(
                f"submit --workflow takes its jobs' settings from its file, not {', '.join(ignored)}: "
                "put them in its [workflow] or [[stage]] tables (--dependency and --no-cosched apply)"
            )
        try:
            document = tomllib.loads(args.workflow.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{args.workflow}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{args.workflow}: not UTF-8 text (byte {exc.start}); TOML files are UTF-8") from None
        except OSError as exc:
            raise ConfigError(f"{args.workflow}: cannot read: {exc.strerror or exc}") from None
        body = _workflow_body(document)
        if args.dependency:
            body["after"] = args.dependency
        if args.no_cosched:
            body["coschedule"] = False
        answer = client.submit("/v1/workflows", body)
        print(json.dumps(answer) if args.json else f"Submitted workflow {answer['id']} (first jobs {answer['jobs']})")
        return 0
    if not args.image or not args.command:
        raise ConfigError("submit needs --image and a command (or --workflow FILE)")
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--env expects KEY=VALUE, got {item!r}")
        env[key] = value
    body = {
        "name": args.name,
        "image": args.image,
        "command": args.command,
        "cores": args.cores,
        "walltime": args.walltime,
        "app_class": args.app_class,
        "tasks": args.tasks,
        "parallel": not args.serial,
        "env": env,
        **({"span": args.span} if args.span is not None else {}),
        "data_dirs": args.data_dir,
    }
    for key, value in (("begin", args.begin), ("latest_start", args.latest_start)):
        if value is not None:  # as typed: the daemon resolves +SECONDS on its own clock
            body[key] = value
    if args.memory is not None:
        body["memory_mib"] = args.memory
    if args.dependency:
        body["after"] = args.dependency
    if args.no_cosched:
        body["coschedule"] = False
    if args.array is not None:
        indices, throttle = args.array
        return _submit_array(client, body, indices, throttle, args.json)
    answer = client.submit("/v1/jobs", body)
    print(json.dumps(answer) if args.json else f"Submitted job {answer['id']}")
    return 0


def _submit_array(client: Client, job: dict[str, Any], indices: list[int], throttle: int | None, as_json: bool) -> int:
    """A job array as a workflow whose stages, one per index, depend on nothing: they are queued
    together, each its own job with COSCHED_ARRAY_INDEX set, of one application class (what ASAx
    learns about), and `--workflow ID` reaches them all. Why not a kind of its own: a workflow
    already is a set of jobs submitted, shown and cancelled as one."""
    for key in ("latest_start", "span"):
        if key in job:
            raise ConfigError(f"--array: a workflow's stages take no --{key.replace('_', '-')}")
    body = dict(job)
    per_task = {key: body.pop(key) for key in ("app_class", "tasks", "parallel")}
    body["stages"] = [{"name": str(index), "env": {"COSCHED_ARRAY_INDEX": str(index)}, **per_task} for index in indices]
    if throttle is not None:
        body["max_running"] = throttle
    answer = client.submit("/v1/workflows", body)
    if as_json:
        print(json.dumps(answer))
    else:
        print(f"Submitted array {answer['id']} ({len(indices)} jobs {answer['jobs'][0]}-{answer['jobs'][-1]})")
    return 0


def _array(text: str) -> tuple[list[int], int | None]:
    """sbatch --array: its indices, and the throttle after `%` (at most that many run at once)."""
    spans, percent, throttle = text.partition("%")
    if not percent:
        return _indices(spans), None
    if not throttle.isdigit() or not 1 <= int(throttle) <= 1024:
        raise argparse.ArgumentTypeError(f"{text!r}: after %, the most tasks running at once (1 to 1024)")
    return _indices(spans), int(throttle)


def _indices(text: str) -> list[int]:
    """sbatch --array's indices: `0-99`, `1,3,5-7`, `0-20:2`; sorted, each once, at most 1024."""
    indices: set[int] = set()
    for part in text.split(","):
        span, _, step_text = part.partition(":")
        first, dash, last = span.partition("-")
        try:
            low, high, step = int(first), int(last) if dash else int(first), int(step_text or 1)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected indices such as 0-99, 1,3,5-7 or 0-20:2, got {text!r}"
            ) from None
        if not (0 <= low <= high <= 1_000_000 and step > 0):
            raise argparse.ArgumentTypeError(f"{part!r}: need 0 <= first <= last <= 1000000 and a step > 0")
        indices.update(range(low, high + 1, step))
        if len(indices) > 1024:
            raise argparse.ArgumentTypeError(f"{text!r}: more than 1024 tasks (a workflow's most stages)")
    return sorted(indices)


def _workflow_body(document: dict[str, Any]) -> dict[str, Any]:
    """A workflow TOML file ([workflow] table plus [[stage]] tables) as the API's JSON."""
    if not isinstance(document.get("workflow"), dict):
        raise ConfigError("workflow file: missing [workflow] table")
    body = dict(document["workflow"])
    body["stages"] = document.get("stage", [])
    unknown = set(document) - {"workflow", "stage"}
    if unknown:
        raise ConfigError(f"workflow file: unknown table(s) {', '.join(sorted(unknown))}")
    where = _date_or_time(body)
    if where:
        raise ConfigError(f"workflow file: {where} is a TOML date or time; give seconds (begin: epoch or +SECONDS)")
    if isinstance(body.get("after"), str):  # as --dependency writes it: after = "afterok:12,afterany:w3"
        try:
            body["after"] = dependencies.parse(body["after"])
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"workflow file: after: {exc}") from None
    return body


def _date_or_time(value: Any, path: str = "") -> str:
    """Where in a TOML document a date or time value is ('' if none): JSON has no such type, and
    the API takes times as seconds."""
    if isinstance(value, datetime.date | datetime.time):
        return path
    if isinstance(value, dict):
        items: Iterable[tuple[str, Any]] = ((f"{path}.{key}" if path else str(key), v) for key, v in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{index}]", v) for index, v in enumerate(value))
    else:
        return ""
    return next((found for key, item in items if (found := _date_or_time(item, key))), "")


def _when(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(stamp)) if stamp else "N/A"


@_reads_answers
def _queue(args: argparse.Namespace) -> int:
    rows = _client(args).call("GET", "/v1/queue")
    if args.user is not None:
        rows = [row for row in rows if row.get("user") == args.user]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    ranked = any("priority" in r for r in rows)  # a fair-share queue: its priorities, as sprio's
    table = [
        {
            "JOBID": r["id"],
            "NAME": r["name"],
            "USER": r.get("user") or "-",
            "STATE": r["state"].upper(),
            **({"PRIORITY": r.get("priority", "")} if ranked else {}),
            "CORES": r["cores"],
            "QUOTA": "" if r["quota"] is None else f"{r['quota']:g}",
            "START_TIME": _when(r["start"]),
            "NODELIST(REASON)": r["reason"] if r["state"] == "running" else f"({r['reason']})",
        }
        for r in rows
    ]
    print(format_table(table) if table else "no jobs")
    return 0


@_reads_answers
def _history(args: argparse.Namespace) -> int:
    if args.until is not None and args.until >= args.since:  # sacct refuses an empty window too
        raise ConfigError(
            f"history: --until {args.until:g} s ago is not after --since {args.since:g} s ago: no job can have ended "
            "between them (--since is the older bound)"
        )
    now = time.time()
    query = {"since": now - args.since, "until": now - (args.until or 0.0), "limit": args.limit}
    query |= {key: getattr(args, key) for key in ("user", "state") if getattr(args, key) is not None}
    rows = _client(args).call("GET", "/v1/history?" + urllib.parse.urlencode(query))
    if args.totals:
        rows = _totals(rows, args.by)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if args.totals:
        table = [
            {
                args.by.upper(): r[args.by] or ("(no user)" if args.by == "user" else "-"),
                "JOBS": r["jobs"],
                "DONE": r["done"],
                "FAILED": r["failed"],
                "CANCELLED": r["cancelled"],
                "CORE_H": f"{r['core_seconds'] / 3600:.2f}",
                "CPU_H": f"{r['cpu_seconds'] / 3600:.2f}",
                "CPU_EFF": _share(r["cpu_efficiency"]),
                "MEAN_WAIT": _hms(r["mean_wait"]),
            }
            for r in rows
        ]
    else:
        table = [
            {
                "JOBID": r["id"],
                "NAME": r.get("name") or "-",
                "USER": r["user"] or "-",
                "STATE": r["state"].upper(),
                "CORES": r["cores"],
                "NODELIST": r.get("nodes") or "-",
                "START": _when(r["start"]),
                "END": _when(r["end"]),
                "WAIT": _hms(r["wait"]),
                "ELAPSED": _hms(r["elapsed"]),
                "CORE_H": f"{r['core_seconds'] / 3600:.2f}",
                "CPU_EFF": _share(r["cpu_efficiency"]),
                "EXIT": "" if r["exit_code"] is None else r["exit_code"],
                "REASON": r["reason"] or "",
            }
            for r in rows
        ]
    print(format_table(table) if table else "no jobs ended then")
    return 0


def _totals(rows: list[dict[str, Any]], by: str = "user") -> list[dict[str, Any]]:
    """Per user (or application class), most core-hours first: jobs, how many ended each way,
    core-seconds, CPU seconds used and their share of the core-seconds of the jobs sampled (by
    class, what lending could take: the classes that leave their cores idle), mean wait."""
    groups: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = row[by] or ""
        blank = {by: key, "jobs": 0, **dict.fromkeys(FINAL_STATES, 0), "core_seconds": 0.0, "cpu_seconds": 0.0}
        total = groups.setdefault(key, blank | {"sampled": 0.0, "waited": 0.0})
        total["jobs"] += 1
        total[row["state"]] += 1
        total["core_seconds"] += row["core_seconds"]
        if row["cpu_seconds"] is not None:
            total["cpu_seconds"] += row["cpu_seconds"]
            total["sampled"] += row["core_seconds"]
        total["waited"] += row["wait"]
    for total in groups.values():
        sampled = total.pop("sampled")
        total["cpu_efficiency"] = total["cpu_seconds"] / sampled if sampled > 0 else None
        total["mean_wait"] = total.pop("waited") / total["jobs"]
    return sorted(groups.values(), key=lambda t: (-t["core_seconds"], t[by]))


def _share(fraction: float | None) -> str:
    """A share as a percentage, '-' where none was measured."""
    return "-" if fraction is None else f"{fraction:.0%}"


def _hms(seconds: float) -> str:
    """Slurm's [D-]HH:MM:SS."""
    whole = max(round(seconds), 0)
    days, rest = divmod(whole, 86400)
    text = time.strftime("%H:%M:%S", time.gmtime(rest))
    return f"{days}-{text}" if days else text


@_reads_answers
def _status(args: argparse.Namespace) -> int:
    path = f"/v1/workflows/{args.id}" if args.workflow else f"/v1/jobs/{args.id}"
    status = _client(args).call("GET", path)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    if args.workflow:
        owner = f" ({status['user']})" if status.get("user") else ""
        print(f"Workflow {status['id']} {status['name']}{owner}: {status['state']}")
        for stage, info in status["stages"].items():
            print(f"  {stage:<20} {info['state']:<10} job {info['job'] if info['job'] is not None else '-'}")
        failure = status.get("failure")
        if failure and status["state"] == "cancelled":
            print(f"Stage {status['failed_stage']} (job {failure['job']}) was cancelled")
        elif failure:
            print(f"Stage {status['failed_stage']} (job {failure['job']}) exit code {failure['exit_code']}; log tail:")
            for line in (failure["log_tail"] or "").rstrip().splitlines():
                print(f"    {line}")
        return 0
    for key, value in _status_lines(status):
        print(f"{key:>10}: {value}")
    for key in ("submit", "begin", "latest_start", "expected_start", "start", "end"):
        if key in ("submit", "start", "end") or status.get(key) is not None:
            print(f"{key.partition('_')[0]:>10}: {_when(status.get(key))}")
    if status.get("after"):
        print(f"{'after':>10}: {dependencies.describe(status['after'])}")
    _print_quota_changes(status.get("quota_changes") or [])
    if status.get("log_tail"):
        print("  log tail:")
        for line in status["log_tail"].rstrip().splitlines():
            print(f"    {line}")
    return 0


QUOTA_CHANGES_SHOWN = 10
"""The latest quota changes `status` prints (a lender of a long run may have hundreds; `--json` has all)."""


def _print_quota_changes(changes: list[dict[str, Any]]) -> None:
    """When each quota was decided and reached the cgroup: a lending's story, as the store logs it."""
    if not changes:
        return
    earlier = len(changes) - QUOTA_CHANGES_SHOWN
    print("  quota changes:" + (f" (the last {QUOTA_CHANGES_SHOWN}; {earlier} earlier)" if earlier > 0 else ""))
    for change in changes[-QUOTA_CHANGES_SHOWN:]:
        applied = f"applied {_when(change['applied'])}" if change.get("applied") else "not applied"
        print(f"    {_when(change['at'])}  {change['cpus']:g} CPUs, {applied}")


@_reads_answers
def _cancel(args: argparse.Namespace) -> int:
    """Like scancel: a job that already ended, or one refused (no such job, another user's), is an
    error (exit 1), and the others are cancelled: one mistyped id left every job after it running."""
    client = _client(args)
    ids = list(args.ids)
    if args.user is not None:
        ids += [row["id"] for row in client.call("GET", "/v1/queue") if row.get("user") == args.user]
    if args.workflow is not None:  # its stages that run or wait; the workflow fails, the rest never start
        stages = client.call("GET", f"/v1/workflows/{args.workflow}")["stages"].values()
        ids += [stage["job"] for stage in stages if stage["job"] is not None and stage["state"] not in FINAL_STATES]
    if args.user is None and args.workflow is None and not ids:
        raise ConfigError("cancel needs job ids, --user USER or --workflow ID")
    status = 0
    for job_id in ids:
        try:
            answer = client.call("DELETE", f"/v1/jobs/{job_id}")
        except ApiError as exc:
            print(f"cosched: error: {exc}", file=sys.stderr)
            status = 1
            continue
        if args.json:
            print(json.dumps(answer))
        elif answer["state"] in FINAL_STATES:
            print(f"cosched: error: job {job_id} already {answer['state']}; nothing to cancel", file=sys.stderr)
        else:
            print(f"job {job_id}: was {answer['state']}, cancel requested")
        if answer["state"] in FINAL_STATES:
            status = 1
    return status


@_reads_answers
def _hold(args: argparse.Namespace) -> int:
    """Like scontrol hold/release."""
    verb = "hold" if args.held else "release"
    return _each_job(args, "POST", f"/{verb}", None, "held" if args.held else "released")


@_reads_answers
def _logs(args: argparse.Namespace) -> int:
    answer = _client(args).call("GET", f"/v1/jobs/{args.id}/log?lines={args.lines}")
    if args.json:
        print(json.dumps(answer))
        return 0
    if answer["note"]:
        print(f"cosched: job {args.id} is {answer['state']}: {answer['note']}", file=sys.stderr)
    sys.stdout.write(printable(answer["log"]))
    return 0


@_reads_answers
def _requeue(args: argparse.Namespace) -> int:
    """Like scontrol requeue."""
    return _each_job(args, "POST", "/requeue", None, "requeue asked (killed, then queued)")


@_reads_answers
def _update(args: argparse.Namespace) -> int:
    """Like scontrol update TimeLimit."""
    return _each_job(args, "PATCH", "", {"walltime": args.walltime}, f"walltime {args.walltime:g} s")


def _each_job(args: argparse.Namespace, method: str, action: str, body: dict[str, Any] | None, done: str) -> int:
    """One call per job id (`/v1/jobs/ID` and `action`): each job's answer, and exit 1 if any was refused."""
    client, status = _client(args), 0
    for job_id in args.ids:
        try:
            answer = client.call(method, f"/v1/jobs/{job_id}{action}", body)
        except ApiError as exc:
            print(f"cosched: error: {exc}", file=sys.stderr)
            status = 1
            continue
        print(json.dumps(answer) if args.json else f"job {job_id}: {done}")
    return status


def _status_lines(status: dict[str, Any]) -> list[tuple[str, str]]:
    """A job's fields as an operator reads them: units, rounding, no Python reprs."""
    lines = []
    fields = ("id", "name", "user", "state", "reason", "pending_reason", "image", "command", "cores", "cpus", "quota")
    for key in (*fields, "host"):
        value = status.get(key)
        if value in (None, "", []):
            continue
        if key == "command":
            value = shlex.join(value)
        elif key == "cpus":
            value = ranges(value)
        elif key == "quota":
            value = f"{value:g} CPUs"
        lines.append(("waits" if key == "pending_reason" else key, str(value)))
    lines.append(("walltime", f"{status['walltime']:g} s"))
    if status.get("memory_mib") is not None:
        lines.append(("memory", f"{status['memory_mib']} MiB"))
    for key in ("app_class", "workflow", "stage", "exit_code"):
        if status.get(key) not in (None, ""):
            lines.append((key, str(status[key])))
    if status.get("coschedule") is False:
        lines.append(("co-scheduling", "off (--no-cosched): it neither lends its cores nor borrows"))
    if status.get("runtime") is not None:
        lines.append(("runtime", f"{status['runtime']:.1f} s"))
        if status.get("cpu_seconds") is not None and status["runtime"] > 0:
            held = status["cores"] * status["runtime"]
            lines.append(("cpu used", f"{status['cpu_seconds']:.1f} s of {held:.1f} core-seconds held"))
    usage = status.get("usage")
    if usage:
        tasks = f", tasks {usage['tasks_done']}/{usage['tasks']}" if usage.get("tasks") else ""
        lines.append(("usage", f"CPU {usage['cpu']:.0%} of its quota, memory {usage['mem']:.0%} of its limit{tasks}"))
    return lines


@_reads_answers
def _nodes(args: argparse.Namespace) -> int:
    rows = _client(args).call("GET", "/v1/nodes")
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    attributes = any(r.get("attributes") for r in rows)  # the agents' rack, switch, ...
    table = [
        {
            "NODE": f"node{r['node']}",
            **(
                {
                    "HOSTNAME": r["hostname"] or "-",
                    "AGENT": r["agent"] or "-",
                    **(
                        {"ATTRIBUTES": " ".join(f"{k}={v}" for k, v in r["attributes"].items()) or "-"}
                        if attributes
                        else {}
                    ),
                }
                if r.get("hostname") is not None  # a Mesos agent's node ('' while no agent took it)
                else {"CPUS": ranges(r["cpus"])}
            ),
            "STATE": _node_state(r),
            "ALLOC": f"{r['allocated']}/{r['cores']}",
            "LENT": r["lent"],
            "USED": r["used"],
            "JOBS": " ".join(f"{j['id']}({j['quota']:g})" for j in r["jobs"]) or "-",
        }
        for r in rows
    ]
    print(format_table(table))
    for r in rows:  # the reasons the table cut, whole (as `sinfo -R` lists them)
        drain = r.get("drain")
        if drain and len(drain["reason"]) > REASON_IN_TABLE:
            by = f" by {drain['by']}" if drain.get("by") else ""
            print(f"node{r['node']}: {drain['state']}{by} since {_when(drain['since'])}: {drain['reason']}")
    return 0


@_reads_answers
def _shares(args: argparse.Namespace) -> int:
    rows = _client(args).call("GET", "/v1/shares")
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [
        {
            "USER": r["user"] or "(no user)",
            "USAGE_CORE_H": f"{r['usage'] / 3600:.2f}",
            "EFFECTV_USAGE": f"{r['effective_usage']:.4f}",
            "FAIRSHARE": f"{r['fairshare']:.4f}",
            "PENDING": r["pending"],
            "RUNNING": r["running"],
        }
        for r in rows
    ]
    print(format_table(table))
    return 0


REASON_IN_TABLE = 40
"""The most of a drain's reason `nodes` puts in its table; a longer one is printed whole below it
(a daemon's own drain names the machine's error: the column was 200 characters wide)."""


def _node_state(row: dict[str, Any]) -> str:
    """up, up with what other frameworks hold of its Mesos agent, or DOWN; and drained or draining
    (jobs still run there) with the operator's reason."""
    state = "DOWN" if not row["up"] else f"up (others hold {row['others']})" if row.get("others") else "up"
    drain = row.get("drain")
    if drain:
        state = f"{drain['state']} ({shortened(drain['reason'], REASON_IN_TABLE)})" + ("" if row["up"] else ", DOWN")
    return state


@_reads_answers
def _drain(args: argparse.Namespace) -> int:
    client = _client(args)
    for node in _node_numbers(client, args.nodes):
        answer = client.call("POST", f"/v1/nodes/{node}/drain", {"reason": args.reason})
        if args.json:
            print(json.dumps(answer))
            continue
        # as `cosched nodes` says it: draining while jobs still run there (it printed `drained`)
        row = client.call("GET", "/v1/nodes")[node].get("drain") or {}
        print(f"node{node}: {row.get('state', 'drained')} ({answer['reason']})")
    return 0


@_reads_answers
def _resume(args: argparse.Namespace) -> int:
    client = _client(args)
    for node in _node_numbers(client, args.nodes):
        answer = client.call("POST", f"/v1/nodes/{node}/resume")
        print(json.dumps(answer) if args.json else f"node{node}: resumed (drained since {_when(answer['since'])})")
    return 0


def _node_numbers(client: Client, names: list[str]) -> list[int]:
    """Node numbers from what an operator types: 3, node3, or a Mesos agent's hostname."""
    rows: list[dict[str, Any]] | None = None
    numbers = []
    for name in names:
        digits = name.removeprefix("node")
        if digits.isdigit():
            numbers.append(int(digits))
            continue
        rows = rows if rows is not None else client.call("GET", "/v1/nodes")
        found = [row["node"] for row in rows if row.get("hostname") == name]
        if not found:
            raise ConfigError(
                f"no node {name!r}: give a node as `cosched nodes` lists it (node3, or 3) or an agent's hostname"
            )
        numbers.append(found[0])
    return numbers


@_reads_answers
def explain_live(args: argparse.Namespace) -> int:
    decisions = _client(args).call("GET", f"/v1/jobs/{args.job}/explain")
    if args.json:
        print(json.dumps(decisions, indent=2))
        return 0
    if not decisions:
        print(f"no ASAx decision involves job {args.job} (Static records none of its lendings)")
        return 0
    hidden = "another user's job"  # under api.private_data, the other party's side of a lending is not shown
    for d in decisions:
        role = "guest" if d["guest"] == args.job else "lender"
        status = "carried out" if d["executed"] else "not carried out"
        if d["fraction"] == 0:
            status = "nothing lent"
        lender = f"job {d['host']} ({d['app_class']})" if d["host"] is not None else hidden
        guest = f"job {d['guest']}" if d["guest"] is not None else hidden
        loss = loss_outcome(d) if d["host"] is not None else "not shown"
        lent = f"lend {d['fraction']:.0%} of {lender} to {guest}"
        print(f"{_when(d['time'])} job {args.job} as {role}: {lent}, {status}; loss {loss}")
        if d["host"] is None:
            continue
        features = ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in d["features"].items())
        print(f"    lender state: {features}")
        top = sorted(zip(d["weights"], d["experts"], strict=True), reverse=True)[:3]
        print("    heaviest experts: " + ", ".join(f"{name} {w:.2f}" for w, name in top))
    return 0
