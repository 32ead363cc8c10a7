"""Standard Workload Format (SWF) reading and writing.

An SWF file is `;`-comment header lines (`; MaxProcs: 128`) followed by one job
per line, 18 whitespace-separated numbers, -1 meaning unknown. Reading turns it
into a `Trace` of NumPy columns and applies cosched's cleaning rules, each
counted in the trace's `LoadReport` so a user can see what was changed and why.

Speed matters (the archive logs have 10^5 jobs and are re-read by every
experiment), so the happy path never loops in Python over tokens: the whole text
is converted by NumPy's C parser, and only a file that fails that check goes
through the slow per-line path, whose job is to name the bad line or skip it.
"""

from __future__ import annotations

import bz2
import gzip
import io
import itertools
import lzma
import math
import re
import stat
import sys
import warnings
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from cosched.errors import TraceError
from cosched.model import Job, JobState
from cosched.traces.trace import SWF_FIELDS, LoadReport, SwfHeader, Trace

__all__ = ["FLOAT_FIELDS", "parse_header", "read_swf", "write_swf"]

# Fields that carry fractions (times, average CPU time); every other field is an integer.
FLOAT_FIELDS: frozenset[str] = frozenset({"submit", "wait", "runtime", "avg_cpu", "req_time", "think_time"})

_NFIELDS = len(SWF_FIELDS)
_COL = {name: i for i, name in enumerate(SWF_FIELDS)}
# Compressed traces are recognised by content, as names lie both ways (.gz files that are plain text).
_DECOMPRESSORS = (
    (b"\x1f\x8b", "gzip", gzip.decompress),
    (b"BZh", "bzip2", bz2.decompress),
    (b"\xfd7zXZ\x00", "xz", lzma.decompress),
)
_ZIP_MAGIC = b"PK\x03\x04"
# The largest |value| a field may hold. Times (seconds) stop at 10^10 (317 years); processor counts at
# 10^8 (ten times the largest machine built); other counts at 2^53, the last integer a float holds exactly.
# Beyond these a value is a corrupt line, not a job, and would overflow the integer columns or the metrics.
_MAX_TIME = 1e10
_MAX_PROCS = 1e8
_FIELD_LIMITS = np.array(
    [_MAX_TIME if name in FLOAT_FIELDS else _MAX_PROCS if name.endswith("_procs") else 2.0**53 for name in SWF_FIELDS]
)
_STATUS_CANCELLED = 5
_STATUS_FAILED = 0
# "; Key: value": a one-word key, then a colon followed by space or the line's end, so
# continuation lines such as ";   http://host/path" are not mistaken for a key.
_HEADER_LINE = re.compile(r"^\s*([A-Za-z]\w*)\s*:(?:\s+(.*)|)$")
_LEADING_INT = re.compile(r"\s*([+-]?\d+)")
_NUMERIC_KEYS = {"maxnodes": "max_nodes", "maxprocs": "max_procs", "unixstarttime": "unix_start_time"}
_LENIENT_HINT = "lenient loading (--lenient) skips malformed lines"


# --------------------------------------------------------------------------- reading


CLEANINGS = ("standard", "dirlab")
"""`standard`: the rules below. `dirlab`: DIR-LAB's simulator's (RLScheduler, RLBackfilling), which
computed the RL backfilling paper's Table 4: a job with an unknown (-1) runtime is kept as a 10 s
job, and a job larger than the machine is cut to the machine's size instead of being dropped."""
UNKNOWN_RUNTIME_AS = 10.0


def read_swf(
    path: str | Path,
    *,
    lenient: bool = False,
    max_procs: int | None = None,
    drop_cancelled: bool = False,
    cleaning: str = "standard",
) -> Trace:
    """Read and clean an SWF trace (plain, gzip, bzip2, xz, or a zip of one file; `-` is standard input).

    Cleaning, in this order, each step counted in `trace.report`: jobs with an
    unknown (negative) submit time, jobs with runtime <= 0 (which includes jobs
    cancelled before they started), jobs with no known processor count, and jobs
    larger than the machine are dropped.
    Jobs cancelled after they started (status 5, runtime > 0) held their
    processors until cancelled, a quarter of SDSC-SP2's processor-seconds, so
    they are kept and counted (`cancelled_kept`), as the RL scheduling papers'
    simulators do; `drop_cancelled=True` drops every cancelled job instead.
    With `cleaning="dirlab"` (`CLEANINGS`), jobs with a negative runtime are kept as 10 s jobs
    (`runtime_unknown_as_10s`) and jobs above the machine's size are cut to it (`procs_cut_to_max`),
    as DIR-LAB's simulator does; every other rule stands.
    Then a requested time <= 0 is set to the runtime
    and one below the runtime is raised to it (so `req_time >= runtime` always holds,
    which backfilling relies on). `procs` = max(req_procs, alloc_procs). Jobs are
    then sorted stably by submit time (`submit_out_of_order` counts the jobs that moved).

    The machine size is `max_procs` when given (it overrides the header, and is
    stored as `trace.header.max_procs`; the header's own text stays in
    `header.fields`), else the header's MaxProcs, else MaxNodes; with none of these
    nothing is dropped for size, the size is inferred from the largest job, and
    `report.warnings` says so loudly when the trace's offered load on that size exceeds 1.

    A malformed job line (not 18 fields, a token that is not a finite number, or
    a value out of range) raises `TraceError("FILE:LINE: ...")`, or with
    `lenient=True` is skipped and counted in `report.malformed_skipped`. A job id
    seen on an earlier line raises likewise, or with `lenient=True` is dropped
    (the first line with that id is kept) and counted in `dropped_duplicate_id`.
    A file whose every job line has the same wrong number of fields is another
    format, which `lenient` cannot help: that raises in both modes. A missing,
    unreadable or non-regular file, or a trace with no job left after cleaning,
    raises `TraceError` too.
    """
    if max_procs is not None and max_procs <= 0:
        raise TraceError(f"max_procs must be positive, got {max_procs}")
    if cleaning not in CLEANINGS:
        raise TraceError(f"unknown cleaning {cleaning!r}; known: {', '.join(CLEANINGS)}")
    path = Path(path)
    text = _read_text(path)
    report = LoadReport(lines=_count_lines(text))
    comments = _comment_lines(text)
    report.comments = len(comments)
    header = parse_header([comment for _, comment in comments], source=str(path), lines=[n for n, _ in comments])

    data = _parse_fast(text, path)
    if data is None:
        data, report.malformed_skipped = _parse_slow(text, path, lenient)
    report.read = data.shape[0] + report.malformed_skipped
    data, report.dropped_duplicate_id = _unique_ids(data, text, path, lenient)

    columns = _to_columns(data)
    limit = _machine_limit(header, max_procs, report)
    if cleaning == "dirlab":
        _dirlab(columns, limit, report)
    columns = _clean(columns, limit, report, drop_cancelled)
    report.kept = int(columns["submit"].shape[0])
    if report.kept == 0:
        skipped = f", {report.malformed_skipped} of them malformed" if report.malformed_skipped else ""
        raise TraceError(f"{path}: no jobs left after cleaning ({report.read} job lines read{skipped})")
    _report_load(columns, limit, report)
    return Trace(_trace_name(path), _sort_by_submit(columns, report), header, report)


def _report_load(columns: dict[str, np.ndarray], limit: int | None, report: LoadReport) -> None:
    """The offered load on the machine, and a warning when a guessed machine size makes it absurd.

    Offered load = processor-seconds asked for / (processors x the submission span).
    Above 1, jobs arrive faster than the machine can run them and waits grow
    without bound; with a size read from the header that is the log's truth,
    with a size inferred from the largest job (METACENTRUM: 60 processors, load 5)
    it usually means the guess is wrong.
    """
    procs = limit if limit is not None else int(columns["procs"].max())
    submit = columns["submit"]
    span = float(submit.max() - submit.min())
    work = float(np.dot(columns["runtime"], columns["procs"]))
    report.offered_load = work / (procs * span) if span > 0 else None
    if limit is not None:
        return
    report.inferred_procs = procs
    report.notes.append(
        f"cluster size not in the header (no MaxProcs or MaxNodes): inferred from the largest job ({procs} processors)"
    )
    if report.offered_load is not None and report.offered_load > 1:
        report.warnings.append(
            f"offered load {report.offered_load:.2f} on the inferred machine of {procs} processors: jobs arrive "
            f"faster than it can run them and waits grow without bound; the log's machine is probably larger: "
            f"pass its size with --procs N (read_swf(..., max_procs=N))"
        )


def parse_header(comments: Iterable[str], *, source: str = "header", lines: Iterable[int] | None = None) -> SwfHeader:
    """Parse `Key: value` comment lines (text after the `;`) into an `SwfHeader`.

    Tolerant on purpose: archive headers carry free text, continuation lines and
    annotated values. Every key is kept in `fields` (a repeated key such as Queue
    or Note keeps all its values, joined by newlines); MaxNodes, MaxProcs and
    UnixStartTime also get the leading integer of their first value
    (`338 (batch partition; 512 total)` -> 338). A value without one, or a
    non-positive machine size, is kept only in `fields`.

    A machine size above 10^8, the cap of a job's processor fields, is a corrupt
    header, not a machine: it raises `TraceError("SOURCE:LINE: ...")` (`lines`
    numbers the comments; by default 1, 2, ...) instead of an overflow when the
    cluster is built.
    """
    header = SwfHeader()
    for line, comment in zip(itertools.count(1) if lines is None else lines, comments, strict=False):
        match = _HEADER_LINE.match(comment)
        if match is None:
            continue
        key, value = match.group(1), (match.group(2) or "").strip()
        old = header.fields.get(key)
        header.fields[key] = value if old is None else f"{old}\n{value}"
        attr = _NUMERIC_KEYS.get(key.lower())
        if attr is None or getattr(header, attr) is not None:
            continue
        number = _leading_int(value)
        if attr != "unix_start_time" and number is not None and number > _MAX_PROCS:
            raise TraceError(f"{source}:{line}: {key} {number} is above 10^8 processors: a corrupt header")
        if number is not None and (attr == "unix_start_time" or number > 0):
            setattr(header, attr, number)
    return header


def _leading_int(value: str) -> int | None:
    match = _LEADING_INT.match(value)
    return int(match.group(1)) if match else None


def _read_text(path: Path) -> str:
    """The decompressed text, with a UTF-8 byte order mark and CR line ends removed."""
    raw = _decompress(_read_bytes(path), path)
    text = raw.decode("utf-8-sig", errors="replace")
    if "\r" in text:  # CRLF copies of archive logs exist
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _read_bytes(path: Path) -> bytes:
    """The file's bytes; `-` is standard input.

    Anything else that is not a regular file is refused before it is opened:
    reading a FIFO with no writer, or a terminal, would block forever.
    """
    if str(path) == "-":
        return sys.stdin.buffer.read()
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise TraceError(f"cannot read trace {path}: it is a directory")
        if not stat.S_ISREG(mode):
            raise TraceError(f"cannot read trace {path}: not a regular file (pipe or device); use '-' for stdin")
        return path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"trace not found: {path}") from None
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None


def _decompress(raw: bytes, path: Path) -> bytes:
    """gzip, bzip2 and xz by their magic bytes; a zip archive holding exactly one file."""
    for magic, name, decompress in _DECOMPRESSORS:
        if raw.startswith(magic):
            try:
                return decompress(raw)
            except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
                raise TraceError(f"{path}: corrupt {name} data: {exc}") from None
    if raw.startswith(_ZIP_MAGIC):
        try:
            with zipfile.ZipFile(io.BytesIO(raw)) as archive:
                members = [m for m in archive.infolist() if not m.is_dir()]
                if len(members) != 1:
                    raise TraceError(
                        f"{path}: a zip archive of {len(members)} files; cosched reads a zip of exactly one trace "
                        f"(unzip it and name the trace)"
                    )
                return archive.read(members[0])
        except (zipfile.BadZipFile, zlib.error, NotImplementedError, EOFError) as exc:
            raise TraceError(f"{path}: corrupt zip archive: {exc}") from None
    return raw


def _trace_name(path: Path) -> str:
    """File name without its .swf and compression suffixes: SDSC-SP2-1998-4.2-cln.swf.gz -> SDSC-SP2-1998-4.2-cln."""
    name = path.name
    while True:
        stem, dot, suffix = name.rpartition(".")
        if not (dot and stem and suffix.lower() in ("swf", "gz", "bz2", "xz", "zip")):
            return name
        name = stem


def _count_lines(text: str) -> int:
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def _comment_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text after `;`) of every comment line; the number lets a bad header value be named.

    Comments normally form one block at the top, so that block is scanned line by
    line and the rest of the file is only searched for `;`; the line-by-line scan
    of the body happens only for files with comments between jobs.
    """
    comments: list[tuple[int, str]] = []
    pos, size, number = 0, len(text), 1
    while pos < size:
        end = text.find("\n", pos)
        end = size if end < 0 else end
        line = text[pos:end].strip()
        if line and not line.startswith(";"):
            break
        if line:
            comments.append((number, line[1:]))
        pos, number = end + 1, number + 1
    body = text[pos:]
    if ";" in body:
        stripped = enumerate((line.strip() for line in body.split("\n")), start=number)
        comments += [(n, s[1:]) for n, s in stripped if s.startswith(";")]
    return comments


def _parse_fast(text: str, path: Path) -> np.ndarray | None:
    """All job lines as an (n, 18) float array, or None if any line is malformed.

    NumPy's C parser checks that every line has the same number of fields; the
    shape, finiteness and range checks below catch the rest. Every line with the
    same wrong number of fields is another format, reported here in both modes.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "input contained no data"
            data = np.loadtxt(io.StringIO(text), dtype=np.float64, comments=";", ndmin=2)
    except ValueError:
        return None
    if data.size == 0:
        return np.empty((0, _NFIELDS))
    if data.shape[1] != _NFIELDS:
        raise TraceError(f"{path}:{_job_line_numbers(text)[0]}: {_other_format(data.shape[1])}")
    if not (np.abs(data) <= _FIELD_LIMITS).all():  # NaN and inf fail too
        return None
    return data


def _other_format(width: int) -> str:
    """What a file whose every job line has `width` fields is, and what to do with it."""
    what = (
        "an extended SWF (e.g. the Theta/Mira walltime logs' 19 fields, Alea's 21-field format), whose extra "
        "columns cosched does not guess at"
        if width > _NFIELDS
        else "not SWF, or a log cut short"
    )
    fix = "; if the first 18 are the standard fields, keep them: awk '/^;/ {print; next} {NF=18; print}' IN > OUT"
    return (
        f"expected {_NFIELDS} SWF fields, found {width} on every job line: {what}"
        f"{fix if width > _NFIELDS else ''} (--lenient cannot help: it would skip every line)"
    )


def _job_line_numbers(text: str) -> list[int]:
    """1-based line numbers of the job lines (neither blank nor comment), in order; for error messages only."""
    return [n for n, line in enumerate(text.split("\n"), start=1) if line.split(";", 1)[0].strip()]


def _parse_slow(text: str, path: Path, lenient: bool) -> tuple[np.ndarray, int]:
    """Line-by-line parse that names the first bad line (strict) or skips bad lines.

    Returns the good rows and the number of lines skipped.
    """
    rows: list[list[float]] = []
    skipped = 0
    for lineno, line in enumerate(text.split("\n"), start=1):
        tokens = line.split(";", 1)[0].split()
        if not tokens:
            continue
        values, problem = _parse_line(tokens)
        if problem is None:
            rows.append(values)
        elif lenient:
            skipped += 1
        else:
            raise TraceError(f"{path}:{lineno}: {problem}; {_LENIENT_HINT}")
    data = np.array(rows, dtype=np.float64) if rows else np.empty((0, _NFIELDS))
    return data.reshape(-1, _NFIELDS), skipped


def _parse_line(tokens: Sequence[str]) -> tuple[list[float], str | None]:
    """The 18 values of one job line, or what is wrong with it."""
    if len(tokens) != _NFIELDS:
        return [], f"expected {_NFIELDS} SWF fields, found {len(tokens)}"
    values: list[float] = []
    for i, token in enumerate(tokens):
        try:
            value = float(token)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            return [], f"field {i + 1} ({SWF_FIELDS[i]}) is not a number: {token!r}"
        if abs(value) > _FIELD_LIMITS[i]:
            return [], f"field {i + 1} ({SWF_FIELDS[i]}) is out of range: {token} (limit {_FIELD_LIMITS[i]:.3g})"
        values.append(value)
    return values, None


def _unique_ids(data: np.ndarray, text: str, path: Path, lenient: bool) -> tuple[np.ndarray, int]:
    """The rows with the first occurrence of each job id, and how many repeats were dropped.

    The core keys jobs by id, so a repeat would fail mid-replay (overlapping) or
    appear twice in the results (not); strict mode names both lines instead.
    """
    ids = data[:, 0]
    _, first = np.unique(ids, return_index=True)
    if first.shape[0] == ids.shape[0]:
        return data, 0
    keep = np.zeros(ids.shape[0], dtype=bool)
    keep[first] = True
    if lenient:
        return data[keep], int((~keep).sum())
    repeat = int(np.flatnonzero(~keep)[0])
    original = int(np.flatnonzero(ids == ids[repeat])[0])
    lines = _job_line_numbers(text)  # strict: no line was skipped, so row i is job line i
    raise TraceError(
        f"{path}:{lines[repeat]}: job id {int(ids[repeat])} already used on line {lines[original]}; "
        f"lenient loading (--lenient) keeps the first line of each id and drops the repeats"
    )


def _to_columns(data: np.ndarray) -> dict[str, np.ndarray]:
    """One contiguous array per SWF field, plus `procs` = max(req_procs, alloc_procs).

    Requested and allocated counts are both used because logs fill in either one
    (the Lublin traces only alloc_procs, some others only req_procs).
    """
    columns: dict[str, np.ndarray] = {}
    for i, name in enumerate(SWF_FIELDS):
        col = data[:, i]
        columns[name] = col.copy() if name in FLOAT_FIELDS else np.rint(col).astype(np.int64)
    columns["procs"] = np.maximum(columns["req_procs"], columns["alloc_procs"])
    return columns


def _machine_limit(header: SwfHeader, max_procs: int | None, report: LoadReport) -> int | None:
    """Processors of the machine, from the argument or the header; notes where it came from."""
    if max_procs is not None:
        from_header = header.max_procs or header.max_nodes
        if from_header is None:
            report.notes.append(f"cluster size not in the header: max_procs={max_procs} as given")
        elif from_header != max_procs:
            report.notes.append(f"max_procs={max_procs} as given overrides the header's {from_header}")
        header.max_procs = max_procs
        return max_procs
    if header.max_procs:
        return header.max_procs
    if header.max_nodes:
        report.notes.append(f"no MaxProcs in the header: MaxNodes ({header.max_nodes}) taken as processors")
        return header.max_nodes
    return None


def _dirlab(columns: dict[str, np.ndarray], limit: int | None, report: LoadReport) -> None:
    """DIR-LAB's data treatment, before the standard rules (which then drop nothing it keeps)."""
    runtime = columns["runtime"]
    unknown = runtime < 0
    report.runtime_unknown_as_10s = int(unknown.sum())
    runtime[unknown] = UNKNOWN_RUNTIME_AS
    if limit is not None:
        above = columns["procs"] > limit
        report.procs_cut_to_max = int(above.sum())
        columns["procs"][above] = limit


def _clean(
    columns: dict[str, np.ndarray], limit: int | None, report: LoadReport, drop_cancelled: bool
) -> dict[str, np.ndarray]:
    """Apply the cleaning rules in order, counting each on the jobs that survived the previous."""
    cancelled = columns["status"] == _STATUS_CANCELLED
    drops: list[tuple[str, np.ndarray]] = [
        ("dropped_submit_unknown", columns["submit"] < 0),
        ("dropped_runtime", columns["runtime"] <= 0),
        ("dropped_procs_unknown", columns["procs"] <= 0),
    ]
    if drop_cancelled:
        drops.insert(1, ("dropped_cancelled", cancelled))
    if limit is not None:
        drops.append(("dropped_procs_above_max", columns["procs"] > limit))
    keep = np.ones(columns["submit"].shape[0], dtype=bool)
    for counter, bad in drops:
        hit = keep & bad
        setattr(report, counter, int(hit.sum()))
        keep &= ~hit
    report.cancelled_kept = int((keep & cancelled).sum())
    if not keep.all():
        columns = {name: col[keep] for name, col in columns.items()}

    runtime, req_time = columns["runtime"], columns["req_time"]
    unknown = req_time <= 0
    report.req_time_from_runtime = int(unknown.sum())
    req_time[unknown] = runtime[unknown]
    short = req_time < runtime
    report.req_time_raised_to_runtime = int(short.sum())
    req_time[short] = runtime[short]
    return columns


def _sort_by_submit(columns: dict[str, np.ndarray], report: LoadReport) -> dict[str, np.ndarray]:
    """Stable sort by submit time; archive logs are already sorted, so usually a no-op.

    `report.submit_out_of_order` counts the jobs submitted before the job on the line above them.
    """
    submit = columns["submit"]
    report.submit_out_of_order = int((submit[1:] < submit[:-1]).sum())
    if not report.submit_out_of_order:
        return columns
    order = np.argsort(submit, kind="stable")
    return {name: col[order] for name, col in columns.items()}


# --------------------------------------------------------------------------- writing


def write_swf(path: str | Path, trace_or_jobs: Trace | Sequence[Job], header: SwfHeader | None = None) -> Path:
    """Write a trace, or the jobs of a replay, as SWF (gzip when `path` ends in .gz).

    `header` defaults to the trace's own (none for a job list). A `Job` list is
    written from the jobs' fields, so a finished replay becomes a trace other SWF
    tools can read: wait = start - submit, runtime as it ran; unknown -> -1.
    Reading the file back reproduces a trace's columns.
    """
    path = Path(path)
    if isinstance(trace_or_jobs, Trace):
        columns = trace_or_jobs.columns
        header = trace_or_jobs.header if header is None else header
    else:
        columns = _jobs_to_columns(trace_or_jobs)
    lines = _header_lines(header) if header is not None else []
    body = _format_rows(columns)
    text = "\n".join([*lines, body]) if body else "\n".join(lines)
    data = (text + "\n").encode("utf-8")
    if path.name.lower().endswith(".gz"):
        data = gzip.compress(data, mtime=0)  # mtime=0: same trace, same bytes
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise TraceError(f"cannot write trace {path}: {exc.strerror or exc}") from None
    return path


def _header_lines(header: SwfHeader) -> list[str]:
    """`; Key: value` lines; the parsed numbers win over field text that disagrees.

    The numbers are what cosched used (e.g. a `max_procs` override), so a re-read
    must see them; matching text such as `338 (batch partition)` is kept as is.
    """
    fields = dict(header.fields)
    for key, number in (
        ("MaxNodes", header.max_nodes),
        ("MaxProcs", header.max_procs),
        ("UnixStartTime", header.unix_start_time),
    ):
        if number is None:
            continue
        existing = next((k for k in fields if k.lower() == key.lower()), key)
        text = fields.get(existing)
        if text is None or _leading_int(text.split("\n", 1)[0]) != number:
            fields[existing] = str(number)
    return [f"; {key}: {value}".rstrip() for key, values in fields.items() for value in values.split("\n")]


def _format_rows(columns: dict[str, np.ndarray]) -> str:
    """Job lines, formatted column by column (no per-token Python formatting loop)."""
    n = int(np.asarray(columns["submit"]).shape[0])
    if n == 0:
        return ""
    texts = [_format_column(np.asarray(columns.get(name, np.full(n, -1)))) for name in SWF_FIELDS]
    return "\n".join(map(" ".join, zip(*texts, strict=True)))


def _format_column(col: np.ndarray) -> list[str]:
    """Integers as integers; fractional floats with the shortest text that reads back exactly."""
    if col.dtype.kind in "iub":
        return list(map(str, col.astype(np.int64).tolist()))
    col = col.astype(np.float64)
    if bool((col == np.rint(col)).all()) and bool((np.abs(col) < 2.0**53).all()):
        return list(map(str, col.astype(np.int64).tolist()))
    return [str(int(v)) if v.is_integer() else repr(v) for v in col.tolist()]


def _jobs_to_columns(jobs: Sequence[Job]) -> dict[str, np.ndarray]:
    """SWF columns from `Job` objects; fields a Job does not carry are -1."""
    n = len(jobs)
    cols: dict[str, np.ndarray] = {
        name: np.full(n, -1.0) if name in FLOAT_FIELDS else np.full(n, -1, dtype=np.int64) for name in SWF_FIELDS
    }
    for i, job in enumerate(jobs):
        cols["job_id"][i] = job.id
        cols["submit"][i] = job.submit
        cols["wait"][i] = job.start - job.submit if job.start >= 0 else -1.0
        cols["runtime"][i] = _job_runtime(job)
        cols["alloc_procs"][i] = job.cores
        cols["req_procs"][i] = job.cores
        cols["req_time"][i] = job.walltime if job.walltime > 0 else -1.0
        cols["req_memory"][i] = job.memory * 1024 if job.memory > 0 else -1  # MiB -> KB, as SWF
        cols["status"][i] = _job_status(job)
        cols["user"][i] = job.user
        cols["group"][i] = job.group
        cols["app"][i] = job.app
        cols["queue"][i] = job.queue
        cols["partition"][i] = job.partition
        cols["preceding_job"][i] = job.depends
        cols["think_time"][i] = job.think_time
    return cols


def _job_runtime(job: Job) -> float:
    """How long the job ran: its runtime, or the time it actually held its cores when
    the replay ended it earlier (killed at its requested time); -1 if unknown."""
    ran = job.end - job.start if job.start >= 0 and job.end >= job.start else None
    if job.runtime is None:
        return -1.0 if ran is None else ran
    if ran is not None and ran < job.runtime - 1e-6 * max(1.0, job.runtime):
        return ran
    return float(job.runtime)


def _job_status(job: Job) -> int:
    """SWF status: the core's verdict where it has one (cancelled 5, failed 0), else the job's."""
    if job.state is JobState.CANCELLED:
        return _STATUS_CANCELLED
    if job.state is JobState.FAILED:
        return _STATUS_FAILED
    return job.status
