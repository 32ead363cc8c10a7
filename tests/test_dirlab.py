"""The RL backfilling paper's protocol: DIR-LAB's data treatment (`--cleaning dirlab`) and its EASY."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import real_trace
from swf_lines import job_line, write_text

from cosched.errors import TraceError
from cosched.model import Cluster, Job
from cosched.replay.driver import PolicySet, replay
from cosched.traces.swf import read_swf

HEADER = ["; MaxNodes: 8", "; MaxProcs: 8"]


def _trace(tmp_path: Path) -> Path:
    return write_text(
        tmp_path / "t.swf",
        [
            *HEADER,
            job_line(1),
            job_line(2, runtime=-1, req_time=5),  # unknown runtime: dropped, or a 10 s job
            job_line(3, runtime=-1, req_time=-1),
            job_line(4, alloc_procs=16, req_procs=16),  # above the machine: dropped, or cut to 8
            job_line(5, runtime=0),  # dropped by both
        ],
    )


def test_standard_cleaning_drops_unknown_runtimes_and_oversized_jobs(tmp_path: Path) -> None:
    trace = read_swf(_trace(tmp_path))
    assert trace.columns["job_id"].tolist() == [1]
    assert trace.report.dropped_runtime == 3 and trace.report.dropped_procs_above_max == 1


def test_dirlab_cleaning_keeps_them_as_dir_lab_does(tmp_path: Path) -> None:
    trace = read_swf(_trace(tmp_path), cleaning="dirlab")
    c = trace.columns
    assert c["job_id"].tolist() == [1, 2, 3, 4]
    assert c["runtime"].tolist() == [50, 10, 10, 50]
    assert c["req_time"].tolist() == [100, 10, 10, 100]  # a request below the runtime is raised to it
    assert c["procs"].tolist() == [4, 4, 4, 8]
    report = trace.report
    assert (report.runtime_unknown_as_10s, report.procs_cut_to_max, report.dropped_runtime) == (2, 1, 1)
    assert "runtime -1 kept as a 10 s job (--cleaning dirlab): 2" in report.lines_out()


def test_an_unknown_cleaning_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unknown cleaning 'paper'; known: standard, dirlab"):
        read_swf(_trace(tmp_path), cleaning="paper")


def test_dirlab_cleaning_gives_the_paper_s_magnitude_on_sdsc_sp2() -> None:
    """5,671 jobs with runtime -1 are the difference between our SDSC-SP2 row and the paper's."""
    path = real_trace("SDSC-SP2-1998-4.2-cln.swf.gz")
    standard, dirlab = read_swf(path), read_swf(path, cleaning="dirlab")
    assert dirlab.report.runtime_unknown_as_10s == 5671
    assert len(dirlab) - len(standard) == 5671


def _jobs() -> list[Job]:
    return [
        Job(id=1, submit=0, cores=3, walltime=100, runtime=100),
        Job(id=2, submit=1, cores=4, walltime=100, runtime=100),  # the blocked head: shadow 100, 1 core extra
        Job(id=3, submit=2, cores=1, walltime=300, runtime=300),  # fits the extra core, ends after the shadow
    ]


def test_dirlab_easy_has_no_extra_capacity_rule() -> None:
    """Head (4 cores) blocked on a 5-core machine with 3 busy: the shadow leaves 1 core extra.
    Textbook EASY backfills a long 1-core job into it; DIR-LAB's only jobs ending before the shadow."""
    textbook = replay(_jobs(), Cluster(5), PolicySet("fcfs", "easy"))
    dirlab = replay(_jobs(), Cluster(5), PolicySet("fcfs", "easy-dirlab"))
    start = {j.id: j.start for j in textbook.jobs}
    start_dirlab = {j.id: j.start for j in dirlab.jobs}
    assert start[3] == 2.0
    assert start_dirlab[3] > 2.0


def test_dirlab_easy_keeps_the_shadow_of_a_head_until_it_starts() -> None:
    """A job ending early brings the head's shadow forward in textbook EASY (50 instead of 100);
    DIR-LAB's keeps 100, so a job that ends at 60 is still backfilled, and the head waits for it."""

    def jobs() -> list[Job]:
        return [
            Job(id=1, submit=0, cores=2, walltime=100, runtime=10),  # ends early, at 10
            Job(id=2, submit=0, cores=2, walltime=50, runtime=50),
            Job(id=3, submit=1, cores=5, walltime=10, runtime=10),  # blocked head: shadow 100, then 50
            Job(id=4, submit=20, cores=2, walltime=40, runtime=40),  # ends at 60
        ]

    textbook = {j.id: j.start for j in replay(jobs(), Cluster(5), PolicySet("fcfs", "easy"), validate=True).jobs}
    dirlab = {j.id: j.start for j in replay(jobs(), Cluster(5), PolicySet("fcfs", "easy-dirlab"), validate=True).jobs}
    assert (textbook[3], textbook[4]) == (50.0, 60.0)
    assert (dirlab[3], dirlab[4]) == (60.0, 20.0)
