"""The SWF reader's rules for bad input: nothing accepted is lost, every refusal names file and line."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import real_trace
from swf_lines import job_line, write_text

from cosched.cli import main
from cosched.errors import TraceError
from cosched.replay.driver import replay
from cosched.replay.study import cut
from cosched.traces.swf import read_swf
from cosched.traces.trace import Trace

LINES = ["; MaxProcs: 8", *(job_line(i) for i in range(1, 6))]


def test_a_negative_submit_time_is_dropped_and_counted(tmp_path: Path) -> None:
    path = write_text(tmp_path / "neg.swf", [*LINES, job_line(6, submit=-1)])
    trace = read_swf(path)
    assert trace.report.dropped_submit_unknown == 1 and trace.report.kept == len(trace) == 5
    assert "dropped: submit time negative (unknown): 1" in trace.report.lines_out()


def test_every_job_of_a_trace_starting_below_zero_is_in_the_results() -> None:
    """The replay used to keep only jobs with start >= 0: one submitted at -10 vanished."""
    trace = Trace.from_columns(
        "neg", submit=np.array([-10.0, -3.0, 0.0, 5.0]), runtime=np.full(4, 5.0), procs=np.ones(4, dtype=np.int64)
    )
    run = replay(trace.jobs(), trace.cluster())
    assert sorted(j.id for j in run.jobs) == [1, 2, 3, 4]
    assert {j.id: j.start for j in run.jobs}[1] == -10.0


# --------------------------------------------------------------------------- duplicate ids


def test_a_repeated_job_id_names_both_lines(tmp_path: Path) -> None:
    path = write_text(tmp_path / "dup.swf", [*LINES, "; a comment", job_line(3, submit=900)])
    with pytest.raises(TraceError, match=r"dup\.swf:8: job id 3 already used on line 4; .*--lenient"):
        read_swf(path)


def test_lenient_keeps_the_first_line_of_a_repeated_id(tmp_path: Path) -> None:
    path = write_text(tmp_path / "dup.swf", [*LINES, job_line(3, submit=900, runtime=7)])
    trace = read_swf(path, lenient=True)
    assert trace.report.dropped_duplicate_id == 1
    assert sorted(trace.columns["job_id"].tolist()) == [1, 2, 3, 4, 5]
    assert 7.0 not in trace.columns["runtime"]


# --------------------------------------------------------------------------- encodings and containers


def test_a_byte_order_mark_does_not_break_line_one(tmp_path: Path) -> None:
    path = tmp_path / "bom.swf"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join([job_line(1), job_line(2)]).encode() + b"\n")
    assert len(read_swf(path)) == 2


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress], ids=["gzip", "bzip2", "xz"])
def test_compressed_traces_read_like_plain_ones(tmp_path: Path, compress: object) -> None:
    plain = write_text(tmp_path / "t.swf", LINES)
    packed = tmp_path / "t.swf.packed"
    packed.write_bytes(compress(plain.read_bytes()))  # type: ignore[operator]
    assert read_swf(packed).columns["runtime"].tolist() == read_swf(plain).columns["runtime"].tolist()


def test_a_corrupt_bzip2_file_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.swf.bz2"
    path.write_bytes(bz2.compress(b"x" * 100)[:20])
    with pytest.raises(TraceError, match=r"bad\.swf\.bz2: corrupt bzip2 data"):
        read_swf(path)


def test_a_zip_of_one_trace_is_read_and_of_two_refused(tmp_path: Path) -> None:
    one = tmp_path / "one.zip"
    with zipfile.ZipFile(one, "w") as archive:
        archive.writestr("t.swf", "\n".join(LINES))
    assert len(read_swf(one)) == 5
    two = tmp_path / "two.zip"
    with zipfile.ZipFile(two, "w") as archive:
        archive.writestr("a.swf", "\n".join(LINES))
        archive.writestr("b.swf", "\n".join(LINES))
    with pytest.raises(TraceError, match=r"two\.zip: a zip archive of 2 files"):
        read_swf(two)


def test_standard_input_is_read_and_a_fifo_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("\n".join(LINES).encode())))
    assert len(read_swf("-")) == 5
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: opening it would block forever
    with pytest.raises(TraceError, match=r"fifo: not a regular file"):
        read_swf(fifo)


# --------------------------------------------------------------------------- other formats and absurd values


@pytest.mark.parametrize("width", [19, 21])
def test_every_line_too_wide_is_another_format_lenient_cannot_help(tmp_path: Path, width: int) -> None:
    extra = " 0" * (width - 18)
    path = write_text(tmp_path / "wide.swf", ["; MaxProcs: 8", *(job_line(i) + extra for i in range(1, 4))])
    for lenient in (False, True):
        with pytest.raises(TraceError, match=rf"wide\.swf:2: expected 18 SWF fields, found {width} on every") as err:
            read_swf(path, lenient=lenient)
        assert "NF=18" in str(err.value) and "--lenient cannot help" in str(err.value)


@pytest.mark.parametrize(
    ("field", "value"), [("req_procs", "1e20"), ("runtime", "1e300"), ("alloc_procs", "-1e20"), ("submit", "1e11")]
)
def test_absurd_values_are_one_error_or_counted_drops(tmp_path: Path, field: str, value: str) -> None:
    path = write_text(tmp_path / "big.swf", [*LINES, job_line(6, **{field: value})])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy overflow warning may leak
        with pytest.raises(TraceError, match=rf"big\.swf:7: field \d+ \({field}\) is out of range"):
            read_swf(path)
        trace = read_swf(path, lenient=True)
    assert trace.report.malformed_skipped == 1 and len(trace) == 5


def test_out_of_order_submits_are_sorted_and_counted(tmp_path: Path) -> None:
    path = write_text(tmp_path / "order.swf", [*LINES, job_line(6, submit=15), job_line(7, submit=5)])
    trace = read_swf(path)
    assert trace.report.submit_out_of_order == 2
    assert trace.columns["job_id"].tolist() == [7, 1, 6, 2, 3, 4, 5]
    assert "submitted before the line above: sorted by submit time: 2" in trace.report.lines_out()


def test_a_window_past_the_end_says_so(tmp_path: Path) -> None:
    trace = read_swf(write_text(tmp_path / "t.swf", LINES))
    notes: list[str] = []
    (window,) = cut(trace, start=3, length=10, notes=notes)
    assert len(window) == 2
    assert notes == ["the window --start 3 --length 10 runs past the trace's end: replaying its last 2 jobs"]
    cut(trace, start=0, length=5, notes=notes)
    assert len(notes) == 1


# --------------------------------------------------------------------------- inferred machine size


def test_an_overloaded_inferred_machine_is_a_loud_warning(tmp_path: Path) -> None:
    """METACENTRUM's largest job has 60 processors: its load on 60 is 5, mean wait a year."""
    lines = [job_line(i, submit=i, runtime=1000, alloc_procs=8, req_procs=8) for i in range(1, 20)]
    trace = read_swf(write_text(tmp_path / "nohead.swf", lines))
    report = trace.report
    assert report.inferred_procs == 8 and report.offered_load is not None and report.offered_load > 1
    (warning,) = report.warnings
    assert "inferred machine of 8 processors" in warning and "--procs N" in warning
    assert report.as_dict()["inferred_procs"] == 8

    given = read_swf(write_text(tmp_path / "nohead.swf", lines), max_procs=1000)
    assert given.report.warnings == [] and given.report.inferred_procs is None


def test_a_header_size_is_never_second_guessed() -> None:
    """Lublin-1 offers a load of 1.06 on its MaxNodes 256: the log's truth, so reported, not warned about."""
    trace = read_swf(real_trace("lublin_256.swf"))
    assert trace.report.inferred_procs is None and trace.report.warnings == []
    assert trace.report.offered_load == pytest.approx(1.06, abs=0.01)


# --------------------------------------------------------------------------- the command line


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["replay", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_load_report_and_its_warning_reach_json_and_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [job_line(i, submit=i, runtime=1000, alloc_procs=8, req_procs=8) for i in range(1, 20)]
    path = write_text(tmp_path / "nohead.swf", [*lines, job_line(20, submit=-5)])
    rc, out, err = cli(capsys, str(path), "--json", "--out", str(tmp_path / "out"), "--no-plots")
    assert rc == 0, err
    assert "cosched: warning: offered load" in err and "--procs N" in err
    for payload in (json.loads(out), json.loads((tmp_path / "out" / "summary.json").read_text())):
        report = payload["load_report"]
        assert report["inferred_procs"] == 8 and report["dropped_submit_unknown"] == 1 and report["kept"] == 19
        assert report["warnings"] and report["offered_load"] > 1


def test_compare_names_plugin_classes_in_brackets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_text(tmp_path / "t.swf", LINES)
    rc, out, err = cli(capsys, str(path), "--json", "--compare", "fcfs:easy,[cosched.policies.queue:SJF]:easy:actual")
    assert rc == 0, err
    assert set(json.loads(out)["results"]) == {"fcfs+easy", "sjf+easy-actual"}
    rc, _, err = cli(capsys, str(path), "--compare", "cosched.policies.queue:SJF:easy")
    assert rc == 2 and "[module:Class]" in err
