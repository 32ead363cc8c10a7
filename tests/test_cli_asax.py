"""`cosched experiment asax`, `cosched explain` and `cosched experts`, through the CLI."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from cosched.cli import main
from experts.tree import ExpertSet


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        rc = main(list(args))
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(rc: int, err: str, needle: str) -> None:
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and needle in lines[0], err


@pytest.fixture(scope="module")
def experiment_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("asax")
    buffer = io.StringIO()  # capsys is function-scoped: capture this module-wide run by hand
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(io.StringIO()):
        assert main(["experiment", "asax", "--sizes", "64", "--seeds", "1", "--repeats", "1", "--out", str(out)]) == 0
    return out, buffer.getvalue()


def test_experiment_prints_both_tables_beside_the_paper(experiment_out: tuple[Path, str]) -> None:
    _, text = experiment_out
    assert "Table 2" in text and "Table 3" in text and "Goals" in text
    table3 = text[text.index("Table 3") : text.index("Goals")]
    rows = [line for line in table3.splitlines() if line.startswith(("space sharing", "Static", "ASAx"))]
    assert len(rows) == 3
    assert "3.50" in rows[0] and "4.40" in rows[0]  # the paper's Slurm wait and response at 64 cores


def test_experiment_writes_logs_summary_and_plots(experiment_out: tuple[Path, str]) -> None:
    out, _ = experiment_out
    for name in ("decisions.jsonl", "training.jsonl", "summary.json", "makespan.png", "expert_weights.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "makespan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"slurm/64/seed1", "static/64/seed1", "asax/64/seed1"}
    first = json.loads((out / "decisions.jsonl").read_text().splitlines()[0])
    assert {"guest", "host", "distributions", "weights", "action", "loss"} <= set(first)


def test_explain_shows_each_experts_advice(capsys: pytest.CaptureFixture[str], experiment_out) -> None:
    out, _ = experiment_out
    decision = json.loads((out / "decisions.jsonl").read_text().splitlines()[0])
    rc, text, _ = cli(capsys, "explain", str(decision["host"]), "--log", str(out / "decisions.jsonl"))
    assert rc == 0
    assert f"job {decision['host']} as lender" in text
    assert f"[size {decision['size']}, seed {decision['seed']}] t=" in text  # which run of the log
    for name in decision["experts"]:
        assert f"expert {name}" in text
    rc, text, _ = cli(capsys, "explain", "999999", "--log", str(out / "decisions.jsonl"))
    assert rc == 0 and "no co-scheduling decision involves job 999999" in text


def test_fit_experts_from_the_experiments_decisions(capsys, experiment_out, tmp_path: Path) -> None:
    out, _ = experiment_out
    fitted = tmp_path / "fitted.json"
    rc, _, err = cli(capsys, "experts", "fit", str(out / "training.jsonl"), "--out", str(fitted), "--depth", "2")
    assert rc == 0, err
    loaded = ExpertSet.load(str(fitted))
    assert loaded.m == 10 and len(loaded) >= 1
    rc, text, _ = cli(capsys, "experts", "show", str(fitted))
    assert rc == 0 and "experts, m=10" in text


def test_show_default_experts(capsys: pytest.CaptureFixture[str]) -> None:
    rc, text, _ = cli(capsys, "experts", "show")
    assert rc == 0
    for name in ("cpu", "mem", "stage", "progress"):
        assert f"] {name}:" in text


def test_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    one_error(*cli(capsys, "experts", "show", str(broken))[::2], needle="broken.json")
    sums = tmp_path / "sums.json"
    doc = json.loads(Path(__file__).resolve().parents[1].joinpath("experts/default_experts.json").read_text())
    doc["experts"][0]["tree"]["below"]["below"]["dist"][0] += 0.5
    sums.write_text(json.dumps(doc))
    one_error(*cli(capsys, "experts", "show", str(sums))[::2], needle="sum")
    one_error(*cli(capsys, "explain", "3", "--log", str(tmp_path / "none.jsonl"))[::2], needle="not found")
    one_error(*cli(capsys, "experiment", "asax", "--sizes", "60")[::2], needle="multiples of 8")
    one_error(*cli(capsys, "experiment", "asax", "--seeds", "x")[::2], needle="--seeds")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    one_error(*cli(capsys, "experts", "fit", str(empty), "--out", str(tmp_path / "o.json"))[::2], needle="no decisions")
