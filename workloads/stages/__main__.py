"""``python3 -m workloads.stages APP STAGE --dir DIR [--set key=value ...]``: run one stage."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from .common import Progress, StageError, fail
from .usage import PeakMemory, record

APPS = ("montage", "blast", "statistics", "synthetic")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m workloads.stages", description=__doc__)
    parser.add_argument("app", help=f"one of {', '.join(APPS)}")
    parser.add_argument("stage")
    parser.add_argument("--dir", required=True, type=Path, help="the workflow's working directory")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a size parameter")
    args = parser.parse_args(argv)
    if args.app not in APPS:
        fail(f"unknown application {args.app!r} (known: {', '.join(APPS)})", 2)
    module = importlib.import_module(f".{args.app}", __package__)
    if args.stage not in module.STAGES:
        fail(f"unknown stage {args.stage!r} of {args.app} (known: {', '.join(module.STAGES)})", 2)
    params = dict(module.DEFAULTS)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in params:
            fail(f"bad --set {item!r}: {args.app} parameters are {', '.join(params)}", 2)
        try:
            params[key] = type(params[key])(value)
        except ValueError:
            fail(f"bad --set {item!r}: {key} must be a {type(params[key]).__name__}", 2)
    started = time.time()
    memory = PeakMemory().start()
    try:
        args.dir.mkdir(parents=True, exist_ok=True)
        progress = Progress(module.tasks(params)[args.stage])
        module.STAGES[args.stage](args.dir, params, progress)
    except StageError as exc:
        fail(f"{args.app}.{args.stage}: {exc}")
    record(args.dir, args.stage, started, memory.stop())
    print(f"{args.app}.{args.stage}: done", file=sys.stderr)


if __name__ == "__main__":
    main()
