"""The `cosched` command line. The only place that prints or exits.

Every error cosched raises on purpose is a `CoschedError`; here it becomes one
line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from cosched.daemon.commands import add_commands, add_explain_options, explain_live
from cosched.errors import ConfigError, CoschedError
from cosched.learn import REWARDS
from cosched.model import MAX_REPLAY_PROCS
from cosched.policies.registry import create
from cosched.replay.driver import PolicySet
from cosched.replay.study import (
    DEFAULT_WORKLOAD,
    POLICY_SETS_SYNTAX,
    StudyResult,
    cluster_for,
    cut,
    load_workload,
    parse_policy_sets,
    run_study,
)
from cosched.traces.swf import CLEANINGS
from cosched.workflows.commands import add_real_options, add_workload_commands, experiment_real

if TYPE_CHECKING:
    from experts.tree import ExpertSet

DEFAULT_COMPARISON = "fcfs:easy,fcfs:easy:actual,sjf:easy,sjf:easy:actual,wfp3:easy,f1:easy"
SUMMARY_COLUMNS = ("jobs", "mean_wait", "mean_response", "mean_bsld", "bsld_p99", "utilization", "mean_queue_length")
PROGRESS_MIN_JOBS = 20000
MAX_COUNT = 10**7
"""The largest count an option takes (jobs, samples, epochs, K, ...): more only overflows NumPy's
arrays or runs for days, so it is refused when parsed, not by a traceback later."""
MAX_SEED = 2**32 - 1
"""NumPy's legacy seeding, which training's libraries call, takes no larger seed."""
MAX_JOB_ID = 2**63 - 1
"""The largest job id: a 64-bit signed integer, as the daemon's state file (SQLite) holds it."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, like every other error here."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _whole(text: str, minimum: int, maximum: int = MAX_COUNT, what: str = "") -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    if value > maximum:
        raise argparse.ArgumentTypeError(f"must be at most {maximum:,}{what}, got {value}")
    return value


def _positive(text: str) -> int:
    return _whole(text, 1)


def _non_negative(text: str) -> int:
    return _whole(text, 0)


def _procs(text: str) -> int:
    """A cluster size: the largest one `cluster_for` replays."""
    return _whole(text, 1, MAX_REPLAY_PROCS, " processors (the largest cluster cosched replays)")


def _seed(text: str) -> int:
    return _whole(text, 0, MAX_SEED)


def _job_id(text: str) -> int:
    return _whole(text, 0, MAX_JOB_ID)


def _depth(text: str) -> int:
    """A fitted tree's depth: one the expert file format loads back (`experts.store.MAX_DEPTH`)."""
    from experts.store import MAX_DEPTH

    return _whole(text, 1, MAX_DEPTH, " (the deepest tree an expert file holds)")


def _minutes(text: str) -> float:
    """A time budget: a finite number of minutes > 0 (NaN would never stop, as no time passes it)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of minutes, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number of minutes > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cosched", description="HPC scheduling and co-scheduling, live or replayed.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    rp = commands.add_parser(
        "replay",
        help="replay a workload through the scheduler in simulated time",
        description="Replay an SWF trace (or a generated workload) through the scheduling core.",
    )
    rp.add_argument(
        "trace",
        nargs="?",
        default=None,
        help=f"SWF file (.swf or .swf.gz), or lublin[:JOBS[:PROCS[:LOAD]]]; default: {DEFAULT_WORKLOAD}",
    )
    rp.add_argument("--queue", help="queue policy (fcfs, sjf, wfp3, f1, ... or module:Class); default fcfs")
    rp.add_argument("--backfill", help="backfill policy (none, easy, conservative); default easy")
    rp.add_argument(
        "--estimate",
        help="runtime estimate for backfilling: requested (default), actual (EASY-AR), or module:Class",
    )
    rp.add_argument(
        "--placement",
        default="first-fit",
        help="placement policy: first-fit, or on a fat-tree contiguous, sa[:OPTIONS], nsa[:OPTIONS]",
    )
    rp.add_argument(
        "--max-cores-per-user",
        type=_procs,
        metavar="N",
        help="no user's running jobs hold more than N cores at once (Slurm's MaxTRESPerUser=cpu=N)",
    )
    rp.add_argument(
        "--max-running-jobs-per-user",
        type=_positive,
        metavar="N",
        help="no user runs more than N jobs at once (Slurm's MaxJobsPerUser=N)",
    )
    rp.add_argument(
        "--fat-tree",
        type=_positive,
        metavar="K",
        help="the nodes sit in a k-ary fat-tree (K/2 nodes a leaf switch, K/2 switches a pod): "
        "topology-aware placement, and a hops column (the NSA paper's CH cost, c = 1)",
    )
    rp.add_argument(
        "--compare",
        nargs="?",
        const=DEFAULT_COMPARISON,
        default=None,
        metavar="SETS",
        help=f"run several policy sets side by side: {POLICY_SETS_SYNTAX} (default: {DEFAULT_COMPARISON})",
    )
    rp.add_argument(
        "--allocation", default="core", choices=("core", "node"), help="jobs take any free cores, or whole nodes"
    )
    rp.add_argument(
        "--deferrable",
        type=float,
        metavar="FRACTION",
        help="make this share of the jobs deferrable (drawn with --seed): each may start from its submission "
        "until --window seconds later, else it expires; adds OSDEC's expired and reward columns",
    )
    rp.add_argument(
        "--window",
        type=float,
        nargs=2,
        default=(3600.0, 4 * 3600.0),
        metavar=("LOW", "HIGH"),
        help="with --deferrable: each window's width is drawn from U[LOW, HIGH] seconds (default 3600 14400)",
    )
    rp.add_argument("--procs", type=_procs, help="cluster size in processors (overrides the header)")
    rp.add_argument("--start", type=_non_negative, default=0, help="first job of the window (0-based)")
    rp.add_argument("--length", type=_positive, help="jobs in the window, or in each sample")
    rp.add_argument("--samples", type=_positive, help="replay K random windows of --length jobs")
    rp.add_argument("--seed", type=_seed, default=1, help="seed for sampling and generated workloads")
    rp.add_argument("--lenient", action="store_true", help="skip and count malformed trace lines and repeated job ids")
    rp.add_argument(
        "--drop-cancelled", action="store_true", help="drop jobs cancelled after they started (kept by default)"
    )
    _add_cleaning(rp)
    rp.add_argument("--validate", action="store_true", help="check every scheduling step (slower)")
    rp.add_argument("--out", type=Path, help="write jobs.csv, summary.json and PNG plots here")
    rp.add_argument("--no-plots", action="store_true", help="with --out, skip the PNG plots")
    rp.add_argument("--json", action="store_true", help="print the summary as JSON")
    rp.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: on a terminal, for long replays)",
    )
    rp.set_defaults(handler=_replay)

    tr = commands.add_parser(
        "train",
        help="train a learned policy (RLBackfilling, DBF, OSDEC or NSA) with PPO on a trace, in replay",
        description="Train rlbf (which job to backfill), dbf (which job to start, split window) or osdec "
        "(which deferrable job to start, on windows of the trace given start windows, eq. 6 reward) with "
        "MaskablePPO on windows of a trace replayed by the core. Needs the train extra: "
        "pip install torch==2.13.0 && pip install 'cosched[train]'.",
    )
    tr.add_argument("policy", choices=("rlbf", "dbf", "nsa", "osdec"))
    tr.add_argument(
        "trace",
        help="SWF file, or lublin[:JOBS[:PROCS[:LOAD]]]; nsa: paper[:JOBS], the windows of the NSA paper's "
        "workload (3000 jobs by default, seeded by --seed)",
    )
    tr.add_argument("--out", type=Path, required=True, help="checkpoints, training log, curve, model.npz, record.json")
    tr.add_argument("--epochs", type=_positive, default=100, help="PPO rollouts and updates (default 100)")
    tr.add_argument("--steps", type=_positive, default=4096, help="decisions per epoch (default 4096)")
    tr.add_argument("--length", type=_positive, default=256, help="jobs per episode window (dbf: starts)")
    tr.add_argument("--window", type=_positive, help="rlbf: jobs it observes (default 128); osdec: jobs it scores (32)")
    tr.add_argument("--head", type=_non_negative, default=10, help="dbf: jobs observed at the queue's head")
    tr.add_argument("--tail", type=_non_negative, default=0, help="dbf: jobs observed at its tail (split window)")
    tr.add_argument("--queue", default="fcfs", help="rlbf: the base queue policy (default fcfs)")
    tr.add_argument("--seed", type=_seed, default=0)
    tr.add_argument("--procs", type=_procs, help="cluster size in processors (overrides the header)")
    tr.add_argument("--resume", action="store_true", help="go on from --out's checkpoint up to --epochs")
    tr.add_argument("--max-minutes", type=_minutes, help="stop after the epoch that passes this much training time")
    tr.add_argument(
        "--warm-start",
        metavar="RULE",
        help="before PPO, fit the actor to imitate a rule: shortest (request, the default), first, fewest, area, "
        "f1; dbf also ORDER-reserving (holds cores for a blocked job, needs --expected-start); none: a random actor "
        "(nsa's only choice, as the paper's)",
    )
    tr.add_argument(
        "--actor",
        choices=("mlp", "kernel", "cnn"),
        help="dbf: mlp, the paper's MLP over the whole observation (default), or kernel, one network scoring each "
        "job of the window; nsa: cnn, the paper's CNN-3 (default), or mlp, its FCN-1",
    )
    tr.add_argument(
        "--expected-start",
        action="store_true",
        help="dbf: each job of the window also shows the time until it would fit by the running jobs' estimates",
    )
    tr.add_argument(
        "--time-features",
        choices=("linear", "log"),
        help="requested and remaining times as features: divided by the trace's longest request, or on a log scale "
        "(default linear; osdec: log)",
    )
    tr.add_argument(
        "--reward",
        choices=sorted({reward for rewards in REWARDS.values() for reward in rewards}),
        default="paper",
        help="the paper's reward; rlbf: trace (the bsld gain over EASY relative to the trace's mean EASY bsld, "
        "not the window's); dbf: bsld (the bounded slowdown queued jobs accrue)",
    )
    tr.add_argument(
        "--ppo",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=_ppo_argument,
        help="a MaskablePPO argument over the defaults, e.g. --ppo gae_lambda=1.0 --ppo target_kl=none",
    )
    _add_cleaning(tr)
    tr.set_defaults(handler=_train)

    ex = commands.add_parser("experiment", help="reproduce a paper's experiment in replay")
    which = ex.add_subparsers(dest="experiment", required=True, parser_class=_Parser)
    asax = which.add_parser("asax", help="the ASAx paper's section 4.4 experiment (Tables 2 and 3)")
    asax.add_argument("--sizes", type=_size_list, default=[64, 128, 256], help="cluster sizes in cores")
    asax.add_argument(
        "--seeds",
        type=_seed_list,
        default=[1, 2, 3],
        help="seeds (ASAx's sampling; with --real, ASAx runs once per seed, live and in replay)",
    )
    asax.add_argument(
        "--repeats", type=_positive, help="times the 15-workflow set is submitted (default 3; 1 with --real)"
    )
    asax.add_argument(
        "--min-guest-share",
        type=float,
        help="ASAx refuses lendings that give a guest less than this share of its cores (default 0.6)",
    )
    asax.add_argument(
        "--loss",
        choices=["live", "degradation", "walltime"],
        default="live",
        help="how lendings are scored: slowdown vs the runtime alone as a live scheduler knows it (the "
        "daemon's, the default), vs the true runtime alone (replay's oracle, for ablations), or walltime overrun",
    )
    asax.add_argument(
        "--keep-promises",
        action="store_true",
        help="a guest never holds cores EASY's reservation counts on (the daemon's default; the paper had none)",
    )
    asax.add_argument(
        "--ceiling",
        action="store_true",
        help="also sweep an oracle that knows every stage's interference, and its rule on measured CPU alone: "
        "the most lending gains within 5%%",
    )
    asax.add_argument("--out", type=Path, help="write decisions.jsonl, training.jsonl, summary.json and plots")
    add_real_options(asax)
    asax.set_defaults(handler=_experiment_asax)

    long = which.add_parser(
        "asax-long", help="ASAx over a long horizon: workflows arriving over time, learning against fixed mixtures"
    )
    long.add_argument("--size", type=_procs, default=128, help="cluster size in cores (a multiple of 8, >= 64)")
    long.add_argument("--workflows", type=_positive, default=1000, help="workflows arriving, per seed")
    long.add_argument("--load", type=float, default=0.9, help="offered work over the cluster's cores")
    long.add_argument("--seeds", type=_seed_list, default=[1, 2, 3], help="seeds (arrivals and ASAx's sampling)")
    long.add_argument(
        "--learners",
        type=_name_list,
        default=None,
        help="compare learners: comma-separated from class, app, stage, shared (default: ASAx's default only)",
    )
    long.add_argument("--experts", type=Path, help="expert set (JSON) instead of the shipped one")
    long.add_argument("--compare-experts", type=Path, help="also run ASAx with this expert set and compare")
    long.add_argument("--horizon", type=_positive, help="rounds the tuned gamma is chosen for (default 100)")
    long.add_argument("--round-threshold", type=float, help="risk that ends a round, in (0, 1] (default 0.1)")
    long.add_argument(
        "--keep-promises", action="store_true", help="a guest never holds cores a backfill reservation counts on"
    )
    long.add_argument("--out", type=Path, help="write decisions.jsonl, training.jsonl, summary.json and plots")
    long.set_defaults(handler=_experiment_asax_long)

    nsa = which.add_parser(
        "nsa",
        help="the NSA paper in replay: per-job vs window-based placement (Fig. 6), SA vs NSA (Table III)",
    )
    nsa.add_argument("--jobs", type=_positive, default=3000, help="jobs of the paper's workload (Fig. 6 part)")
    nsa.add_argument("--seed", type=_seed, default=11, help="seed of the Fig. 6 part's jobs")
    nsa.add_argument("--periods", type=_int_list, default=[10, 20, 30, 40, 50, 60], help="window lengths, s")
    nsa.add_argument("--iterations", type=_positive, default=500, help="SA and NSA iterations per window")
    nsa.add_argument(
        "--windows", type=_non_negative, default=200, help="windows of Table III (0: skip it); seed 7, 1,200 jobs"
    )
    nsa.set_defaults(handler=_experiment_nsa)

    deferrable = which.add_parser(
        "deferrable", help="OSDEC's heuristics for deferrable jobs on a workload given start windows (its Table 1)"
    )
    deferrable.add_argument("workload", nargs="?", default="lublin:2000:64", help="SWF file or lublin:JOBS:PROCS")
    deferrable.add_argument("--fraction", type=float, default=0.5, help="share of jobs made deferrable")
    deferrable.add_argument(
        "--width", type=float, nargs=2, default=(3600.0, 4 * 3600.0), metavar=("LOW", "HIGH"), help="window, s"
    )
    deferrable.add_argument(
        "--lead", type=float, nargs=2, default=(0.0, 0.0), metavar=("LOW", "HIGH"), help="begin after submit, s"
    )
    deferrable.add_argument("--policies", type=_name_list, help="queue:backfill pairs, comma-separated")
    deferrable.add_argument("--seed", type=_seed, default=1)
    deferrable.set_defaults(handler=_experiment_deferrable)

    fair = which.add_parser(
        "fairshare", help="fair-share on a trace: waits over jobs, over users, of the heaviest users and the rest"
    )
    fair.add_argument(
        "workload", nargs="?", default="../shared/traces/SDSC-SP2-1998-4.2-cln.swf.gz", help="SWF file with user ids"
    )
    fair.add_argument("--policies", type=_name_list, help="queue:backfill pairs, comma-separated")
    fair.set_defaults(handler=_experiment_fairshare)

    xp = commands.add_parser("explain", help="show the co-scheduling decisions about a job")
    xp.add_argument("job", type=_job_id, help="job id")
    xp.add_argument("--log", type=Path, help="decisions.jsonl of `cosched experiment asax --out` (else: the daemon)")
    add_explain_options(xp)
    xp.set_defaults(handler=_explain)
    add_commands(commands, _Parser)
    add_workload_commands(commands, _Parser)

    ep = commands.add_parser("experts", help="inspect or fit ASAx expert sets")
    verbs = ep.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    show = verbs.add_parser("show", help="print an expert set's trees")
    show.add_argument("file", nargs="?", type=Path, help="expert set (JSON); default: the shipped set")
    show.set_defaults(handler=_experts_show)
    fit = verbs.add_parser("fit", help="fit decision-tree experts from recorded decisions and losses")
    fit.add_argument(
        "log", type=Path, help="JSON Lines of decisions (e.g. training.jsonl), or a daemon's state file (state.sqlite)"
    )
    fit.add_argument("--out", type=Path, required=True, help="where to write the expert set")
    fit.add_argument("--depth", type=_depth, default=3, help="maximum tree depth")
    fit.add_argument("--seed", type=_seed, default=0)
    fit.set_defaults(handler=_experts_fit)
    return parser


def _add_cleaning(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cleaning",
        choices=CLEANINGS,
        default="standard",
        help="trace cleaning: standard (drop runtime -1), or dirlab: DIR-LAB's simulator's "
        "(runtime -1 kept as 10 s jobs, jobs above the machine cut to it), which computed the RL backfilling paper",
    )


def _ppo_argument(text: str) -> tuple[str, object]:
    """KEY=VALUE, checked against MaskablePPO's arguments when parsed, before any trace is read."""
    from cosched.learn.ppo_arguments import check_ppo_argument

    key, equals, value = text.partition("=")
    if not equals or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, check_ppo_argument(key, _ppo_value(value))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ppo_value(value: str) -> object:
    """None, a whole number, a number, or else the text in lower case (true, false)."""
    if value.lower() == "none":
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value.lower()


def _train(args: argparse.Namespace) -> int:
    try:
        from cosched.learn.rules import check_rule
        from cosched.learn.train import TrainSettings, train
    except ImportError as exc:
        raise ConfigError(str(exc)) from None
    if args.policy == "nsa":
        return _train_nsa(args)
    osdec = args.policy == "osdec"
    args.window = args.window or (32 if osdec else 128)
    args.time_features = args.time_features or ("log" if osdec else "linear")
    if osdec and args.window < 2:
        raise ConfigError("osdec: --window must be at least 2")
    args.warm_start = args.warm_start or "shortest"
    args.actor = args.actor or "mlp"
    if args.actor not in ("mlp", "kernel"):
        raise ConfigError(f"{args.policy}: --actor is mlp or kernel, not {args.actor}")
    if args.policy == "dbf" and args.head + args.tail < 1:
        raise ConfigError("--head + --tail must be at least 1")
    create("queue", args.queue)  # an unknown base policy fails before any work
    if args.warm_start != "none":
        check_rule(args.warm_start, "rlbf" if osdec else args.policy, args.expected_start)
    trace = load_workload(args.trace, seed=args.seed, procs=args.procs, cleaning=args.cleaning)
    cluster = cluster_for(trace, "core", args.procs)
    settings = TrainSettings(
        kind=args.policy,
        trace=str(args.trace),
        epochs=args.epochs,
        steps=args.steps,
        length=args.length,
        seed=args.seed,
        queue=args.queue,
        window=args.window,
        head=args.head,
        tail=args.tail,
        cleaning=args.cleaning,
        procs=args.procs,
        max_minutes=args.max_minutes,
        ppo=dict(args.ppo),
        warm_start=args.warm_start,
        log_time=args.time_features == "log",
        reward=args.reward,
        expected_start=args.expected_start,
        actor=args.actor,
    )
    path = train(settings, trace, cluster, args.out, resume=args.resume)
    record = json.loads((args.out / "record.json").read_text())
    spec = {"rlbf": f"fcfs:[rlbf:{path}]", "osdec": f"[osdec:{path}]:easy"}.get(args.policy, f"[dbf:{path}]:none")
    print(
        f"trained {args.policy} on {trace.name}: {record['epochs']} epochs, {record['decisions']} decisions, "
        f"{record['episodes']} episodes in {record['wall_seconds']:.0f} s",
        file=sys.stderr,
    )
    print(f"model: {path} (cosched replay TRACE --compare '{spec}')")
    return 0


def _train_nsa(args: argparse.Namespace) -> int:
    """`cosched train nsa paper[:JOBS]`: NSA's repair on recorded windows of the paper's workload."""
    from cosched.learn.train import TrainSettings, train

    name, _, jobs = str(args.trace).partition(":")
    if name != "paper":
        raise ConfigError(f"nsa trains on the NSA paper's workload: give paper or paper:JOBS, not {args.trace!r}")
    try:
        count = int(jobs) if jobs else 3000
    except ValueError:
        raise ConfigError(f"paper:JOBS needs a whole number of jobs, got {jobs!r}") from None
    if count < 10:
        raise ConfigError(f"paper:JOBS needs at least 10 jobs, got {count}")
    if args.warm_start not in (None, "none"):
        raise ConfigError("nsa trains from a random actor, as the paper's: no --warm-start")
    actor = args.actor or "cnn"
    if actor not in ("cnn", "mlp"):
        raise ConfigError(f"nsa: --actor is cnn or mlp, not {actor}")
    settings = TrainSettings(
        kind="nsa",
        trace=str(args.trace),
        epochs=args.epochs,
        steps=args.steps,
        seed=args.seed,
        max_minutes=args.max_minutes,
        ppo=dict(args.ppo),
        warm_start="none",
        actor=actor,
        jobs=count,
    )
    path = train(settings, None, None, args.out, resume=args.resume)
    record = json.loads((args.out / "record.json").read_text())
    print(
        f"trained nsa on {record['trace']['windows']} windows of {count} paper jobs: {record['epochs']} epochs, "
        f"{record['decisions']} decisions, {record['episodes']} episodes in {record['wall_seconds']:.0f} s",
        file=sys.stderr,
    )
    print(f"model: {path} (cosched.experiments.nsa_search.table(model={str(path)!r}))")
    return 0


def _int_list(text: str, maximum: int = MAX_COUNT) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative whole numbers, got {text!r}")
    if max(values) > maximum:
        raise argparse.ArgumentTypeError(f"each must be at most {maximum:,}, got {max(values)}")
    return values


def _size_list(text: str) -> list[int]:
    return _int_list(text, MAX_REPLAY_PROCS)


def _seed_list(text: str) -> list[int]:
    return _int_list(text, MAX_SEED)


def _experiment_asax(args: argparse.Namespace) -> int:
    from cosched.experiments import asax_report
    from cosched.experiments.asax import run_experiment
    from cosched.policies.asax import DEFAULT_GUEST_SHARE

    if args.real:
        return experiment_real(args)
    bad = [s for s in args.sizes if s % 8 or s < 64]
    if bad:
        raise ConfigError(f"cluster sizes must be multiples of 8 cores, at least 64 (the largest job): {bad}")
    share = DEFAULT_GUEST_SHARE if args.min_guest_share is None else args.min_guest_share
    if not 0.0 <= share <= 1.0:
        raise ConfigError(f"--min-guest-share must be in [0, 1], got {share}")
    experiment = run_experiment(
        args.sizes,
        args.seeds,
        repeats=args.repeats or 3,
        min_guest_share=share,
        keep_promises=args.keep_promises,
        loss=args.loss,
    )
    print(asax_report.table2(experiment))
    print()
    print(asax_report.table3(experiment))
    print()
    print(asax_report.format_goals(asax_report.goals(experiment)))
    print()
    print(asax_report.learning(experiment))
    if args.ceiling:
        from cosched.experiments.asax_ceiling import RULES, format_ceiling, sweep

        bases = {size: experiment.select(size, "slurm")[0] for size in args.sizes}
        sweeps = {size: {rule: sweep(size, base, rule) for rule in RULES} for size, base in bases.items()}
        print()
        print(format_ceiling(experiment, sweeps))
    if args.out:
        for path in asax_report.write_outputs(experiment, args.out):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _name_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _experiment_nsa(args: argparse.Namespace) -> int:
    from cosched.experiments.topology import compare_placements, format_placements

    rows = compare_placements(args.jobs, args.seed, periods=args.periods, iterations=args.iterations)
    print(f"The paper's workload, {args.jobs} jobs (seed {args.seed}), FCFS + EASY: Fig. 6")
    print(format_placements(rows))
    if args.windows:
        from cosched.experiments.nsa_search import format_table, table

        print(f"\nSA against NSA on {args.windows} windows of a replay the model never trained on: Table III")
        print(format_table(table(windows=args.windows)))
    return 0


def _experiment_deferrable(args: argparse.Namespace) -> int:
    from cosched.replay.deferrable import Windows
    from cosched.replay.osdec import DEFAULT_POLICIES, run, table

    if not 0 <= args.fraction <= 1:
        raise ConfigError(f"--fraction must be in [0, 1], got {args.fraction}")
    windows = Windows(args.fraction, tuple(args.width), tuple(args.lead), args.seed)
    print(table(run(args.workload, windows, args.policies or DEFAULT_POLICIES, seed=args.seed)))
    return 0


def _experiment_fairshare(args: argparse.Namespace) -> int:
    from cosched.experiments.fairshare import DEFAULT_POLICIES, run, table

    print(table(*run(args.workload, args.policies or DEFAULT_POLICIES)))
    return 0


def _experiment_asax_long(args: argparse.Namespace) -> int:
    from cosched.experiments import asax_long_report as report
    from cosched.experiments.asax_long import run_long
    from cosched.policies.asax import DEFAULT_LEARNER, LEARNERS
    from experts.weights import DEFAULT_HORIZON, DEFAULT_THRESHOLD, Schedule

    if args.size % 8 or args.size < 64:
        raise ConfigError(f"--size must be a multiple of 8 cores, at least 64 (the largest job): {args.size}")
    if not 0 < args.load <= 2:
        raise ConfigError(f"--load must be in (0, 2], got {args.load}")
    learners = args.learners or [DEFAULT_LEARNER]
    unknown = [name for name in learners if name not in LEARNERS]
    if unknown:
        raise ConfigError(f"unknown learner {unknown[0]!r}; known: {', '.join(LEARNERS)}")
    schedule = Schedule(
        horizon=args.horizon or DEFAULT_HORIZON,
        threshold=DEFAULT_THRESHOLD if args.round_threshold is None else args.round_threshold,
    )
    experts = _load_experts(args.experts)
    common = {
        "size": args.size,
        "workflows": args.workflows,
        "load": args.load,
        "schedule": schedule,
        "keep_promises": args.keep_promises,
    }
    experiment = run_long(args.seeds, experts=experts, learners=learners, **common)
    for part in (report.outcomes(experiment), report.theorem(experiment), report.learners(experiment)):
        print(part, end="\n\n")
    if len(learners) > 1:
        print(report.learner_comparison(experiment), end="\n\n")
    print(report.format_goals(report.goals(experiment)))
    if args.compare_experts:
        other = run_long(
            args.seeds, experts=_load_experts(args.compare_experts), strategies=["slurm", "asax"], **common
        )
        print()
        print(report.compare_experts(experiment, other, args.compare_experts.name))
    if args.out:
        for path in report.write_outputs(experiment, args.out):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _load_experts(path: Path | None) -> ExpertSet | None:
    from experts.tree import ExpertSet

    if path is None:
        return None
    if not path.is_file():
        raise ConfigError(f"expert set not found: {path}")
    return ExpertSet.load(str(path))


def _explain(args: argparse.Namespace) -> int:
    from cosched.experiments.asax_report import explain

    if args.log is None:
        return explain_live(args)
    if not args.log.is_file():
        raise ConfigError(f"decision log not found: {args.log}")
    try:
        text = explain(args.log, args.job)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    print(text or f"no co-scheduling decision involves job {args.job}")
    return 0


def _experts_show(args: argparse.Namespace) -> int:
    from experts.default import default_experts
    from experts.fit import describe
    from experts.tree import ExpertSet

    print(describe(ExpertSet.load(str(args.file)) if args.file else default_experts()))
    return 0


def _experts_fit(args: argparse.Namespace) -> int:
    from experts.fit import fit_experts, read_log

    records = read_log(args.log)
    if not records:
        raise ConfigError(f"{args.log}: no decisions to fit")
    try:
        expert_set = fit_experts(records, max_depth=args.depth, seed=args.seed)
    except ImportError:
        raise ConfigError("fitting needs scikit-learn: pip install 'cosched[learn]'") from None
    except ConfigError as exc:  # a record the fit cannot take (an action outside the grid): name the log
        raise ConfigError(f"{args.log}: {exc}") from None
    expert_set.save(str(args.out))
    print(f"fitted {len(expert_set)} experts from {len(records)} decisions: {args.out}", file=sys.stderr)
    return 0


def _replay(args: argparse.Namespace) -> int:
    _refuse_empty(args)
    chosen = [f"--{name}" for name in ("queue", "backfill", "estimate") if getattr(args, name)]
    if args.compare is not None:
        if chosen:
            raise ConfigError(f"--compare names its own policies; drop {', '.join(chosen)}")
        sets = parse_policy_sets(args.compare)
    else:
        sets = [PolicySet(args.queue or "fcfs", args.backfill or "easy", args.estimate or "requested")]
    for policy_set in sets:
        policy_set.placement = args.placement
        policy_set.max_cores_per_user = args.max_cores_per_user or 0
        policy_set.max_running_jobs_per_user = args.max_running_jobs_per_user or 0
        policy_set.check()  # an unknown name fails before any trace is read
    if args.out is not None:
        _check_out(args.out, [policy_set.label for policy_set in sets], args.samples or 1)
    windows = None
    if args.deferrable is not None:
        from cosched.replay.deferrable import Windows

        windows = Windows(args.deferrable, tuple(args.window), seed=args.seed)
    trace = load_workload(
        args.trace,
        seed=args.seed,
        lenient=args.lenient,
        drop_cancelled=args.drop_cancelled,
        procs=args.procs,
        cleaning=args.cleaning,
    )
    cluster = cluster_for(trace, args.allocation, args.procs)
    if args.fat_tree:
        if args.fat_tree % 2:
            raise ConfigError(f"--fat-tree {args.fat_tree}: a k-ary fat-tree needs an even K")
        half = args.fat_tree // 2
        cluster = dataclasses.replace(cluster, nodes_per_switch=half, switches_per_pod=half)
    warnings = list(trace.report.warnings)
    sequences = cut(trace, start=args.start, length=args.length, samples=args.samples, seed=args.seed, notes=warnings)
    for warning in warnings:  # with --json too: they say the numbers may mean nothing
        print(f"cosched: warning: {warning}", file=sys.stderr)

    if not args.json:
        print(
            f"{trace.name}: {len(trace)} jobs on {cluster.nodes} nodes x {cluster.cores_per_node} cores "
            f"({cluster.allocation.value} allocation)",
            file=sys.stderr,
        )
        for line in trace.report.lines_out():
            print(f"  {line}", file=sys.stderr)

    total = sum(len(s) for s in sequences) * len(sets)
    show = args.progress if args.progress is not None else sys.stderr.isatty() and total >= PROGRESS_MIN_JOBS
    bar = None
    if show:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="job", file=sys.stderr, leave=False)
    try:
        results = run_study(
            sequences, cluster, sets, validate=args.validate, progress=bar.update if bar else None, windows=windows
        )
    finally:
        if bar is not None:
            bar.close()

    # An expired deferrable job ends at the pass that expired it; one that never fits never ends.
    rejected = sum(1 for r in results for run in r.runs for job in run.rejected if job.end < 0)
    if rejected:
        print(f"cosched: warning: {rejected} jobs larger than the cluster were rejected, not replayed", file=sys.stderr)
    payload = _payload(results, trace.name, len(sequences))
    payload["load_report"] = {**trace.report.as_dict(), "warnings": warnings}
    if args.out:
        _write_outputs(args.out, results, payload, cluster.cores, plots=not args.no_plots)
    if args.json:
        print(json.dumps(payload, indent=2, default=float))
    else:
        print(_table(results, len(sequences), windows is not None))
        if args.out:
            print(f"wrote {args.out}/", file=sys.stderr)
    return 0


def _refuse_empty(args: argparse.Namespace) -> None:
    """An empty value (`--compare ''`) is a mistake, not a request for the default (an empty trace
    is `load_workload`'s to refuse)."""
    for name in ("compare", "queue", "backfill", "estimate", "placement"):
        value = getattr(args, name)
        if value is not None and not value.strip():
            raise ConfigError(f"--{name} is empty; leave it out for the default")


def _check_out(out: Path, labels: Sequence[str], samples: int) -> None:
    """Refuse an --out the results could not be written to before the replay, not after it
    (`_write_outputs`): a file where a folder goes, a folder where a file goes, no write permission."""
    folders = [out / label for label in labels]
    if samples > 1:
        folders = [folder / f"sample-{k}" for folder in folders for k in range(samples)]
    for path in (out / "summary.json", *(folder / "jobs.csv" for folder in folders)):
        problem = _unwritable(path)
        if problem:
            raise ConfigError(f"--out {out}: {problem}")


def _unwritable(path: Path) -> str | None:
    """Why `path` could not be written as a file once its missing folders are made, or None."""
    if path.is_dir():
        return f"{path} is a directory"
    if path.exists():
        return None if os.access(path, os.W_OK) else f"{path} is not writable"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a directory"
    return None if os.access(folder, os.W_OK | os.X_OK) else f"cannot write in {folder}"


def _payload(results: Sequence[StudyResult], name: str, samples: int) -> dict[str, object]:
    return {
        "workload": name,
        "samples": samples,
        "results": {
            r.label: {
                "per_sample": [s.as_dict() for s in r.summaries],
                "aggregate": r.aggregate(),
                "rejected": sum(len(run.rejected) for run in r.runs),
                "replay_seconds": r.seconds,
            }
            for r in results
        },
    }


def _table(results: Sequence[StudyResult], samples: int, windows: bool = False) -> str:
    from cosched.replay.deferrable import measure
    from cosched.reporting.metrics import mean_hops
    from cosched.reporting.report import format_table

    rows = []
    for r in results:
        agg = r.aggregate()
        row: dict[str, object] = {"policies": r.label}
        several_users = agg["users"]["mean"] > 1  # a trace's user ids: each user's mean wait counts once
        for column in SUMMARY_COLUMNS + (("user_mean_wait",) if several_users else ()):
            if column == "jobs":
                row[column] = r.jobs
            elif samples > 1:
                row[column] = f"{agg[column]['mean']:.2f} ± {agg[column]['std']:.2f}"
            else:
                row[column] = agg[column]["mean"]
        if windows:
            measures = [measure(run) for run in r.runs]
            row["expired"] = sum(m.expired for m in measures)
            row["reward"] = round(statistics.fmean(m.reward for m in measures), 1)
        if r.runs and r.runs[0].cluster.topology is not None:
            row["hops"] = round(statistics.fmean(mean_hops(run.jobs, run.cluster) for run in r.runs), 2)
        row["jobs/s"] = round(r.jobs / r.seconds) if r.seconds else 0
        rows.append(row)
    title = f"mean over {samples} samples (± std)" if samples > 1 else None
    return format_table(rows, title=title)


def _write_outputs(
    out: Path, results: Sequence[StudyResult], payload: dict[str, object], capacity: int, *, plots: bool
) -> None:
    from cosched.reporting.report import plot_run, write_jobs_csv

    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(payload, indent=2, default=float) + "\n")
    for r in results:
        for k, run in enumerate(r.runs):
            target = out / r.label if len(r.runs) == 1 else out / r.label / f"sample-{k}"
            write_jobs_csv(target / "jobs.csv", run.jobs)
            if plots:
                plot_run(target, run.jobs, capacity, title=r.label)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except CoschedError as exc:
        print(f"cosched: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`cosched replay ... | head`): not an error of ours.
        sys.stderr.close()
        return 0
    except OSError as exc:
        print(f"cosched: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cosched: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
