"""Tests of the replay study layer (cosched/replay/study.py): loading, cutting, policy sets, running."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from swf_lines import job_line, write_text

from cosched.errors import ConfigError, CoschedError, TraceError
from cosched.model import Allocation
from cosched.replay.driver import PolicySet
from cosched.replay.study import cluster_for, cut, load_workload, parse_policy_sets, run_study
from cosched.traces.swf import write_swf
from cosched.traces.trace import Trace


def simple_trace(n: int, *, first_submit: float = 1000.0) -> Trace:
    """n one-processor jobs, ids 1..n, submitted every 7 s starting at `first_submit`."""
    return Trace.from_columns(
        "simple",
        submit=first_submit + 7.0 * np.arange(n),
        runtime=np.full(n, 20.0),
        procs=np.ones(n, dtype=np.int64),
    )


def ids(trace: Trace) -> list[int]:
    return trace.columns["job_id"].tolist()


@pytest.fixture(scope="module")
def lublin() -> Trace:
    return load_workload("lublin:300:32:0.9", seed=3)


# --------------------------------------------------------------------------- cut


def test_cut_whole_trace() -> None:
    trace = simple_trace(10)
    [whole] = cut(trace)
    assert ids(whole) == list(range(1, 11))
    assert whole.columns["submit"].tolist() == trace.columns["submit"].tolist()


def test_cut_window_boundaries() -> None:
    trace = simple_trace(10)
    assert [ids(s) for s in cut(trace, start=3)] == [[4, 5, 6, 7, 8, 9, 10]]
    assert [ids(s) for s in cut(trace, length=4)] == [[1, 2, 3, 4]]
    assert [ids(s) for s in cut(trace, start=2, length=3)] == [[3, 4, 5]]
    # The last job alone, and the whole trace as an explicit window.
    assert [ids(s) for s in cut(trace, start=9, length=1)] == [[10]]
    assert [ids(s) for s in cut(trace, start=0, length=10)] == [list(range(1, 11))]
    # A window running past the end is clipped to the trace (no sampling involved).
    assert [ids(s) for s in cut(trace, start=8, length=5)] == [[9, 10]]


def test_cut_window_keeps_submit_times() -> None:
    trace = simple_trace(10, first_submit=5000.0)
    [window] = cut(trace, start=4, length=3)
    assert window.columns["submit"].tolist() == [5028.0, 5035.0, 5042.0]
    assert [j.submit for j in window.jobs()] == [5028.0, 5035.0, 5042.0]


def test_cut_start_outside_trace_is_an_error() -> None:
    trace = simple_trace(5)
    with pytest.raises(CoschedError, match="start 5"):
        cut(trace, start=5)


def test_cut_samples_shape_and_consecutive_jobs() -> None:
    trace = simple_trace(50, first_submit=123456.0)
    samples = cut(trace, length=8, samples=6, seed=11)
    assert len(samples) == 6
    all_ids = ids(trace)
    for sample in samples:
        got = ids(sample)
        assert len(got) == 8
        first = all_ids.index(got[0])
        assert got == all_ids[first : first + 8]
        # Original submit times, not rebased to zero.
        assert sample.columns["submit"].tolist() == trace.columns["submit"][first : first + 8].tolist()
        assert sample.columns["submit"][0] >= 123456.0


def test_cut_samples_deterministic_per_seed() -> None:
    trace = simple_trace(200)
    a = [ids(s) for s in cut(trace, length=5, samples=8, seed=42)]
    b = [ids(s) for s in cut(trace, length=5, samples=8, seed=42)]
    c = [ids(s) for s in cut(trace, length=5, samples=8, seed=43)]
    assert a == b
    assert a != c


def test_cut_samples_as_long_as_the_trace() -> None:
    # length == len(trace): every sample is the whole trace.
    trace = simple_trace(7)
    samples = cut(trace, length=7, samples=3, seed=1)
    assert [ids(s) for s in samples] == [list(range(1, 8))] * 3


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
def test_cut_samples_property(n: int, data: st.DataObject, seed: int) -> None:
    length = data.draw(st.integers(1, n))
    k = data.draw(st.integers(1, 5))
    trace = simple_trace(n)
    samples = cut(trace, length=length, samples=k, seed=seed)
    assert len(samples) == k
    for sample in samples:
        got = ids(sample)
        assert len(got) == length
        assert got == list(range(got[0], got[0] + length))
        assert got[0] >= 1 and got[-1] <= n


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"length": 0}, "--length"),
        ({"length": -3}, "--length"),
        ({"start": -1}, "--start"),
        ({"samples": 0, "length": 2}, "--samples"),
        ({"samples": -2, "length": 2}, "--samples"),
        ({"samples": 2}, "--samples needs --length"),
        ({"samples": 2, "length": 11}, "longer than"),
    ],
)
def test_cut_errors(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cut(simple_trace(10), **kwargs)


def test_cut_negative_seed_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="seed"):
        cut(simple_trace(10), length=2, samples=2, seed=-1)


# --------------------------------------------------------------------------- parse_policy_sets


def test_parse_policy_sets_labels_and_fields() -> None:
    sets = parse_policy_sets(" fcfs:easy , sjf:easy:actual,fcfs:none:requested,wfp3:conservative")
    assert [s.label for s in sets] == ["fcfs+easy", "sjf+easy-actual", "fcfs+none", "wfp3+conservative"]
    assert (sets[1].queue, sets[1].backfill, sets[1].estimate) == ("sjf", "easy", "actual")
    assert sets[0].estimate == "requested"
    assert all(s.placement == "first-fit" for s in sets)
    # Trailing and doubled commas are ignored.
    assert [s.label for s in parse_policy_sets("fcfs:easy,,")] == ["fcfs+easy"]


@pytest.mark.parametrize("text", ["fcfs", "fcfs:", ":easy", "fcfs::actual", "fcfs:easy:actual:x", "fcfs:easy,sjf"])
def test_parse_policy_sets_bad_item(text: str) -> None:
    with pytest.raises(ConfigError, match="bad policy set"):
        parse_policy_sets(text)


@pytest.mark.parametrize("text", ["", ",", " , "])
def test_parse_policy_sets_empty(text: str) -> None:
    with pytest.raises(ConfigError, match="no policy sets"):
        parse_policy_sets(text)


# --------------------------------------------------------------------------- load_workload / cluster_for


def test_load_workload_generated() -> None:
    trace = load_workload("lublin:100:32:0.7")
    assert len(trace) == 100
    assert trace.max_procs == 32
    assert int(trace.columns["procs"].max()) <= 32
    cluster = cluster_for(trace)
    assert (cluster.nodes, cluster.cores_per_node, cluster.cores) == (32, 1, 32)
    # Same seed, same workload; another seed, another one.
    again = load_workload("lublin:100:32:0.7")
    other = load_workload("lublin:100:32:0.7", seed=2)
    assert trace.columns["submit"].tolist() == again.columns["submit"].tolist()
    assert trace.columns["submit"].tolist() != other.columns["submit"].tolist()


def test_load_workload_generated_defaults_size_to_procs() -> None:
    trace = load_workload("lublin:40", procs=16)
    assert len(trace) == 40
    assert trace.max_procs == 16


@pytest.mark.parametrize("spec", ["lublin:abc", "lublin:", "lublin:10:x", "lublin:10:32:high"])
def test_load_workload_bad_generated_spec(spec: str) -> None:
    with pytest.raises(ConfigError, match="bad generated workload"):
        load_workload(spec)


@pytest.mark.parametrize("spec", ["lublin:0:32", "lublin:10:0", "lublin:10:32:0"])
def test_load_workload_out_of_range_generated_spec(spec: str) -> None:
    with pytest.raises(ConfigError):
        load_workload(spec)


def test_load_workload_swf(tmp_path: Path) -> None:
    path = write_text(
        tmp_path / "small.swf",
        ["; MaxProcs: 8", job_line(1), job_line(2, alloc_procs=8, req_procs=8), job_line(3, status=5)],
    )
    trace = load_workload(str(path))
    assert trace.name == "small"
    assert ids(trace) == [1, 2, 3]
    assert trace.report.cancelled_kept == 1
    assert ids(load_workload(str(path), drop_cancelled=True)) == [1, 2]
    # procs overrides the header: the 8-processor job no longer fits.
    small = load_workload(str(path), procs=4)
    assert ids(small) == [1, 3]
    assert cluster_for(small, procs=4).cores == 4


def test_load_workload_swf_lenient(tmp_path: Path) -> None:
    path = write_text(tmp_path / "bad.swf", [job_line(1), "this is not a job", job_line(2)])
    with pytest.raises(TraceError, match=r"bad\.swf:2:"):
        load_workload(str(path))
    trace = load_workload(str(path), lenient=True)
    assert ids(trace) == [1, 2]
    assert trace.report.malformed_skipped == 1


def test_load_workload_roundtrip_of_generated(tmp_path: Path) -> None:
    generated = load_workload("lublin:60:16")
    path = write_swf(tmp_path / "gen.swf", generated)
    loaded = load_workload(str(path))
    assert ids(loaded) == ids(generated)
    assert loaded.columns["submit"].tolist() == generated.columns["submit"].tolist()


def test_cluster_for() -> None:
    trace = load_workload("lublin:20:16")
    assert cluster_for(trace, "node").allocation is Allocation.NODE
    assert cluster_for(trace, procs=64).cores == 64
    with pytest.raises(ConfigError, match="allocation"):
        cluster_for(trace, "bogus")


# --------------------------------------------------------------------------- run_study


def starts(run_jobs: list) -> dict[int, float]:
    return {j.id: j.start for j in run_jobs}


def test_run_study_same_sequences_for_every_policy_set(lublin: Trace) -> None:
    sequences = cut(lublin, length=60, samples=3, seed=5)
    sets = parse_policy_sets("fcfs:none,fcfs:easy,sjf:easy:actual,wfp3:conservative")
    results = run_study(sequences, cluster_for(lublin), sets)
    assert [r.label for r in results] == ["fcfs+none", "fcfs+easy", "sjf+easy-actual", "wfp3+conservative"]
    expected = [set(ids(s)) for s in sequences]
    for result in results:
        assert len(result.runs) == len(result.summaries) == 3
        assert [{j.id for j in run.jobs} for run in result.runs] == expected
        assert all(not run.rejected for run in result.runs)
        assert result.jobs == 180
        assert result.aggregate()["jobs"]["mean"] == 60.0
        for run in result.runs:
            for job in run.jobs:
                assert job.submit <= job.start < job.end


def test_run_study_fresh_jobs_per_run(lublin: Trace) -> None:
    [sequence] = cut(lublin, start=20, length=150)
    columns_before = {k: v.copy() for k, v in lublin.columns.items()}
    sets = parse_policy_sets("fcfs:none,fcfs:easy,fcfs:none")
    first, easy, again = run_study([sequence], cluster_for(lublin), sets)
    a, b, c = first.runs[0], easy.runs[0], again.runs[0]
    # Rerunning a policy set gives the same schedule: nothing carried over from the runs before it.
    assert starts(a.jobs) == starts(c.jobs)
    # The policies do differ on this (loaded) input, so the equality above is not vacuous.
    assert starts(a.jobs) != starts(b.jobs)
    # Distinct Job objects per run, and the trace itself is untouched.
    assert not {id(j) for j in a.jobs} & {id(j) for j in b.jobs}
    assert not {id(j) for j in a.jobs} & {id(j) for j in c.jobs}
    for key, col in lublin.columns.items():
        np.testing.assert_array_equal(col, columns_before[key], err_msg=key)
    assert all(j.start == -1.0 for j in sequence.jobs())


def test_run_study_fcfs_without_backfill_starts_in_submit_order(lublin: Trace) -> None:
    [result] = run_study([lublin.slice(0, 200)], cluster_for(lublin), [PolicySet("fcfs", "none")])
    jobs = sorted(result.runs[0].jobs, key=lambda j: (j.submit, j.start))
    started = [j.start for j in jobs]
    assert started == sorted(started)


def test_run_study_progress_and_validate(lublin: Trace) -> None:
    sequences = cut(lublin, length=50, samples=2, seed=9)
    calls: list[int] = []
    results = run_study(
        sequences,
        cluster_for(lublin),
        parse_policy_sets("fcfs:easy,sjf:conservative"),
        validate=True,
        progress=calls.append,
    )
    assert sum(calls) == 2 * 2 * 50
    assert all(run.validator is not None for r in results for run in r.runs)


def test_run_study_unknown_policy_is_a_config_error(lublin: Trace) -> None:
    sequences = cut(lublin, length=10)
    with pytest.raises(ConfigError, match="unknown queue policy 'bogus'"):
        run_study(sequences, cluster_for(lublin), parse_policy_sets("bogus:easy"))
    with pytest.raises(ConfigError, match="cannot load queue policy"):
        run_study(sequences, cluster_for(lublin), [PolicySet("no_such_module_xyz:Queue", "easy")])
