"""Tests of the SWF reader/writer: header parsing, each cleaning rule, errors, round trips."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from conftest import real_trace
from swf_lines import job_line, write_text

import cosched.traces.swf as swf
from cosched.errors import TraceError
from cosched.model import Job, JobState
from cosched.traces.swf import read_swf, write_swf
from cosched.traces.trace import SWF_FIELDS, SwfHeader, Trace

# --------------------------------------------------------------------------- header


def test_header_leading_integers_and_tolerance(tmp_path: Path) -> None:
    path = write_text(
        tmp_path / "h.swf",
        [
            "; Version: 2.2",
            "; MaxNodes: 338 (batch partition; 512 total)",
            "; MaxProcs: unknown",
            "; UnixStartTime: 893466664",
            "; Note: first",
            "; Note: second",
            "; Information: http://example.org/a",
            ";              http://example.org/b",
            "; just free text, no key",
            ";",
            job_line(1, alloc_procs=338, req_procs=-1),
            job_line(2, alloc_procs=339, req_procs=-1),
        ],
    )
    trace = read_swf(path)
    h = trace.header
    assert h.max_nodes == 338
    assert h.max_procs is None
    assert h.unix_start_time == 893466664
    assert h.fields["MaxNodes"] == "338 (batch partition; 512 total)"
    assert h.fields["MaxProcs"] == "unknown"
    assert h.fields["Version"] == "2.2"
    assert h.fields["Note"] == "first\nsecond"
    assert h.fields["Information"] == "http://example.org/a"
    assert "http" not in h.fields
    # MaxNodes is the limit when MaxProcs is unusable: the 339-processor job goes.
    assert trace.report.dropped_procs_above_max == 1
    assert trace.columns["job_id"].tolist() == [1]
    assert trace.max_procs == 338
    assert trace.report.comments == 10
    assert trace.report.lines == 12


def test_parse_header_directly() -> None:
    h = swf.parse_header([" MaxProcs: 128", " maxnodes: 64", " UnixStartTime: x", " Computer: IBM SP2"])
    assert (h.max_procs, h.max_nodes, h.unix_start_time) == (128, 64, None)
    assert h.fields["UnixStartTime"] == "x"
    assert h.fields["Computer"] == "IBM SP2"


# --------------------------------------------------------------------------- cleaning


def test_each_cleaning_rule_counted_in_order(tmp_path: Path) -> None:
    path = write_text(
        tmp_path / "clean.swf",
        [
            "; MaxProcs: 64",
            job_line(1),  # kept as is
            job_line(2, status=5),  # cancelled
            job_line(3, status=5, runtime=0, alloc_procs=-1, req_procs=-1),  # cancelled first
            job_line(4, runtime=-1),  # runtime
            job_line(5, runtime=0),  # runtime
            job_line(6, runtime=0, alloc_procs=999, req_procs=999),  # runtime before size
            job_line(7, alloc_procs=-1, req_procs=-1),  # procs unknown
            job_line(8, alloc_procs=0, req_procs=0),  # procs unknown
            job_line(9, alloc_procs=65, req_procs=65),  # above MaxProcs
            job_line(10, alloc_procs=-1, req_procs=65),  # above MaxProcs via req_procs
            job_line(11, alloc_procs=64, req_procs=64),  # exactly MaxProcs: kept
            job_line(12, req_time=-1, runtime=70),  # req_time from runtime
            job_line(13, req_time=0, runtime=80),  # req_time from runtime
            job_line(14, req_time=10, runtime=20),  # raised to runtime
            job_line(15, req_procs=2, alloc_procs=8),  # procs = max(...)
            job_line(16, req_procs=6, alloc_procs=-1),
        ],
    )
    # Default: a cancelled job that ran (2) is kept; one cancelled before it ran (3) has runtime 0.
    trace = read_swf(path)
    r = trace.report
    assert r.read == 16
    assert r.lines == 17
    assert r.comments == 1
    assert r.malformed_skipped == 0
    assert r.dropped_cancelled == 0
    assert r.cancelled_kept == 1
    assert r.dropped_runtime == 4
    assert r.dropped_procs_unknown == 2
    assert r.dropped_procs_above_max == 2
    assert r.req_time_from_runtime == 2
    assert r.req_time_raised_to_runtime == 1
    assert r.kept == 8
    assert r.notes == []
    c = trace.columns
    assert c["job_id"].tolist() == [1, 2, 11, 12, 13, 14, 15, 16]
    assert c["procs"].tolist() == [4, 4, 64, 4, 4, 4, 8, 6]
    assert c["req_time"].tolist() == [100.0, 100.0, 100.0, 70.0, 80.0, 20.0, 100.0, 100.0]
    assert np.all(c["req_time"] >= c["runtime"])
    assert "kept: cancelled after starting (ran until cancelled): 1" in r.lines_out()

    # drop_cancelled: both cancelled jobs go, counted before the runtime rule.
    trace = read_swf(path, drop_cancelled=True)
    r = trace.report
    assert (r.dropped_cancelled, r.cancelled_kept, r.dropped_runtime, r.kept) == (2, 0, 3, 7)
    assert trace.columns["job_id"].tolist() == [1, 11, 12, 13, 14, 15, 16]
    assert "dropped: cancelled (status 5, --drop-cancelled): 2" in r.lines_out()


def test_column_names_and_dtypes(tmp_path: Path) -> None:
    path = write_text(tmp_path / "t.swf", ["; MaxProcs: 8", job_line(1, avg_cpu=552.21)])
    cols = read_swf(path).columns
    assert set(cols) == {*SWF_FIELDS, "procs"}
    for name in SWF_FIELDS:
        expected = np.float64 if name in swf.FLOAT_FIELDS else np.int64
        assert cols[name].dtype == expected, name
    assert cols["procs"].dtype == np.int64
    assert cols["avg_cpu"][0] == pytest.approx(552.21)


def test_sorted_stably_by_submit(tmp_path: Path) -> None:
    path = write_text(
        tmp_path / "unsorted.swf",
        [
            "; MaxProcs: 8",
            job_line(1, submit=30),
            job_line(2, submit=10),
            job_line(3, submit=20),
            job_line(4, submit=10),
            job_line(5, submit=20),
        ],
    )
    trace = read_swf(path)
    assert trace.columns["job_id"].tolist() == [2, 4, 3, 5, 1]
    assert trace.columns["submit"].tolist() == [10.0, 10.0, 20.0, 20.0, 30.0]
    # Enough ties that an unstable sort would reorder them.
    submits = [(i * 7) % 5 for i in range(200)]
    path = write_text(tmp_path / "ties.swf", [job_line(i + 1, submit=t) for i, t in enumerate(submits)])
    ids = read_swf(path).columns["job_id"].tolist()
    assert ids == [i + 1 for _, i in sorted((t, i) for i, t in enumerate(submits))]


def test_max_procs_argument_overrides_header(tmp_path: Path) -> None:
    path = write_text(
        tmp_path / "t.swf",
        ["; MaxProcs: 64", job_line(1, alloc_procs=16), job_line(2, alloc_procs=40), job_line(3)],
    )
    trace = read_swf(path, max_procs=32)
    assert trace.report.dropped_procs_above_max == 1
    assert trace.header.max_procs == 32
    assert trace.header.fields["MaxProcs"] == "64"
    assert trace.max_procs == 32
    assert any("overrides" in note and "64" in note for note in trace.report.notes)


def test_max_procs_argument_on_headerless_trace_noted(tmp_path: Path) -> None:
    path = write_text(tmp_path / "t.swf", [job_line(1, alloc_procs=16), job_line(2, alloc_procs=40)])
    trace = read_swf(path, max_procs=32)
    assert trace.report.dropped_procs_above_max == 1
    assert trace.max_procs == 32
    assert len(trace.report.notes) == 1
    assert "max_procs=32" in trace.report.notes[0] and "given" in trace.report.notes[0]
    with pytest.raises(TraceError, match="max_procs"):
        read_swf(path, max_procs=0)


def test_headerless_trace_notes_inferred_size(tmp_path: Path) -> None:
    path = write_text(tmp_path / "bare.swf", [job_line(1, alloc_procs=16), job_line(2, alloc_procs=100)])
    trace = read_swf(path)
    assert trace.report.dropped_procs_above_max == 0
    assert trace.report.kept == 2
    assert trace.report.notes == [
        "cluster size not in the header (no MaxProcs or MaxNodes): inferred from the largest job (100 processors)"
    ]
    assert trace.max_procs == 100


# --------------------------------------------------------------------------- errors


def test_strict_error_names_file_and_line(tmp_path: Path) -> None:
    lines = ["; MaxProcs: 8", job_line(1), job_line(2), " ".join(job_line(3).split()[:17]), job_line(4)]
    path = write_text(tmp_path / "bad.swf", lines)
    with pytest.raises(TraceError) as info:
        read_swf(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:4: ")
    assert "expected 18" in msg and "found 17" in msg
    assert "\n" not in msg


def test_strict_error_too_many_fields_and_non_numeric(tmp_path: Path) -> None:
    path = write_text(tmp_path / "wide.swf", [job_line(1), job_line(2) + " 0"])
    with pytest.raises(TraceError, match=r"wide\.swf:2: expected 18 SWF fields, found 19"):
        read_swf(path)
    # Every line 19 wide: the C parser accepts it, the shape check must not.
    path = write_text(tmp_path / "allwide.swf", [job_line(1) + " 0", job_line(2) + " 0"])
    with pytest.raises(TraceError, match=r"allwide\.swf:1: .*found 19"):
        read_swf(path)
    path = write_text(tmp_path / "nan.swf", ["; c", "", job_line(1), job_line(2).replace(" 50 ", " 5x0 ", 1)])
    with pytest.raises(TraceError, match=r"nan\.swf:4: field 4 \(runtime\) is not a number: '5x0'"):
        read_swf(path)
    path = write_text(tmp_path / "inf.swf", [job_line(1, runtime="inf")])
    with pytest.raises(TraceError, match=r"inf\.swf:1: field 4 \(runtime\)"):
        read_swf(path)


def test_lenient_skips_and_counts_malformed(tmp_path: Path) -> None:
    lines = [
        "; MaxProcs: 8",
        job_line(1),
        " ".join(job_line(2).split()[:10]),
        job_line(3).replace(" 100 ", " abc ", 1),
        job_line(4) + " 7",
        job_line(5, status=5),
        job_line(6),
    ]
    path = write_text(tmp_path / "mixed.swf", lines)
    trace = read_swf(path, lenient=True)
    r = trace.report
    assert r.malformed_skipped == 3
    assert r.read == 6
    assert r.cancelled_kept == 1
    assert r.kept == 3
    assert trace.columns["job_id"].tolist() == [1, 5, 6]


def test_missing_file_and_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope.swf"
    with pytest.raises(TraceError, match=r"^trace not found: .*nope\.swf$"):
        read_swf(missing)
    with pytest.raises(TraceError, match="cannot read trace"):
        read_swf(tmp_path)


def test_empty_traces_are_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no jobs"):
        read_swf(write_text(tmp_path / "comments.swf", ["; MaxProcs: 8", ";"]))
    with pytest.raises(TraceError, match="no jobs"):
        read_swf(write_text(tmp_path / "cancelled.swf", [job_line(1, status=5, runtime=0)]))
    with pytest.raises(TraceError, match="2 of them malformed"):
        read_swf(write_text(tmp_path / "junk.swf", ["1 2 3", "x"]), lenient=True)


def test_corrupt_gzip_is_trace_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.swf.gz"
    path.write_bytes(gzip.compress(b"; MaxProcs: 8\n" + job_line(1).encode())[:20])
    with pytest.raises(TraceError, match=r"broken\.swf\.gz: corrupt gzip"):
        read_swf(path)


# --------------------------------------------------------------------------- gzip, names


def test_gzip_detected_by_magic_bytes(tmp_path: Path) -> None:
    text = "\n".join(["; MaxProcs: 8", job_line(1), job_line(2)]) + "\n"
    gz = tmp_path / "small.swf.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    disguised = tmp_path / "disguised.swf"
    disguised.write_bytes(gzip.compress(text.encode()))
    plain_named_gz = tmp_path / "plain.gz"
    plain_named_gz.write_text(text)
    for path, name in ((gz, "small"), (disguised, "disguised"), (plain_named_gz, "plain")):
        trace = read_swf(path)
        assert trace.name == name
        assert trace.columns["job_id"].tolist() == [1, 2]
        assert trace.header.max_procs == 8


def test_crlf_and_interior_comments(tmp_path: Path) -> None:
    text = "; MaxProcs: 8\r\n" + job_line(1) + "\r\n; MaxNodes: 2\r\n" + job_line(2) + "\r\n"
    path = tmp_path / "dos.swf"
    path.write_bytes(text.encode())
    trace = read_swf(path)
    assert trace.columns["job_id"].tolist() == [1, 2]
    assert trace.report.comments == 2
    assert trace.report.lines == 4
    assert trace.header.max_nodes == 2


# --------------------------------------------------------------------------- writing


def test_round_trip_trace(tmp_path: Path) -> None:
    src = write_text(
        tmp_path / "src.swf",
        [
            "; Version: 2.2",
            "; MaxNodes: 338 (batch partition; 512 total)",
            "; Queue: 1 batch",
            "; Queue: 2 debug",
            job_line(1, avg_cpu=552.21, think_time=3.5),
            job_line(2, req_time=-1),
            job_line(3, submit=5, alloc_procs=-1, req_procs=300, used_memory=1024, req_memory=2048),
        ],
    )
    first = read_swf(src)
    for name in ("out.swf", "out.swf.gz"):
        out = write_swf(tmp_path / name, first)
        if name.endswith(".gz"):
            assert out.read_bytes()[:2] == b"\x1f\x8b"
        again = read_swf(out)
        assert again.name == "out"
        assert set(again.columns) == set(first.columns)
        for key, col in first.columns.items():
            assert again.columns[key].dtype == col.dtype, key
            np.testing.assert_array_equal(again.columns[key], col, err_msg=key)
        assert again.header == first.header
        assert again.report.kept == first.report.kept == 3
        assert again.report.req_time_from_runtime == 0


def test_round_trip_real_valued_times(tmp_path: Path) -> None:
    trace = Trace.from_columns(
        "floaty",
        submit=np.array([0.1, 1 / 3, 7.0]),
        runtime=np.array([2.5, 1e-3, 12345.678901234567]),
        procs=np.array([1, 2, 3]),
        req_time=np.array([3.0, 1.0, 20000.0]),
    )
    again = read_swf(write_swf(tmp_path / "f.swf", trace, header=SwfHeader(max_procs=4)))
    for key in ("submit", "runtime", "req_time", "procs", "job_id"):
        np.testing.assert_array_equal(again.columns[key], trace.columns[key], err_msg=key)
    assert again.header.max_procs == 4
    assert again.header.fields == {"MaxProcs": "4"}


def test_header_numbers_win_over_disagreeing_text(tmp_path: Path) -> None:
    header = SwfHeader(max_nodes=338, max_procs=32, fields={"MaxNodes": "338 (batch)", "MaxProcs": "64"})
    trace = Trace.from_columns("t", submit=np.array([0.0]), runtime=np.array([1.0]), procs=np.array([4]))
    path = write_swf(tmp_path / "h.swf", trace, header=header)
    text = path.read_text()
    assert "; MaxNodes: 338 (batch)\n" in text
    assert "; MaxProcs: 32\n" in text
    assert read_swf(path).header.max_procs == 32


def test_write_finished_jobs(tmp_path: Path) -> None:
    done = Job(id=7, submit=100.0, cores=16, walltime=600.0, runtime=300.0, memory=2, user=3, queue=1)
    done.start, done.end, done.state = 160.0, 460.0, JobState.DONE
    killed = Job(id=8, submit=110.0, cores=4, walltime=100.0, runtime=500.0)
    killed.start, killed.end, killed.state = 200.0, 300.0, JobState.FAILED
    waiting = Job(id=9, submit=120.0, cores=2, walltime=0.0, runtime=None)
    path = write_swf(tmp_path / "replay.swf", [done, killed, waiting], header=SwfHeader(max_procs=32))
    rows = [line.split() for line in path.read_text().splitlines() if not line.startswith(";")]
    assert len(rows) == 3 and all(len(r) == 18 for r in rows)
    row = dict(zip(SWF_FIELDS, rows[0], strict=True))
    assert row["job_id"] == "7"
    assert row["wait"] == "60"
    assert row["runtime"] == "300"
    assert row["alloc_procs"] == row["req_procs"] == "16"
    assert row["req_time"] == "600"
    assert row["req_memory"] == "2048"
    assert row["status"] == "1"
    assert row["user"] == "3"
    assert row["queue"] == "1"
    assert row["avg_cpu"] == "-1"
    killed_row = dict(zip(SWF_FIELDS, rows[1], strict=True))
    assert killed_row["runtime"] == "100"  # held its cores for 100 s, not its 500 s runtime
    assert killed_row["status"] == "0"
    assert rows[2][:4] == ["9", "120", "-1", "-1"]

    trace = read_swf(path)  # the unknown-runtime job is dropped on reading
    assert trace.report.dropped_runtime == 1
    assert trace.columns["job_id"].tolist() == [7, 8]
    assert trace.columns["wait"].tolist() == [60.0, 90.0]


def test_jobs_round_trip_through_trace_jobs(tmp_path: Path) -> None:
    path = write_text(
        tmp_path / "j.swf", ["; MaxProcs: 8", job_line(1, req_memory=4096, user=5), job_line(2, think_time=9)]
    )
    trace = read_swf(path)
    again = read_swf(write_swf(tmp_path / "j2.swf", trace.jobs()))
    for key in ("job_id", "submit", "runtime", "procs", "req_time", "req_memory", "user", "think_time"):
        np.testing.assert_array_equal(again.columns[key], trace.columns[key], err_msg=key)


def test_unwritable_path_is_trace_error(tmp_path: Path) -> None:
    trace = Trace.from_columns("t", submit=np.array([0.0]), runtime=np.array([1.0]), procs=np.array([1]))
    with pytest.raises(TraceError, match="cannot write trace"):
        write_swf(tmp_path / "missing-dir" / "x.swf", trace)


# --------------------------------------------------------------------------- real traces


def test_real_sdsc_sp2(monkeypatch: pytest.MonkeyPatch) -> None:
    path = real_trace("SDSC-SP2-1998-4.2-cln.swf.gz")

    def no_slow_path(*args: object) -> None:
        raise AssertionError("a clean archive trace must load on the vectorised path")

    monkeypatch.setattr(swf, "_parse_slow", no_slow_path)
    trace = read_swf(path)
    r = trace.report
    assert trace.name == "SDSC-SP2-1998-4.2-cln"
    assert r.read == 59715
    assert trace.header.max_procs == 128
    assert trace.header.max_nodes == 128
    assert trace.header.unix_start_time == 893466664
    assert r.malformed_skipped == 0
    # Counts for the PWA file pinned in SOURCES.md (sha256/16 2bb635f4b5793f52).
    # 16,598 cancelled: 5,681 before starting (runtime 0, dropped), 10,917 after (kept).
    assert (r.cancelled_kept, r.dropped_runtime, r.dropped_procs_unknown) == (10917, 5681, 0)
    assert (r.dropped_procs_above_max, r.req_time_from_runtime, r.req_time_raised_to_runtime) == (0, 35, 4134)
    assert r.kept == len(trace) == 54034
    r = read_swf(path, drop_cancelled=True).report
    assert (r.dropped_cancelled, r.dropped_runtime, r.req_time_raised_to_runtime, r.kept) == (16598, 0, 53, 43117)
    assert int(trace.columns["procs"].max()) <= 128
    assert np.all(np.diff(trace.columns["submit"]) >= 0)
    assert np.all(trace.columns["req_time"] >= trace.columns["runtime"])


def test_real_lublin_256() -> None:
    trace = read_swf(real_trace("lublin_256.swf"))
    c = trace.columns
    assert trace.header.max_nodes == 256
    assert trace.header.max_procs is None
    assert trace.max_procs == 256
    assert trace.report.read == 10000
    assert trace.report.req_time_from_runtime == trace.report.kept
    np.testing.assert_array_equal(c["req_time"], c["runtime"])
    assert int(c["procs"].max()) <= 256


def test_real_theta_has_19_fields() -> None:
    """theta_walltime.swf carries a 19th column on every line: not SWF, so strict mode says so."""
    path = real_trace("theta_walltime.swf")
    with pytest.raises(TraceError, match=r"theta_walltime\.swf:5: expected 18 SWF fields, found 19"):
        read_swf(path)
