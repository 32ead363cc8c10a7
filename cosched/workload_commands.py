"""Commands for the real workflows: build their image, write a submission, check outputs.

``cosched images build`` makes the workflow image without a registry;
``cosched workloads write APP`` prints a workflow TOML for ``cosched submit
--workflow``; ``cosched workloads verify APP --dir DIR`` checks a finished
run's outputs (exit status 1 when they are wrong).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

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
    write.set_defaults(handler=_workloads_write)
    verify.set_defaults(handler=_workloads_verify)


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


def _workloads_write(args: argparse.Namespace) -> int:
    from workloads.real import real_workflow, spec_to_toml

    if args.cores < 1:
        raise ConfigError(f"--cores must be >= 1, got {args.cores}")
    args.dir.mkdir(parents=True, exist_ok=True)  # the daemon mounts only existing directories
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
