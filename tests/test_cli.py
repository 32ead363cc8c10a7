"""Tests of the `cosched replay` command line (cosched/cli.py), run in-process through `main`."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import missing, real_trace
from swf_lines import job_line, write_text

from cosched.cli import main
from cosched.reporting.report import CSV_COLUMNS
from cosched.traces.swf import write_swf
from workloads.lublin import generate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("utilization.png", "queue_length.png", "wait_distribution.png")
# argparse reports usage errors under the subcommand's name ("cosched replay: error: ...").
ERROR_LINE = re.compile(r"^cosched(?: replay)?: error: \S")


GOOD_LINES = ["; MaxProcs: 8", *(job_line(i) for i in range(1, 6))]


@pytest.fixture
def good_swf(tmp_path: Path) -> Path:
    """Five 4-processor jobs on an 8-processor machine."""
    return write_text(tmp_path / "good.swf", GOOD_LINES)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`cosched replay ARGS` in-process: (exit status, stdout, stderr)."""
    try:
        rc = main(["replay", *args])
    except SystemExit as exc:  # argparse usage errors exit from parse_args
        rc = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_error(rc: int, err: str, *needles: str, line: re.Pattern[str] = ERROR_LINE) -> str:
    """Exit status 2 and exactly one `cosched: error:` line (as `line` matches) on stderr, naming the problem."""
    assert rc == 2, err
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert line.match(lines[0]), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def table_rows(out: str) -> dict[str, dict[str, str]]:
    """The rows of a single-sample summary table, by policy label."""
    lines = out.strip().splitlines()
    rule = next(i for i, line in enumerate(lines) if line and set(line) <= {"-", " "})
    header = lines[rule - 1].split()
    rows = {}
    for line in lines[rule + 1 :]:
        cells = line.split()
        assert len(cells) == len(header), line
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def json_results(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    rc, out, err = run_cli(capsys, *args, "--json")
    assert rc == 0, err
    return json.loads(out)


def without_timings(payload: dict) -> dict:
    for result in payload["results"].values():
        result.pop("replay_seconds")
    return payload


# --------------------------------------------------------------------------- happy paths


def test_default_workload_run(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys, "--length", "300")
    assert rc == 0, err
    rows = table_rows(out)
    assert list(rows) == ["fcfs+easy"]
    assert rows["fcfs+easy"]["jobs"] == "300"
    assert float(rows["fcfs+easy"]["mean_wait"]) >= 0
    assert 0 < float(rows["fcfs+easy"]["utilization"]) <= 1
    # The embedded default workload: 10,000 Lublin jobs on 256 processors.
    assert err.splitlines()[0] == "lublin-256-s1: 10000 jobs on 256 nodes x 1 cores (core allocation)"


def test_generated_workload_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys, "lublin:300:64")
    assert rc == 0, err
    assert table_rows(out)["fcfs+easy"]["jobs"] == "300"
    assert "lublin-64-s1: 300 jobs on 64 nodes x 1 cores" in err
    assert "jobs kept: 300" in err


def test_json_output(capsys: pytest.CaptureFixture[str], good_swf: Path) -> None:
    payload = json_results(capsys, str(good_swf))
    assert payload["workload"] == "good"
    assert payload["samples"] == 1
    result = payload["results"]["fcfs+easy"]
    [summary] = result["per_sample"]
    assert summary["jobs"] == 5
    assert summary["capacity_cores"] == 8
    assert result["aggregate"]["jobs"] == {"mean": 5.0, "std": 0.0, "min": 5.0, "max": 5.0}
    assert result["rejected"] == 0
    assert result["replay_seconds"] >= 0


def test_json_prints_nothing_but_json(capsys: pytest.CaptureFixture[str], good_swf: Path) -> None:
    rc, out, err = run_cli(capsys, str(good_swf), "--json")
    assert rc == 0
    assert set(json.loads(out)) == {"workload", "samples", "results", "load_report"}
    assert err == ""


def test_window_selects_exact_jobs(capsys: pytest.CaptureFixture[str], good_swf: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    rc, out, err = run_cli(capsys, str(good_swf), "--start", "1", "--length", "3", "--out", str(out_dir), "--no-plots")
    assert rc == 0, err
    assert table_rows(out)["fcfs+easy"]["jobs"] == "3"
    with (out_dir / "fcfs+easy" / "jobs.csv").open() as fh:
        assert [int(row["id"]) for row in csv.DictReader(fh)] == [2, 3, 4]


def test_out_writes_summary_csv_and_plots(capsys: pytest.CaptureFixture[str], good_swf: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "results" / "nested"
    rc, out, err = run_cli(capsys, str(good_swf), "--out", str(out_dir))
    assert rc == 0, err
    assert f"wrote {out_dir}/" in err
    assert table_rows(out)["fcfs+easy"]["jobs"] == "5"

    summary = json.loads((out_dir / "summary.json").read_text())
    result = summary["results"]["fcfs+easy"]
    assert len(result["per_sample"]) == 1
    assert result["per_sample"][0]["jobs"] == 5
    assert result["aggregate"]["mean_wait"]["mean"] == pytest.approx(result["per_sample"][0]["mean_wait"])

    with (out_dir / "fcfs+easy" / "jobs.csv").open() as fh:
        rows = list(csv.reader(fh))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) == 1 + 5
    assert sorted(int(r[0]) for r in rows[1:]) == [1, 2, 3, 4, 5]

    for name in PLOTS:
        data = (out_dir / "fcfs+easy" / name).read_bytes()
        assert data[:8] == PNG_MAGIC, name


def test_out_no_plots(capsys: pytest.CaptureFixture[str], good_swf: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    rc, _, err = run_cli(capsys, str(good_swf), "--out", str(out_dir), "--no-plots", "--compare", "fcfs:none,sjf:easy")
    assert rc == 0, err
    assert not list(out_dir.rglob("*.png"))
    assert (out_dir / "summary.json").is_file()
    assert (out_dir / "fcfs+none" / "jobs.csv").is_file()
    assert (out_dir / "sjf+easy" / "jobs.csv").is_file()


def test_out_with_samples(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    rc, _, err = run_cli(
        capsys,
        "lublin:100:16",
        "--samples",
        "2",
        "--length",
        "20",
        "--out",
        str(out_dir),
        "--no-plots",
        "--json",
    )
    assert rc == 0, err
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["samples"] == 2
    assert len(summary["results"]["fcfs+easy"]["per_sample"]) == 2
    for k in range(2):
        lines = (out_dir / "fcfs+easy" / f"sample-{k}" / "jobs.csv").read_text().splitlines()
        assert len(lines) == 1 + 20


def test_compare_three_sets(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys, "lublin:200:32", "--compare", "fcfs:none,fcfs:easy,sjf:easy")
    assert rc == 0, err
    rows = table_rows(out)
    assert list(rows) == ["fcfs+none", "fcfs+easy", "sjf+easy"]
    assert all(row["jobs"] == "200" for row in rows.values())


def test_compare_json_invariants(capsys: pytest.CaptureFixture[str]) -> None:
    payload = json_results(capsys, "lublin:200:32:0.9", "--compare", "fcfs:none,fcfs:easy,sjf:easy,f1:conservative")
    results = payload["results"]
    assert list(results) == ["fcfs+none", "fcfs+easy", "sjf+easy", "f1+conservative"]
    for label, result in results.items():
        [summary] = result["per_sample"]
        assert summary["jobs"] == 200, label
        assert result["rejected"] == 0, label
        assert 0 < summary["utilization"] <= 1, label
        assert summary["mean_wait"] >= 0, label
        assert summary["mean_response"] >= summary["mean_wait"], label
        assert summary["mean_bsld"] >= 1, label
    # Same jobs, same run times: mean response - mean wait (the mean run time) agrees across policies.
    runs = [r["per_sample"][0]["mean_response"] - r["per_sample"][0]["mean_wait"] for r in results.values()]
    assert runs == pytest.approx([runs[0]] * len(runs))


def test_compare_default_sets(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys, "lublin:80:16", "--compare")
    assert rc == 0, err
    assert list(table_rows(out)) == [
        "fcfs+easy",
        "fcfs+easy-actual",
        "sjf+easy",
        "sjf+easy-actual",
        "wfp3+easy",
        "f1+easy",
    ]


def test_samples_deterministic_per_seed(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--samples", "3", "--length", "100")
    first = without_timings(json_results(capsys, *args, "--seed", "7"))
    second = without_timings(json_results(capsys, *args, "--seed", "7"))
    other = without_timings(json_results(capsys, *args, "--seed", "8"))
    assert first == second
    assert first["samples"] == 3
    assert len(first["results"]["fcfs+easy"]["per_sample"]) == 3
    assert first["results"] != other["results"]


def test_seed_changes_only_the_sampling_of_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_swf(tmp_path / "gen.swf", generate(300, 32, seed=4))
    args = (str(path), "--samples", "4", "--length", "50", "--no-plots")
    a = without_timings(json_results(capsys, *args, "--seed", "1"))
    b = without_timings(json_results(capsys, *args, "--seed", "1"))
    c = without_timings(json_results(capsys, *args, "--seed", "2"))
    assert a == b
    assert a["workload"] == c["workload"] == "gen"
    assert a["results"] != c["results"]


@pytest.mark.parametrize("backfill", ["none", "easy", "conservative"])
def test_validate_every_backfill(capsys: pytest.CaptureFixture[str], backfill: str) -> None:
    payload = json_results(capsys, "lublin:150:32:0.9", "--backfill", backfill, "--validate")
    [result] = payload["results"].values()
    assert result["per_sample"][0]["jobs"] == 150
    assert list(payload["results"]) == [f"fcfs+{backfill}"]


def test_node_allocation(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_text(tmp_path / "nodes.swf", ["; MaxNodes: 2", "; MaxProcs: 8", *GOOD_LINES[1:]])
    rc, out, err = run_cli(capsys, str(path), "--allocation", "node")
    assert rc == 0, err
    assert "nodes: 5 jobs on 2 nodes x 4 cores (node allocation)" in err
    assert table_rows(out)["fcfs+easy"]["jobs"] == "5"


def test_drop_cancelled(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_text(tmp_path / "cancel.swf", [*GOOD_LINES, job_line(6, status=5, runtime=30)])
    kept = json_results(capsys, str(path))
    dropped = json_results(capsys, str(path), "--drop-cancelled")
    assert kept["results"]["fcfs+easy"]["per_sample"][0]["jobs"] == 6
    assert dropped["results"]["fcfs+easy"]["per_sample"][0]["jobs"] == 5

    rc, out, err = run_cli(capsys, str(path), "--drop-cancelled")
    assert rc == 0
    assert "dropped: cancelled (status 5, --drop-cancelled): 1" in err
    assert table_rows(out)["fcfs+easy"]["jobs"] == "5"
    rc, _, err = run_cli(capsys, str(path))
    assert "kept: cancelled after starting (ran until cancelled): 1" in err


def test_progress_bar_keeps_stdout_clean(capsys: pytest.CaptureFixture[str]) -> None:
    payload = json_results(capsys, "lublin:60:16", "--progress")
    assert payload["results"]["fcfs+easy"]["per_sample"][0]["jobs"] == 60


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--queue", "bogus"], ["unknown queue policy 'bogus'", "fcfs", "sjf", "wfp3"]),
        (["--backfill", "bogus"], ["unknown backfill policy 'bogus'", "easy", "conservative"]),
        (["--estimate", "bogus"], ["unknown estimate policy 'bogus'", "requested", "actual"]),
        (["--placement", "bogus"], ["unknown placement policy 'bogus'", "first-fit"]),
        (["--compare", "fcfs:easy,sjf:bogus"], ["unknown backfill policy 'bogus'"]),
        (["--queue", "no_such_module_xyz:Queue"], ["no_such_module_xyz"]),
        (["--length", "-1"], ["--length"]),
        (["--length", "0"], ["--length"]),
        (["--length", "ten"], ["--length", "'ten'"]),
        (["--start", "-1"], ["--start"]),
        (["--start", "100"], ["start 100", "100 jobs"]),
        (["--samples", "2"], ["--samples needs --length"]),
        (["--samples", "0", "--length", "5"], ["--samples"]),
        (["--samples", "2", "--length", "101"], ["--length 101", "100 jobs"]),
        (["--compare", "fcfs"], ["bad policy set 'fcfs'"]),
        (["--compare", "fcfs:easy:actual:x"], ["bad policy set 'fcfs:easy:actual:x'"]),
        (["--compare", ","], ["no policy sets"]),
        (["--allocation", "bogus"], ["--allocation", "'bogus'"]),
        (["--procs", "0"], ["--procs"]),
        (["--seed", "x"], ["--seed"]),
        (["--no-such-option"], ["--no-such-option"]),
    ],
)
def test_bad_options(capsys: pytest.CaptureFixture[str], args: list[str], needles: list[str]) -> None:
    # --json: the trace summary lines are not printed, so stderr holds only the error.
    rc, out, err = run_cli(capsys, "lublin:100:16", "--json", *args)
    assert_one_error(rc, err, *needles)
    assert out == ""


@pytest.mark.parametrize(
    ("spec", "needles"),
    [
        ("lublin:abc", ["bad generated workload 'lublin:abc'"]),
        ("lublin:10:32:high", ["bad generated workload"]),
        ("lublin:0:32", ["n_jobs", "0"]),
        ("lublin:10:0", ["procs", "0"]),
        ("lublin:10:32:0", ["load"]),
    ],
)
def test_bad_generated_workload(capsys: pytest.CaptureFixture[str], spec: str, needles: list[str]) -> None:
    rc, out, err = run_cli(capsys, spec)
    assert_one_error(rc, err, *needles)
    assert out == ""


def test_missing_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "missing.swf"
    rc, _, err = run_cli(capsys, str(path))
    assert_one_error(rc, err, "not found", str(path))


def test_unreadable_trace_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = run_cli(capsys, str(tmp_path))
    assert_one_error(rc, err, "cannot read trace", str(tmp_path))


def test_garbage_line_and_lenient(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = [*GOOD_LINES[:3], "this line is garbage", *GOOD_LINES[3:]]
    path = write_text(tmp_path / "garbage.swf", lines)
    rc, out, err = run_cli(capsys, str(path))
    assert_one_error(rc, err, f"{path}:4:", "--lenient")
    assert out == ""

    rc, out, err = run_cli(capsys, str(path), "--lenient")
    assert rc == 0, err
    assert "malformed lines skipped (--lenient): 1" in err
    assert "jobs kept: 5" in err
    assert table_rows(out)["fcfs+easy"]["jobs"] == "5"


def test_non_numeric_field_names_line_and_field(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_text(tmp_path / "token.swf", [*GOOD_LINES, job_line(6, runtime="abc")])
    rc, _, err = run_cli(capsys, str(path))
    assert_one_error(rc, err, f"{path}:7:", "runtime", "'abc'")


def test_argparse_error_prefix_and_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["replay", "--allocation", "bogus"])
    assert info.value.code == 2
    _, err = capsys.readouterr()
    assert_one_error(2, err, "invalid choice")


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["replay", "--help"])
    assert info.value.code == 0
    assert "--samples" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["queue", "backfill", "estimate", "placement"])
def test_unknown_policy_is_the_only_stderr_line_in_table_mode(capsys: pytest.CaptureFixture[str], kind: str) -> None:
    # Without --json the trace summary goes to stderr; a bad name must fail before it is printed.
    rc, out, err = run_cli(capsys, "lublin:50:16", f"--{kind}", "bogus")
    assert_one_error(rc, err, f"unknown {kind} policy 'bogus'")
    assert out == ""


@pytest.mark.parametrize(
    "args",
    [
        ["--queue", "cosched.policies.queue:SJF"],
        ["--estimate", "cosched.policies.estimate:Actual"],
        ["--backfill", "cosched.policies.conservative:Conservative"],
    ],
)
def test_policy_given_as_module_class(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    payload = json_results(capsys, "lublin:50:16", *args)
    [result] = payload["results"].values()
    assert result["per_sample"][0]["jobs"] == 50


def test_module_class_same_schedule_as_alias(capsys: pytest.CaptureFixture[str]) -> None:
    by_alias = json_results(capsys, "lublin:120:16:0.9", "--queue", "sjf")
    by_class = json_results(capsys, "lublin:120:16:0.9", "--queue", "cosched.policies.queue:SJF")
    [alias_result] = by_alias["results"].values()
    [class_result] = by_class["results"].values()
    assert alias_result["per_sample"] == class_result["per_sample"]


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("no_such_module_xyz:Queue", "no_such_module_xyz"),
        ("cosched.policies.queue:NoSuchClass", "NoSuchClass"),
    ],
)
def test_missing_module_class(capsys: pytest.CaptureFixture[str], spec: str, needle: str) -> None:
    rc, _, err = run_cli(capsys, "lublin:50:16", "--queue", spec)
    assert_one_error(rc, err, "cannot load queue policy", needle)


def test_module_class_of_the_wrong_kind(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(capsys, "lublin:50:16", "--queue", "cosched.policies.backfill:EASY")
    assert_one_error(rc, err, "not a subclass of QueuePolicy")


def test_negative_seed_with_samples_on_a_file(capsys: pytest.CaptureFixture[str], good_swf: Path) -> None:
    rc, _, err = run_cli(capsys, str(good_swf), "--seed", "-1", "--samples", "2", "--length", "2")
    assert_one_error(rc, err, "seed")


def test_generated_spec_with_extra_fields(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(capsys, "lublin:10:32:0.5:9")
    assert_one_error(rc, err, "lublin:10:32:0.5:9")


# --------------------------------------------------------------------------- entry point and real traces


def _console_script() -> str:
    sibling = Path(sys.executable).with_name("cosched")
    found = str(sibling) if sibling.exists() else shutil.which("cosched")
    if found is None:
        missing("the cosched console script is not installed")
    return found


def test_console_script(tmp_path: Path) -> None:
    script = _console_script()
    ok = subprocess.run(
        [script, "replay", "lublin:60:16", "--json"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stderr
    payload = json.loads(ok.stdout)
    assert payload["results"]["fcfs+easy"]["per_sample"][0]["jobs"] == 60

    bad = subprocess.run([script, "replay", "--length", "0"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert bad.stdout == ""
    assert_one_error(bad.returncode, bad.stderr, "--length")


def test_real_trace_samples(capsys: pytest.CaptureFixture[str]) -> None:
    path = real_trace("SDSC-SP2-1998-4.2-cln.swf.gz")
    payload = json_results(
        capsys, str(path), "--samples", "2", "--length", "200", "--compare", "fcfs:easy,sjf:easy:actual"
    )
    assert payload["workload"] == "SDSC-SP2-1998-4.2-cln"
    for result in payload["results"].values():
        assert [s["jobs"] for s in result["per_sample"]] == [200, 200]
        assert result["rejected"] == 0


def test_real_trace_node_allocation(capsys: pytest.CaptureFixture[str]) -> None:
    path = real_trace("SDSC-BLUE-2000-4.2-cln.swf.gz")
    rc, out, err = run_cli(capsys, str(path), "--allocation", "node", "--length", "300")
    assert rc == 0, err
    assert "on 144 nodes x 8 cores (node allocation)" in err.splitlines()[0]
    assert table_rows(out)["fcfs+easy"]["jobs"] == "300"


def test_compare_refuses_single_policy_options(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(capsys, "lublin:50:16", "--compare", "fcfs:easy", "--backfill", "none")
    assert_one_error(rc, err, "--compare names its own policies", "--backfill")


def test_start_and_samples_do_not_mix(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(capsys, "lublin:50:16", "--samples", "2", "--length", "5", "--start", "3")
    assert_one_error(rc, err, "--start", "--samples")


def test_rejected_jobs_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys, "lublin:100:64", "--procs", "8")
    assert rc == 0
    (warning,) = [line for line in err.splitlines() if "warning" in line]
    rejected = int(re.search(r"(\d+) jobs larger than the cluster were rejected", warning).group(1))
    assert rejected > 0
    assert int(table_rows(out)["fcfs+easy"]["jobs"]) == 100 - rejected


def test_a_closed_pipe_is_not_an_error() -> None:
    script = _console_script()
    shell = f"'{script}' replay lublin:2000:64 --compare fcfs:easy,sjf:easy | head -c 1 >/dev/null"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", shell], capture_output=True, text=True, timeout=60)
    assert "error" not in done.stderr
