"""Bad input to the offline commands is one clear line, never a traceback (an audit's findings).

Each case gives `cosched` a damaged file or an impossible option and expects exit status 2 and a
single `error:` line on stderr that names the problem (and the file, or the option). Most run
in-process through `main`, where an exception that escaped would fail the test; a few run the
real command, where a traceback would land on stderr.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import require_module
from swf_lines import job_line, write_text
from test_cli import assert_one_error as _assert_one_error

from cosched.cli import main
from cosched.learn.models import model_path
from cosched.learn.network import PolicyNetwork

ANY_COMMAND_ERROR = re.compile(r"^cosched(?: [a-z-]+)*: error: \S")
HUGE = "99999999999999999999"
BEYOND_FLOAT = "1" + "0" * 400
"""An integer JSON allows and no float holds (10^400)."""
NESTED = "[" * 100_000
"""Deeper than Python's JSON parser recurses."""
MARK = 123456.789


def assert_one_error(rc: int, err: str, *needles: str) -> str:
    """`test_cli.assert_one_error` for an error of any subcommand (`cosched experts fit: error: ...`)."""
    return _assert_one_error(rc, err, *needles, line=ANY_COMMAND_ERROR)


def with_huge(doc: dict[str, Any]) -> str:
    """`doc` as JSON, its value MARK written as 10^400 (which json.dumps cannot write)."""
    return json.dumps(doc).replace(str(MARK), BEYOND_FLOAT)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`cosched ARGS` in-process: (exit status, stdout, stderr)."""
    try:
        rc = main(list(args))
    except SystemExit as exc:  # argparse's usage errors exit from parse_args
        rc = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def fails(capsys: pytest.CaptureFixture[str], args: list[str], *needles: str) -> str:
    rc, _, err = run(capsys, *args)
    return assert_one_error(rc, err, *needles)


def fails_as_a_command(args: list[str], *needles: str, cwd: Path) -> str:
    """The real `python -m cosched.cli ARGS`, so an uncaught exception would show as a traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "cosched.cli", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )
    return assert_one_error(done.returncode, done.stderr, *needles)


# --------------------------------------------------------------------------- 1: sizes


def test_a_header_machine_size_beyond_any_machine_names_file_and_line(tmp_path: Path) -> None:
    trace = write_text(tmp_path / "big.swf", ["; Computer: x", f"; MaxProcs: {HUGE}", job_line(1)])
    fails_as_a_command(["replay", str(trace)], f"{trace}:2", "MaxProcs", HUGE, cwd=tmp_path)


def test_a_header_machine_too_large_to_replay_is_refused_before_the_replay(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = write_text(tmp_path / "large.swf", ["; MaxProcs: 50000000", job_line(1)])
    fails(capsys, ["replay", str(trace)], "50000000 processors", "--procs")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["replay", "lublin:50:16", "--procs", HUGE], ["--procs", "at most 10,000,000"]),
        (["replay", "lublin:50:16", "--procs", "100000000000"], ["--procs", "at most 10,000,000"]),
        (["replay", f"lublin:100:{HUGE}"], ["lublin:100:", "procs", HUGE]),
        (["replay", f"lublin:{HUGE}"], ["lublin:", "n_jobs", HUGE]),
        (["experiment", "asax", "--sizes", "99999999999999999992", "--repeats", "1"], ["--sizes", "at most"]),
        (["experiment", "deferrable", f"lublin:50:{HUGE}"], ["lublin:50:", "procs"]),
        (["experiment", "asax-long", "--size", HUGE], ["--size", "at most"]),
        (["replay", "lublin:50:16", "--samples", HUGE, "--length", "10"], ["--samples", "at most"]),
        (["replay", "lublin:50:16", "--seed", HUGE], ["--seed", "at most"]),
        (["experiment", "nsa", "--jobs", HUGE, "--windows", "0"], ["--jobs", "at most"]),
    ],
)
def test_sizes_and_counts_have_an_upper_bound(
    capsys: pytest.CaptureFixture[str], args: list[str], needles: list[str]
) -> None:
    fails(capsys, args, *needles)


# --------------------------------------------------------------------------- 2: model files


def _shipped_rlbf() -> PolicyNetwork:
    return PolicyNetwork.load(model_path("rlbf", "lublin-1"))


def _model(tmp_path: Path, name: str, config: dict[str, Any] | None = None, **layers: np.ndarray) -> Path:
    """The shipped lublin-1 rlbf model with its config replaced and layers (w1=..., b1=...) swapped."""
    good = _shipped_rlbf()
    weights = [layers.get(f"w{k}", w) for k, w in enumerate(good.weights)]
    biases = [layers.get(f"b{k}", b) for k, b in enumerate(good.biases)]
    return PolicyNetwork(config or good.config, tuple(weights), tuple(biases)).save(tmp_path / f"{name}.npz")


def _config(**changes: Any) -> dict[str, Any]:
    config = {**_shipped_rlbf().config, **changes}
    return {key: value for key, value in config.items() if value is not None}


def _replay_with(model: Path) -> list[str]:
    return ["replay", "lublin:60:16", "--compare", f"fcfs:[rlbf:{model}]"]


def test_a_model_whose_config_is_not_an_object_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "list.npz"
    np.savez(path, config=np.array(json.dumps([1, 2])), w0=np.zeros((2, 2)), b0=np.zeros(2))
    fails(capsys, _replay_with(path), str(path), "config is a JSON list")


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"window": None}, "no 'window'"),
        ({"window": "abc"}, "'window'"),
        ({"window": 10**12}, "'window'"),
        ({"time_scale": "nan"}, "'time_scale'"),
        ({"time_scale": None}, "no 'time_scale'"),
        ({"features": 7}, "5 features per job"),
        ({"activation": "gelu"}, "'activation'"),
        ({"log_time": "yes"}, "'log_time'"),
    ],
)
def test_a_model_config_is_checked_when_loaded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, config: dict[str, Any], needle: str
) -> None:
    path = _model(tmp_path, "bad", _config(**config))
    fails(capsys, _replay_with(path), str(path), needle)


@pytest.mark.parametrize(
    ("layers", "needle"),
    [
        ({"w1": np.zeros((3, 3), np.float32)}, "do not make a layer"),
        ({"w1": np.zeros((16, 31), np.float32)}, "do not chain"),
        ({"w3": np.zeros((2, 8), np.float32), "b3": np.zeros(2, np.float32)}, "not the 1 score"),
        ({"w0": np.full((32, 5), np.nan, np.float32)}, "not a finite number"),
    ],
)
def test_model_layers_must_chain_from_the_observation(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, layers: dict[str, np.ndarray], needle: str
) -> None:
    path = _model(tmp_path, "layers", **layers)
    fails(capsys, _replay_with(path), str(path), needle)


def test_every_shipped_model_passes_the_check() -> None:
    for path in sorted(model_path("rlbf", "lublin-1").parent.glob("*.npz")):
        PolicyNetwork.load(path)  # raises ConfigError if the check refused a good model


# --------------------------------------------------------------------------- 3: experts fit

FEATURES = {"cpu": 0.2, "mem": 0.4, "parallel": True, "progress": 0.5, "happiness": 1.3}
GOOD_RECORD = {"features": FEATURES, "action": 1, "loss": 0.1}


def _log(tmp_path: Path, bad_line: str) -> Path:
    lines = [json.dumps(GOOD_RECORD)] * 3 + [bad_line]
    return write_text(tmp_path / "log.jsonl", lines)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        pytest.param(json.dumps({**GOOD_RECORD, "features": {**FEATURES, "cpu": 1e308}}), "'cpu'", id="cpu-1e308"),
        pytest.param(with_huge({**GOOD_RECORD, "features": {**FEATURES, "cpu": MARK}}), "'cpu'", id="cpu-10^400"),
        pytest.param(with_huge({**GOOD_RECORD, "loss": MARK}), "loss", id="loss-10^400"),
        pytest.param(NESTED, "nested too deeply", id="nested"),
    ],
)
def test_a_decision_log_record_is_checked_with_its_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str, needle: str
) -> None:
    log = _log(tmp_path, line)
    fails(capsys, ["experts", "fit", str(log), "--out", str(tmp_path / "x.json")], f"{log}:4", needle)


def test_fit_depth_has_an_upper_bound(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = _log(tmp_path, json.dumps(GOOD_RECORD))
    fails(capsys, ["experts", "fit", str(log), "--out", str(tmp_path / "x.json"), "--depth", HUGE], "--depth")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        pytest.param("[1,2]", "expected a JSON object", id="list"),
        pytest.param(NESTED, "nested too deeply", id="nested"),
    ],
)
def test_a_state_files_decision_that_is_not_an_object(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, body: str, needle: str
) -> None:
    state = tmp_path / "state.sqlite"
    with sqlite3.connect(state) as db:
        db.execute("CREATE TABLE decisions (seq INTEGER PRIMARY KEY, body TEXT)")
        db.execute("INSERT INTO decisions VALUES (1, ?)", (body,))
    db.close()
    fails(capsys, ["experts", "fit", str(state), "--out", str(tmp_path / "x.json")], f"{state}: decision 1", needle)


# --------------------------------------------------------------------------- 4: expert sets


def _expert_set(threshold: str = "0.5", fractions: str = "[0.0, 0.5]") -> str:
    tree = (
        f'{{"feature": "cpu", "threshold": {threshold}, "below": {{"dist": [0.5, 0.5]}}, "above": {{"dist": [1, 0]}}}}'
    )
    return (
        f'{{"format": "cosched-experts", "version": 1, "m": 2, "lent_fractions": {fractions}, '
        f'"experts": [{{"name": "cpu", "tree": {tree}}}]}}'
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param(_expert_set(threshold=BEYOND_FLOAT), "threshold of 'cpu' must be finite", id="threshold"),
        pytest.param(_expert_set(fractions=f"[0, {BEYOND_FLOAT}]"), "'lent_fractions'", id="fraction"),
        pytest.param(NESTED, "nested too deeply", id="nested"),
    ],
)
def test_an_expert_set_is_checked_when_loaded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "experts.json"
    path.write_text(text)
    fails(capsys, ["experts", "show", str(path)], str(path), needle)


def test_a_good_hand_written_expert_set_loads(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "experts.json"
    path.write_text(_expert_set())
    rc, out, err = run(capsys, "experts", "show", str(path))
    assert rc == 0 and "cpu" in out, err


def test_asax_long_refuses_a_bad_expert_set_before_running(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "experts.json"
    path.write_text(_expert_set(threshold=BEYOND_FLOAT))
    args = ["experiment", "asax-long", "--size", "64", "--workflows", "1", "--seeds", "1", "--experts", str(path)]
    fails(capsys, args, str(path), "threshold")


# --------------------------------------------------------------------------- 5: placement options


@pytest.mark.parametrize("option", ["period=nan", "period=inf", f"iterations={HUGE}"])
def test_annealing_options_are_finite_and_bounded(capsys: pytest.CaptureFixture[str], option: str) -> None:
    args = ["replay", "lublin:60:16", "--fat-tree", "4", "--placement", f"sa:{option}"]
    fails(capsys, args, "sa:", option.partition("=")[2])


# --------------------------------------------------------------------------- 6: explain --log

DECISION = {
    "size": 64,
    "seed": 1,
    "time": 30.0,
    "guest": 9,
    "host": 7,
    "app_class": "blast.split",
    "features": {"cpu": 0.02, "mem": 0.05, "parallel": False, "progress": 0.25, "happiness": 1.0},
    "experts": ["cpu", "mem"],
    "distributions": [[0.5, 0.5], [0.9, 0.1]],
    "weights": [0.5, 0.5],
    "action": 1,
    "fraction": 0.5,
    "loss": None,
    "host_runtime": None,
    "executed": True,
    "note": None,
}


def _without(key: str) -> dict[str, Any]:
    return {k: v for k, v in DECISION.items() if k != key}


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        pytest.param("[1, 2]", "a JSON list", id="list"),
        pytest.param(json.dumps(_without("features")), "no 'features'", id="no-features"),
        pytest.param(json.dumps({**DECISION, "features": "abc"}), "'features'", id="features-text"),
        pytest.param(json.dumps({**DECISION, "time": None}), "'time'", id="time-null"),
        pytest.param(json.dumps({**DECISION, "time": "abc"}), "'time'", id="time-text"),
        pytest.param(json.dumps({**DECISION, "host": "7"}), "'host'", id="host-text"),
        pytest.param(json.dumps({**DECISION, "distributions": [[1.0]]}), "2 experts, 1 distributions", id="short"),
        pytest.param(json.dumps({**DECISION, "weights": 1}), "'weights'", id="weights-number"),
        pytest.param(with_huge({**DECISION, "fraction": MARK}), "'fraction'", id="fraction-10^400"),
        pytest.param(NESTED, "nested too deeply", id="nested"),
    ],
)
def test_explain_checks_each_record_and_names_its_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str, needle: str
) -> None:
    log = write_text(tmp_path / "decisions.jsonl", [json.dumps(DECISION), line])
    fails(capsys, ["explain", "7", "--log", str(log)], f"{log}:2", needle)


def test_explain_names_a_binary_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    log.write_bytes(json.dumps(DECISION).encode() + b"\n\xff\xfe\x00garbage\n")
    fails(capsys, ["explain", "7", "--log", str(log)], f"{log}:2", "UTF-8")


def test_explain_still_shows_a_good_record(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = write_text(tmp_path / "decisions.jsonl", [json.dumps(DECISION), "", json.dumps({**DECISION, "host": 8})])
    rc, out, err = run(capsys, "explain", "7", "--log", str(log))
    assert rc == 0 and "job 7 as lender" in out and "expert cpu" in out, err


# --------------------------------------------------------------------------- 7: train

TRAIN = ["train", "rlbf", "lublin:200:16", "--epochs", "1", "--steps", "16", "--length", "32", "--window", "8"]


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--ppo", "bogus=1"], ["--ppo", "unknown PPO argument 'bogus'"]),
        (["--ppo", "learning_rate=abc"], ["--ppo", "learning_rate"]),
        (["--ppo", "batch_size=0"], ["--ppo", "batch_size"]),
        (["--ppo", "n_steps=64"], ["--ppo", "--steps"]),
        (["--ppo", "clip_range=nan"], ["--ppo", "clip_range"]),
        (["--max-minutes", "nan"], ["--max-minutes"]),
    ],
)
def test_train_options_are_checked_before_training(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], needles: list[str]
) -> None:
    out = tmp_path / "run"
    fails(capsys, [*TRAIN, "--out", str(out), *extra], *needles)
    assert not out.exists()


def test_good_ppo_arguments_parse_to_their_types() -> None:
    from cosched.cli import _ppo_argument

    assert _ppo_argument("target_kl=none") == ("target_kl", None)
    assert _ppo_argument("gae_lambda=1") == ("gae_lambda", 1.0)
    assert _ppo_argument("batch_size=4096") == ("batch_size", 4096)
    assert _ppo_argument("normalize_advantage=False") == ("normalize_advantage", False)


def _run_to_resume(tmp_path: Path, **settings: Any) -> Path:
    """An --out as a run leaves it (settings, a checkpoint), with `settings` over the real ones."""
    from dataclasses import asdict

    from cosched.learn.train import TrainSettings

    out = tmp_path / "run"
    out.mkdir()
    saved = asdict(TrainSettings(kind="rlbf", trace="lublin:200:16", steps=16, length=32, window=8))
    (out / "settings.json").write_text(json.dumps({**saved, **settings}))
    (out / "checkpoint.zip").write_bytes(b"\x0aW\xad\xb0 not a zip")
    return out


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("training.jsonl", "training.jsonl:2"),
        ("settings.json", "settings.json: not JSON"),
        ("window", "'window' is 'x'"),
        ("checkpoint.zip", "checkpoint.zip: not a checkpoint"),
    ],
)
def test_resume_names_the_damaged_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, damage: str, needle: str
) -> None:
    require_module("sb3_contrib")
    out = _run_to_resume(tmp_path, **({"window": "x"} if damage == "window" else {}))
    if damage == "training.jsonl":
        (out / damage).write_text('{"epoch": 1, "wall_s": 0.5}\ngarbage\n')
    if damage == "settings.json":
        (out / damage).write_text("garbage{")
    fails(capsys, [*TRAIN, "--out", str(out), "--epochs", "2", "--resume"], needle)


# --------------------------------------------------------------------------- 8: workloads write


@pytest.mark.parametrize(
    ("option", "needle"),
    [
        (["--owner", "abc"], "--owner"),
        (["--owner", f"{HUGE}:1"], "--owner"),
        (["--walltime", "nan"], "--walltime"),
        (["--walltime", "-1"], "--walltime"),
        (["--name", "bad name"], "--name 'bad name'"),
        (["--size", "bogus"], "unknown size 'bogus' for montage"),
        (["--set", "nosuch=1"], "nosuch"),
    ],
)
def test_workloads_write_checks_options_before_making_the_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, option: list[str], needle: str
) -> None:
    data = tmp_path / "data"
    fails(capsys, ["workloads", "write", "montage", "--dir", str(data), "--image", "x", *option], needle)
    assert not data.exists()


def test_workloads_write_refuses_a_relative_dir_before_making_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    fails(capsys, ["workloads", "write", "montage", "--dir", "data", "--image", "x"], "--dir must be an absolute path")
    assert not (tmp_path / "data").exists()


# --------------------------------------------------------------------------- 9, 10: replay --out, empty values


def test_replay_out_that_is_a_file_is_refused_before_the_trace_is_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    taken = tmp_path / "taken"
    taken.write_text("not a folder\n")
    missing = tmp_path / "missing.swf"  # read after the --out check: its error would come first otherwise
    fails(capsys, ["replay", str(missing), "--out", str(taken)], "--out", "not a directory")


def test_replay_out_with_a_folder_where_jobs_csv_goes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "fcfs+easy" / "jobs.csv").mkdir(parents=True)
    fails(capsys, ["replay", "lublin:60:16", "--out", str(out), "--no-plots"], "--out", "jobs.csv is a directory")
    assert not (out / "summary.json").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["replay", "lublin:60:16", "--compare", ""], "--compare is empty"),
        (["replay", ""], "the workload is empty"),
        (["replay", "lublin:60:16", "--queue", " "], "--queue is empty"),
    ],
)
def test_empty_values_are_refused_not_taken_for_the_default(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    fails(capsys, args, needle)
