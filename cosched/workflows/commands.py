"""Commands for the real workflows: build their image, write a submission, check outputs.

``cosched images build`` makes the workflow image without a registry;
``cosched workloads write APP`` prints a workflow TOML for ``cosched submit
--workflow``; ``cosched workloads verify APP --dir DIR`` checks a finished
run's outputs (exit status 1 when they are wrong).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import workloads
from cosched.errors import ConfigError
from workloads.workflows import APPS


def add_workload_commands(commands: Any, parser_class: type) -> None:
    ip = commands.add_parser("images", help="build the workflow image without a registry")
    verbs = ip.add_subparsers(dest="images", required=True, parser_class=parser_class)
    build = verbs.add_parser("build", help="debootstrap + import (once), then add the stage programs")
    build.add_argument("--mirror", help="Debian mirror (default: $COSCHED_DEBIAN_MIRROR or deb.debian.org)")
    build.set_defaults(handler=_images_build)

    wp = commands.add_parser("workloads", help="the Montage, BLAST, Statistics and Synthetic workflows")
    verbs = wp.add_subparsers(dest="workloads", required=True, parser_class=parser_class)
    write = verbs.add_parser("write", help="print a workflow TOML for `cosched submit --workflow`")
    verify = verbs.add_parser("verify", help="check a finished workflow's outputs")
    for parser in (write, verify):
        parser.add_argument("app", choices=APPS)
        parser.add_argument("--dir", type=Path, required=True, help="the workflow's data directory (absolute)")
        parser.add_argument("--size", default="test", help="test (seconds), small (a minute) or study")
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a size parameter")
    write.add_argument("--cores", type=int, default=1)
    write.add_argument("--name", help="workflow name (default: APP-CORES)")
    write.add_argument("--image", help="image tag (default: build or reuse the workflow image)")
    write.add_argument("--walltime", type=float, default=3600.0, help="seconds per stage")
    write.add_argument(
        "--owner",
        default="65534:65534",
        help="uid:gid given the data dir when run as root: the daemon's docker.job_user (default 65534:65534)",
    )
    write.set_defaults(handler=_workloads_write)
    verify.set_defaults(handler=_workloads_verify)

    cp = commands.add_parser("calibrate", help="measure the real stages and write the replay's profiles")
    cp.add_argument("--size", default="small", help="workflow size to measure (default small)")
    cp.add_argument("--apps", type=_apps, default=list(APPS), help="comma-separated (default: all four)")
    cp.add_argument("--out", type=Path, default=Path("profiles-host.toml"), help="profiles file to write")
    cp.add_argument("--dir", type=Path, help="scratch directory for the stages' data (default: a temporary one)")
    cp.add_argument("--no-pairs", action="store_true", help="skip the co-located pairs (keep the shipped betas)")
    cp.add_argument("--refit", type=Path, metavar="MEASUREMENTS", help="fit again from a saved measurements file")
    cp.set_defaults(handler=_calibrate)


def add_real_options(parser: argparse.ArgumentParser) -> None:
    """`cosched experiment asax --real` and its options."""
    parser.add_argument("--real", action="store_true", help="run the mix on the local Docker engine")
    parser.add_argument("--size", default="small", help="with --real: workflow size (default small)")
    parser.add_argument(
        "--profiles", type=Path, help="with --real: calibrated profiles (default: workloads/profiles-host.toml)"
    )
    parser.add_argument(
        "--strategies", type=_strategies, default=["slurm", "static", "asax"], help="with --real: which to run"
    )
    parser.add_argument(
        "--measured",
        type=Path,
        metavar="SUMMARY",
        help="with --real: run nothing; hold an earlier run's summary.json against the replay (after recalibrating)",
    )


def _apps(text: str) -> list[str]:
    apps = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [app for app in apps if app not in APPS]
    if unknown or not apps:
        raise argparse.ArgumentTypeError(f"unknown application(s) {unknown} (known: {', '.join(APPS)})")
    return apps


def _strategies(text: str) -> list[str]:
    known = ("slurm", "static", "asax")
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    if not chosen or any(s not in known for s in chosen):
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(known)}, got {text!r}")
    return chosen


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _scratch(path: Path | None, prefix: str) -> Path:
    """A directory containers may mount: the one given, or a fresh one under /var/tmp."""
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        return path.resolve()
    import tempfile

    return Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp" if Path("/var/tmp").is_dir() else None))


def _engine() -> Any:
    import docker
    import docker.errors

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise ConfigError(f"cannot reach the Docker engine: {exc}") from None
    return client


def _calibrate(args: argparse.Namespace) -> int:
    from datetime import date

    from cosched.experiments.asax_real import host_cpus
    from cosched.workflows.calibration import calibrate, machine_description, profiles_toml
    from workloads.images import workflow_image

    cpus = host_cpus()
    if args.refit is not None:
        from cosched.workflows.calibration import refit

        try:
            document = json.loads(args.refit.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{args.refit}: cannot read measurements: {exc}") from None
        result = refit(document, len(cpus))
        args.out.write_text(profiles_toml(result.profiles, result.params, _refit_header(args.out, args.refit)))
        print(
            f"wrote {args.out} ({len(result.profiles)} profiles, beta_io {result.params.beta_io}, "
            f"beta_mem {result.params.beta_mem})"
        )
        return 0
    client = _engine()
    image = workflow_image(client, log=_say)
    root = _scratch(args.dir, "cosched-calibrate-")
    try:
        result = calibrate(client, image, root, cpus, size=args.size, apps=args.apps, pairs=not args.no_pairs, log=_say)
    finally:
        if args.dir is None:  # ours: Montage's data alone is gigabytes at the small size
            shutil.rmtree(root, ignore_errors=True)
    header = [
        f"Stage profiles measured by `cosched calibrate --size {args.size}` on {date.today().isoformat()}:",
        machine_description(cpus) + ".",
        f"Image {image}; {len(result.stages)} stages, {len(result.pairs)} pairs, {result.seconds:.0f} s of runs.",
        "Each stage ran alone on all CPUs, on one CPU (parallel stages), under half its measured CPU",
        "demand, and at half its allocation beside a CPU-bound neighbour; pairs ran together on all",
        "CPUs at half quota each. See cosched/workflows/calibration.py; raw runs in profiles-host.measurements.json.",
        "The [interference] betas come from the pairs (least squares on log runtimes).",
    ]
    profiles, params = result.profiles, result.params
    raw: dict[str, list[Any]] = {
        "stages": [asdict(m) for m in result.stages],
        "pairs": [asdict(m) for m in result.pairs],
    }
    measurements = args.out.with_suffix(".measurements.json")
    if set(args.apps) != set(APPS) and args.out.exists():
        # Recalibrating some workflows: the others' profiles (and, without pairs, the betas) stay.
        from cosched.workflows.interference import load_params, load_profiles

        kept = {name: p for name, p in load_profiles(args.out).items() if name.split(".")[0] not in args.apps}
        profiles = {**kept, **profiles}
        if not result.pairs:
            params = load_params(args.out)
        previous = [line[2:] for line in args.out.read_text().splitlines() if line.startswith("# ")]
        again = f"Then {', '.join(args.apps)} recalibrated alone ({date.today().isoformat()}):"
        header = [*previous, again, *header[2:3]]
        raw = _merge_measurements(measurements, raw, args.apps)
    args.out.write_text(profiles_toml(profiles, params, header))
    measurements.write_text(json.dumps(raw, indent=1))
    print(f"wrote {args.out} ({len(profiles)} profiles, beta_io {params.beta_io}, beta_mem {params.beta_mem})")
    return 0


def _merge_measurements(path: Path, new: dict[str, list[Any]], apps: list[str]) -> dict[str, list[Any]]:
    """The saved raw runs with `apps`' stages (and, when measured, the pairs) replaced, so `--refit` sees all."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return new
    kept = [m for m in saved.get("stages", []) if m["app_class"].split(".")[0] not in apps]
    return {"stages": kept + new["stages"], "pairs": new["pairs"] or saved.get("pairs", [])}


def experiment_real(args: argparse.Namespace) -> int:
    """`cosched experiment asax --real`: the mix on this host under each strategy, replay beside it."""
    from cosched.experiments import asax_real_report as report
    from cosched.experiments.asax_real import host_cpus, predict, scaled_mix
    from cosched.workflows.interference import load_params, load_profiles

    profiles_path = args.profiles or Path(workloads.__file__).parent / "profiles-host.toml"
    profiles, params = load_profiles(profiles_path), load_params(profiles_path)
    if args.measured is not None:
        real, settings = report.read_measured(args.measured, len(host_cpus()))
        settings = {"size": args.size, "seeds": args.seeds, "repeats": args.repeats or 1, **settings}
    else:
        settings = {
            "host_cores": len(host_cpus()),
            "size": args.size,
            "seeds": args.seeds,
            "repeats": args.repeats or 1,
        }
        root = _scratch(args.out, "cosched-real-")
        real = _run_live(args, settings, profiles, root)
    mix = scaled_mix(settings["host_cores"], settings["repeats"])
    predicted = {
        strategy: predict(
            strategy, mix, profiles, params, settings["host_cores"], size=settings["size"], seeds=settings["seeds"]
        )
        for strategy in real
    }
    print(report.table2(real, predicted))
    print()
    print(report.table3(real, predicted))
    print()
    print(report.format_agreement(report.agreement(real, predicted)))
    if args.measured is None:
        report.write_json(real, predicted, root / "summary.json", settings)
        _say(f"wrote {root / 'summary.json'}")
    failed = [(run.strategy, w) for run in real.values() for w in run.workflows if not w.ok]
    for strategy, w in failed:
        _say(f"{strategy} {w.name}: {'; '.join(w.problems)}")
    return 1 if failed else 0


def _run_live(
    args: argparse.Namespace, settings: dict[str, Any], profiles: dict[str, Any], root: Path
) -> dict[str, Any]:
    """Each strategy's runs on a daemon of its own (ASAx once per seed), averaged."""
    from cosched.experiments.asax_real import mean_run, run_real, sampled_seeds, scaled_mix
    from workloads.images import workflow_image

    client = _engine()
    image = workflow_image(client, log=_say)
    host = settings["host_cores"]
    mix = scaled_mix(host, settings["repeats"])
    real = {}
    for strategy in args.strategies:
        seeds = sampled_seeds(strategy, args.seeds)
        runs = []
        for seed in seeds:
            _say(f"{strategy}, seed {seed}: {len(mix)} workflows on {host} cores")
            where = root / strategy if len(seeds) == 1 else root / f"{strategy}-seed{seed}"
            runs.append(run_real(strategy, mix, image, where, host, profiles, size=args.size, seed=seed, log=_say))
        real[strategy] = mean_run(runs)
    return real


def _overrides(items: list[str]) -> dict[str, str]:
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key] = value
    return overrides


def _images_build(args: argparse.Namespace) -> int:
    from workloads.images import workflow_image

    print(workflow_image(mirror=args.mirror, log=lambda line: print(line, file=sys.stderr)))
    return 0


def _check_write(args: argparse.Namespace) -> None:
    """The options by the daemon's own rules (`cosched.daemon.specs`), before the data directory is
    made or an image built: a TOML that `cosched submit` would refuse is never written."""
    from pydantic import TypeAdapter, ValidationError

    from cosched.daemon.specs import MAX_WALLTIME, Name
    from workloads.real import parse_owner, size_params

    if args.cores < 1:
        raise ConfigError(f"--cores must be >= 1, got {args.cores}")
    if not 0 < args.walltime <= MAX_WALLTIME:  # NaN fails this too
        raise ConfigError(f"--walltime must be in (0, {MAX_WALLTIME:.0f}] seconds, got {args.walltime}")
    if args.name is not None:
        try:
            TypeAdapter(Name).validate_python(args.name)
        except ValidationError as exc:
            raise ConfigError(f"--name {args.name!r}: {exc.errors()[0]['msg']}") from None
    try:
        parse_owner(args.owner)
    except ConfigError as exc:
        raise ConfigError(f"--owner: {exc}") from None
    size_params(args.app, args.size, _overrides(args.set))  # `--size bogus` made the directory first
    if not args.dir.is_absolute():
        raise ConfigError(f"--dir must be an absolute path, got {str(args.dir)!r}")


def _workloads_write(args: argparse.Namespace) -> int:
    from workloads.real import make_data_dir, real_workflow, spec_to_toml

    _check_write(args)
    make_data_dir(args.dir, args.owner)  # the daemon mounts only existing directories, and jobs run as `owner`
    image = args.image
    if image is None:
        from workloads.images import workflow_image

        image = workflow_image(log=lambda line: print(line, file=sys.stderr))
    spec = real_workflow(
        args.app,
        cores=args.cores,
        data_dir=args.dir,
        image=image,
        size=args.size,
        overrides=_overrides(args.set),
        name=args.name,
        walltime=args.walltime,
    )
    sys.stdout.write(spec_to_toml(spec))
    return 0


def _workloads_verify(args: argparse.Namespace) -> int:
    from workloads.real import verify

    problems = verify(args.app, args.dir, args.size, _overrides(args.set))
    for problem in problems:
        print(f"{args.app}: {problem}")
    if not problems:
        print(f"{args.app}: outputs in {args.dir} are right")
    return 1 if problems else 0


def _refit_header(out: Path, measurements: Path) -> list[str]:
    from datetime import date

    previous = []
    if out.exists():
        previous = [line[2:] for line in out.read_text().splitlines() if line.startswith("# ") and "refit" not in line]
    return [*previous, f"Profiles refitted from {measurements.name} on {date.today().isoformat()}."]
