"""The blast, statistics and synthetic stages run end to end at test size, and verify() judges them.

Why through subprocesses: the daemon runs each stage as ``python3 -m workloads.stages``
and only sees its exit status, stderr and progress file, so that is what is tested.
BLAST needs ``makeblastdb``/``blastn`` (Debian's ncbi-blast+): without them on the host,
its stages run in the workflow image (`tests.stage_runner`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.stage_runner import run_stage
from workloads.stages import blast, statistics, synthetic

APPS: dict[str, ModuleType] = {"blast": blast, "statistics": statistics, "synthetic": synthetic}


def run_workflow(app: str, work_dir: Path, progress: Path) -> list[str]:
    """Every stage in order; returns the progress file's content after each stage."""
    seen = []
    for stage in APPS[app].STAGES:
        done = run_stage(app, stage, work_dir, progress)
        assert done.returncode == 0, f"{app}.{stage} failed: {done.stderr}"
        seen.append(progress.read_text().strip())
    return seen


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each app's workflow run once (lazily), shared by the tests that only read or copy its outputs."""
    return {}


def workflow_dir(app: str, finished: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    if app not in finished:
        work_dir = tmp_path_factory.mktemp(app)
        progress = work_dir.parent / f"{app}.progress"
        expected = [f"{n}/{n}" for n in APPS[app].tasks(APPS[app].DEFAULTS).values()]
        assert run_workflow(app, work_dir, progress) == expected
        finished[app] = work_dir
    return finished[app]


def tampered_copy(app: str, finished: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp(f"{app}-tampered") / "work"
    shutil.copytree(workflow_dir(app, finished, tmp_path_factory), copy)
    return copy


@pytest.mark.parametrize("app", APPS)
def test_workflow_runs_and_verifies(app: str, finished: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    work_dir = workflow_dir(app, finished, tmp_path_factory)
    assert APPS[app].verify(work_dir, APPS[app].DEFAULTS) == []


@pytest.mark.parametrize("app", APPS)
def test_stage_counts_match_stage_names(app: str):
    module = APPS[app]
    assert set(module.tasks(module.DEFAULTS)) == set(module.STAGES)
    assert module.SIZES["test"] == module.DEFAULTS
    assert set(module.SIZES) == {"test", "small", "study"}
    for size in module.SIZES.values():
        assert set(size) == set(module.DEFAULTS)
        assert all(count >= 1 for count in module.tasks(size).values())


@pytest.mark.parametrize("app", APPS)
def test_stage_names_match_the_replay(app: str):
    """The daemon runs `generate` then the replay DAG's stages, by these names, with these task counts."""
    from workloads.real import real_workflow, stage_dag

    assert list(APPS[app].STAGES) == [name for name, _, _ in stage_dag(app)]
    spec = real_workflow(app, cores=2, data_dir="/data", image="img")
    assert [s["tasks"] for s in spec["stages"]] == list(APPS[app].tasks(APPS[app].DEFAULTS).values())


@pytest.mark.parametrize(
    ("app", "stage", "first_input"),
    [
        ("blast", "split", "database.fasta"),
        ("blast", "merge", "hits_0000.tsv"),
        ("statistics", "read", "series.json"),
        ("synthetic", "fill", "seed.json"),
        ("synthetic", "compute", "data.npy"),
    ],
)
def test_missing_input_exits_1_naming_it(tmp_path: Path, app: str, stage: str, first_input: str):
    done = run_stage(app, stage, tmp_path / "work", tmp_path / "progress")
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if "missing input" in line]
    assert len(lines) == 1 and first_input in lines[0], done.stderr


def test_missing_month_file_is_named(tmp_path: Path, finished: dict[str, Path], tmp_path_factory):
    work_dir = tampered_copy("statistics", finished, tmp_path_factory)
    (work_dir / "months" / "2011-05.npy").unlink()
    done = run_stage("statistics", "moments", work_dir, tmp_path / "progress")
    assert done.returncode == 1 and "2011-05.npy" in done.stderr


@pytest.mark.parametrize("app", APPS)
def test_unknown_set_key_exits_2(tmp_path: Path, app: str):
    first = next(iter(APPS[app].STAGES))
    done = run_stage(app, first, tmp_path / "work", tmp_path / "progress", "--set", "no_such_key=3")
    assert done.returncode == 2
    assert "no_such_key" in done.stderr
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())


def test_set_changes_task_count(tmp_path: Path):
    progress = tmp_path / "progress"
    for stage in synthetic.STAGES:
        done = run_stage("synthetic", stage, tmp_path, progress, "--set", "chunks=3", "--set", "floats=30000")
        assert done.returncode == 0, done.stderr
        assert progress.read_text().strip() == ("3/3" if stage == "compute" else "1/1")
    assert progress.read_text().strip() == "3/3"
    assert len(list((tmp_path / "chunks").glob("chunk_*.json"))) == 3
    params = {**synthetic.DEFAULTS, "chunks": 3, "floats": 30000}
    assert synthetic.verify(tmp_path, params) == []
    assert synthetic.verify(tmp_path, synthetic.DEFAULTS) != []  # the default size's checksum differs


# -- verify catches tampering ------------------------------------------------------------


def test_blast_verify_catches_a_removed_hit(finished: dict[str, Path], tmp_path_factory):
    work_dir = tampered_copy("blast", finished, tmp_path_factory)
    query, subject = (work_dir / "planted.tsv").read_text().splitlines()[1].split("\t")[:2]
    lines = (work_dir / "hits.tsv").read_text().splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith(f"{query}\t{subject}\t")]
    assert len(kept) < len(lines)
    (work_dir / "hits.tsv").write_text("".join(kept))
    problems = blast.verify(work_dir, blast.DEFAULTS)
    assert len(problems) == 1 and query in problems[0]


def test_blast_verify_catches_a_malformed_or_moved_hit(finished: dict[str, Path], tmp_path_factory):
    work_dir = tampered_copy("blast", finished, tmp_path_factory)
    lines = (work_dir / "hits.tsv").read_text().splitlines()
    fields = lines[0].split("\t")
    fields[8], fields[9] = str(int(fields[8]) + 1000), str(int(fields[9]) + 1000)  # far from the planted offset
    (work_dir / "hits.tsv").write_text("\n".join(["\t".join(fields), *lines[1:], "garbage line"]) + "\n")
    problems = blast.verify(work_dir, blast.DEFAULTS)
    assert any("malformed" in p for p in problems)
    assert any(fields[0] in p and "not found" in p for p in problems)


def test_blast_hits_are_sorted_and_complete(finished: dict[str, Path], tmp_path_factory):
    work_dir = workflow_dir("blast", finished, tmp_path_factory)
    hits = (work_dir / "hits.tsv").read_text().splitlines()
    pieces = sorted((work_dir / "pieces").glob("hits_*.tsv"))
    assert len(pieces) == blast.DEFAULTS["pieces"]
    assert len(hits) == sum(len(p.read_text().splitlines()) for p in pieces)
    assert [line.split("\t")[0] for line in hits] == sorted(line.split("\t")[0] for line in hits)


@pytest.mark.parametrize(("key", "where"), [("mean", 0), ("std", 1), ("max", 2), ("correlation", (0, 1))])
def test_statistics_verify_catches_a_changed_statistic(key: str, where, finished, tmp_path_factory):
    work_dir = tampered_copy("statistics", finished, tmp_path_factory)
    path = work_dir / "statistics.json"
    result = json.loads(path.read_text())
    if isinstance(where, tuple):
        result[key][where[0]][where[1]] += 1e-4
    else:
        result[key][where] *= 1 + 1e-5
    path.write_text(json.dumps(result))
    problems = statistics.verify(work_dir, statistics.DEFAULTS)
    assert len(problems) == 1 and problems[0].startswith(key)


def test_statistics_verify_catches_a_changed_lagged_correlation(finished, tmp_path_factory):
    work_dir = tampered_copy("statistics", finished, tmp_path_factory)
    lags = statistics.DEFAULTS["lags"]
    lagged = np.load(work_dir / "lagged.npy")
    lagged[lags - 1, 1, 2] += 1e-4
    np.save(work_dir / "lagged.npy", lagged)
    problems = statistics.verify(work_dir, statistics.DEFAULTS)
    assert problems and problems[0].startswith(f"lagged[{lags - 1}]")


def test_statistics_results_are_plausible(finished, tmp_path_factory):
    """Mains is the sum of the appliances plus base load, so it correlates positively with each."""
    work_dir = workflow_dir("statistics", finished, tmp_path_factory)
    result = json.loads((work_dir / "statistics.json").read_text())
    correlation = np.array(result["correlation"])
    assert np.allclose(np.diag(correlation), 1.0)
    assert (correlation[0, 1:] > 0.1).all()
    assert result["channels"][0] == "mains" and len(result["channels"]) == statistics.DEFAULTS["channels"]
    lagged = np.load(work_dir / "lagged.npy")
    assert lagged[0] == pytest.approx(correlation)


def expected_messages(work_dir: Path) -> int:
    """One message per block of message_minutes rows per month, per channel."""
    months = statistics._series_months(work_dir)
    blocks = sum(statistics._blocks(end - first, statistics.DEFAULTS) for _, first, end in months)
    return blocks * statistics.DEFAULTS["channels"]


def test_statistics_spool_is_consumed_by_the_reduce(tmp_path: Path, finished, tmp_path_factory):
    """moments leaves one durable message per block and channel; regroup reduces them, correlations removes them."""
    assert not (workflow_dir("statistics", finished, tmp_path_factory) / "messages").exists()
    work_dir = tampered_copy("statistics", finished, tmp_path_factory)
    assert run_stage("statistics", "moments", work_dir, tmp_path / "progress").returncode == 0
    spool = work_dir / "messages" / "moments"
    assert len(list(spool.glob("*.msg"))) == len(list(spool.iterdir())) == expected_messages(work_dir)
    assert not (work_dir / "global.json").exists()
    done = run_stage("statistics", "regroup", work_dir, tmp_path / "progress")
    assert done.returncode == 0, done.stderr
    reduced = (work_dir / "global.json").read_text()
    assert len(list(spool.glob("*.msg"))) == expected_messages(work_dir)  # kept: a rerun redoes the same work
    done = run_stage("statistics", "regroup", work_dir, tmp_path / "progress")
    assert done.returncode == 0 and (work_dir / "global.json").read_text() == reduced
    done = run_stage("statistics", "correlations", work_dir, tmp_path / "progress")
    assert done.returncode == 0, done.stderr
    assert not (work_dir / "messages").exists()
    assert statistics.verify(work_dir, statistics.DEFAULTS) == []


def damage(path: Path, how: str) -> None:
    if how == "missing":
        path.unlink()
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[:-9])
    else:  # a flipped bit in the payload: same size, so only the checksum can tell
        data = bytearray(path.read_bytes())
        data[statistics.HEADER.size + 3] ^= 0x10
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["missing", "truncated", "flipped"])
def test_damaged_moments_message_fails_regroup(tmp_path: Path, how: str, finished, tmp_path_factory):
    work_dir = tampered_copy("statistics", finished, tmp_path_factory)
    assert run_stage("statistics", "moments", work_dir, tmp_path / "progress").returncode == 0
    message = work_dir / "messages" / "moments" / statistics._message_name("2011-05", 3, 1)
    damage(message, how)
    done = run_stage("statistics", "regroup", work_dir, tmp_path / "progress")
    assert done.returncode == 1
    assert message.name in done.stderr and ("missing" if how == "missing" else "corrupt") in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (work_dir / "global.json").exists()  # no statistics from an incomplete reduce


def test_stray_message_fails_the_reduce(tmp_path: Path, finished, tmp_path_factory):
    """A half-sent message (its temporary file) left in the spool is not silently ignored."""
    work_dir = tampered_copy("statistics", finished, tmp_path_factory)
    assert run_stage("statistics", "moments", work_dir, tmp_path / "progress").returncode == 0
    (work_dir / "messages" / "moments" / "2011-05.00099.000.msg.tmp").write_bytes(b"half")
    done = run_stage("statistics", "regroup", work_dir, tmp_path / "progress")
    assert done.returncode == 1 and "half-sent" in done.stderr


@pytest.mark.parametrize("how", ["missing", "truncated", "flipped"])
def test_damaged_correlations_message_fails_the_final_reduce(how: str, finished, tmp_path_factory):
    """The correlations' reduce runs in the same process as the sends, so it is driven directly here."""
    work_dir = tampered_copy("statistics", finished, tmp_path_factory)
    params, months = statistics.DEFAULTS, statistics._series_months(work_dir)
    statistics._fresh_spool(work_dir, "correlations")
    for month in months:
        statistics._month_cross(work_dir, params, month)
    channels = params["channels"]
    lagged = (
        statistics._reduce_cross(work_dir, params, months, channels)
        / np.maximum(statistics.minutes(params) - np.arange(params["lags"]), 1)[:, None, None]
    )
    assert np.allclose(lagged, np.load(work_dir / "lagged.npy"), rtol=1e-9, atol=1e-12)
    damage(work_dir / "messages" / "correlations" / statistics._message_name(months[-1][0], 0, 2), how)
    with pytest.raises(statistics.StageError, match="missing" if how == "missing" else "corrupt"):
        statistics._reduce_cross(work_dir, params, months, channels)


def test_synthetic_verify_catches_a_changed_checksum(finished, tmp_path_factory):
    work_dir = tampered_copy("synthetic", finished, tmp_path_factory)
    path = work_dir / "checksum.json"
    checksum = json.loads(path.read_text())
    checksum["sum"] *= 1 + 1e-8
    path.write_text(json.dumps(checksum))
    problems = synthetic.verify(work_dir, synthetic.DEFAULTS)
    assert len(problems) == 1 and problems[0].startswith("checksum sum")


def test_synthetic_verify_catches_different_data(finished, tmp_path_factory):
    work_dir = workflow_dir("synthetic", finished, tmp_path_factory)
    assert synthetic.verify(work_dir, {**synthetic.DEFAULTS, "seed": 2}) != []
    assert synthetic.verify(work_dir, {**synthetic.DEFAULTS, "repeat": synthetic.DEFAULTS["repeat"] + 1}) != []
