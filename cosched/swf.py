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

import gzip
import io
import math
import re
import warnings
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from cosched.errors import TraceError
from cosched.model import Job, JobState
from cosched.trace import SWF_FIELDS, LoadReport, SwfHeader, Trace

__all__ = ["FLOAT_FIELDS", "parse_header", "read_swf", "write_swf"]

# Fields that carry fractions (times, average CPU time); every other field is an integer.
FLOAT_FIELDS: frozenset[str] = frozenset({"submit", "wait", "runtime", "avg_cpu", "req_time", "think_time"})

_NFIELDS = len(SWF_FIELDS)
_COL = {name: i for i, name in enumerate(SWF_FIELDS)}
_GZIP_MAGIC = b"\x1f\x8b"
_STATUS_CANCELLED = 5
_STATUS_FAILED = 0
# "; Key: value": a one-word key, then a colon followed by space or the line's end, so
# continuation lines such as ";   http://host/path" are not mistaken for a key.
_HEADER_LINE = re.compile(r"^\s*([A-Za-z]\w*)\s*:(?:\s+(.*)|)$")
_LEADING_INT = re.compile(r"\s*([+-]?\d+)")
_NUMERIC_KEYS = {"maxnodes": "max_nodes", "maxprocs": "max_procs", "unixstarttime": "unix_start_time"}
_LENIENT_HINT = "lenient loading (--lenient) skips malformed lines"


# --------------------------------------------------------------------------- reading


def read_swf(
    path: str | Path, *, lenient: bool = False, max_procs: int | None = None, drop_cancelled: bool = False
) -> Trace:
    """Read and clean an SWF trace (plain or gzip, detected by its magic bytes).

    Cleaning, in this order, each step counted in `trace.report`: jobs with
    runtime <= 0 (which includes jobs cancelled before they started), jobs with
    no known processor count, and jobs larger than the machine are dropped.
    Jobs cancelled after they started (status 5, runtime > 0) held their
    processors until cancelled, a quarter of SDSC-SP2's processor-seconds, so
    they are kept and counted (`cancelled_kept`), as the RL scheduling papers'
    simulators do; `drop_cancelled=True` drops every cancelled job instead.
    Then a requested time <= 0 is set to the runtime
    and one below the runtime is raised to it (so `req_time >= runtime` always holds,
    which backfilling relies on). `procs` = max(req_procs, alloc_procs). Jobs are
    then sorted stably by submit time.

    The machine size is `max_procs` when given (it overrides the header, and is
    stored as `trace.header.max_procs`; the header's own text stays in
    `header.fields`), else the header's MaxProcs, else MaxNodes; with none of these
    nothing is dropped for size and a note records that the size was inferred
    from the largest job.

    A malformed job line (not 18 fields, or a token that is not a finite number)
    raises `TraceError("FILE:LINE: ...")`, or with `lenient=True` is skipped and
    counted in `report.malformed_skipped`. A missing or unreadable file, or a trace
    with no job left after cleaning, raises `TraceError` too.
    """
    if max_procs is not None and max_procs <= 0:
        raise TraceError(f"max_procs must be positive, got {max_procs}")
    path = Path(path)
    text = _read_text(path)
    report = LoadReport(lines=_count_lines(text))
    comments = _comment_lines(text)
    report.comments = len(comments)
    header = parse_header(comments)

    data = _parse_fast(text)
    if data is None:
        data, report.malformed_skipped = _parse_slow(text, path, lenient)
    report.read = data.shape[0] + report.malformed_skipped

    columns = _to_columns(data)
    limit = _machine_limit(header, max_procs, report)
    columns = _clean(columns, limit, report, drop_cancelled)
    report.kept = int(columns["submit"].shape[0])
    if report.kept == 0:
        skipped = f", {report.malformed_skipped} of them malformed" if report.malformed_skipped else ""
        raise TraceError(f"{path}: no jobs left after cleaning ({report.read} job lines read{skipped})")
    if limit is None:
        largest = int(columns["procs"].max())
        report.notes.append(
            f"cluster size not in the header (no MaxProcs or MaxNodes): "
            f"inferred from the largest job ({largest} processors)"
        )
    return Trace(_trace_name(path), _sort_by_submit(columns), header, report)


def parse_header(comments: Iterable[str]) -> SwfHeader:
    """Parse `Key: value` comment lines (text after the `;`) into an `SwfHeader`.

    Tolerant on purpose: archive headers carry free text, continuation lines and
    annotated values. Every key is kept in `fields` (a repeated key such as Queue
    or Note keeps all its values, joined by newlines); MaxNodes, MaxProcs and
    UnixStartTime also get the leading integer of their first value
    (`338 (batch partition; 512 total)` -> 338). A value without one, or a
    non-positive machine size, is kept only in `fields`.
    """
    header = SwfHeader()
    for comment in comments:
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
        if number is not None and (attr == "unix_start_time" or number > 0):
            setattr(header, attr, number)
    return header


def _leading_int(value: str) -> int | None:
    match = _LEADING_INT.match(value)
    return int(match.group(1)) if match else None


def _read_text(path: Path) -> str:
    """The decompressed text; gzip is recognised by content, as .gz names lie both ways."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"trace not found: {path}") from None
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{path}: corrupt gzip data: {exc}") from None
    text = raw.decode("utf-8", errors="replace")
    if "\r" in text:  # CRLF copies of archive logs exist
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _trace_name(path: Path) -> str:
    """File name without its .swf/.gz suffixes: SDSC-SP2-1998-4.2-cln.swf.gz -> SDSC-SP2-1998-4.2-cln."""
    name = path.name
    while True:
        stem, dot, suffix = name.rpartition(".")
        if not (dot and stem and suffix.lower() in ("swf", "gz")):
            return name
        name = stem


def _count_lines(text: str) -> int:
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def _comment_lines(text: str) -> list[str]:
    """Text after `;` of every comment line.

    Comments normally form one block at the top, so that block is scanned line by
    line and the rest of the file is only searched for `;`; the line-by-line scan
    of the body happens only for files with comments between jobs.
    """
    comments: list[str] = []
    pos, size = 0, len(text)
    while pos < size:
        end = text.find("\n", pos)
        end = size if end < 0 else end
        line = text[pos:end].strip()
        if line and not line.startswith(";"):
            break
        if line:
            comments.append(line[1:])
        pos = end + 1
    body = text[pos:]
    if ";" in body:
        comments += [s[1:] for s in (line.strip() for line in body.split("\n")) if s.startswith(";")]
    return comments


def _parse_fast(text: str) -> np.ndarray | None:
    """All job lines as an (n, 18) float array, or None if any line is malformed.

    NumPy's C parser checks that every line has the same number of fields; the
    shape and finiteness checks below catch the rest (e.g. every line with 19).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "input contained no data"
            data = np.loadtxt(io.StringIO(text), dtype=np.float64, comments=";", ndmin=2)
    except ValueError:
        return None
    if data.size == 0:
        return np.empty((0, _NFIELDS))
    if data.shape[1] != _NFIELDS or not np.isfinite(data).all():
        return None
    return data


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
        values.append(value)
    return values, None


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


def _clean(
    columns: dict[str, np.ndarray], limit: int | None, report: LoadReport, drop_cancelled: bool
) -> dict[str, np.ndarray]:
    """Apply the cleaning rules in order, counting each on the jobs that survived the previous."""
    cancelled = columns["status"] == _STATUS_CANCELLED
    drops: list[tuple[str, np.ndarray]] = [
        ("dropped_runtime", columns["runtime"] <= 0),
        ("dropped_procs_unknown", columns["procs"] <= 0),
    ]
    if drop_cancelled:
        drops.insert(0, ("dropped_cancelled", cancelled))
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


def _sort_by_submit(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Stable sort by submit time; archive logs are already sorted, so usually a no-op."""
    submit = columns["submit"]
    if submit.shape[0] < 2 or bool((submit[1:] >= submit[:-1]).all()):
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
