"""BLAST: search query sequences against a nucleotide database, as map (split), search, reduce.

Why planted queries: random DNA has (almost surely) no long exact matches, so every
hit BLAST reports for a query comes from the substring we copied into it from a known
database sequence at a known offset. That makes the outputs checkable (`verify`)
without a reference BLAST run, while the search itself is the real ``blastn``.

Files in the working directory:
    database.fasta, queries.fasta, planted.tsv   generate
    db/db.*, pieces/query_NNNN.fasta             split
    pieces/hits_NNNN.tsv                         blastn (one per piece)
    hits.tsv                                     merge (outfmt 6, sorted)
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import numpy as np

from .common import Params, Progress, StageError, parallel_map, require, run_tool

SIZES: dict[str, dict[str, int]] = {
    "test": {
        "sequences": 200,
        "length": 2000,
        "queries": 40,
        "query_length": 400,
        "planted": 150,
        "mutations": 3,
        "pieces": 4,
        "seed": 1,
    },
    "small": {
        "sequences": 10000,
        "length": 5000,
        "queries": 90000,
        "query_length": 600,
        "planted": 200,
        "mutations": 4,
        "pieces": 32,
        "seed": 1,
    },
    "study": {
        "sequences": 20000,
        "length": 5000,
        "queries": 1000000,
        "query_length": 600,
        "planted": 250,
        "mutations": 5,
        "pieces": 128,
        "seed": 1,
    },
}
DEFAULTS: dict[str, int] = SIZES["test"]

BASES = np.frombuffer(b"ACGT", dtype=np.uint8)
COMPLEMENT = bytes.maketrans(b"ACGT", b"TGCA")
FASTA_WIDTH = 80
HIT_FIELDS = 12  # outfmt 6: qseqid sseqid pident length mismatch gapopen qstart qend sstart send evalue bitscore


def tasks(params: Params) -> dict[str, int]:
    """One task per sequential stage, one per query piece for the search."""
    return {"generate": 1, "split": 1, "blastn": int(params["pieces"]), "merge": 1}


# -- generate ---------------------------------------------------------------------------


def _fasta_record(name: str, sequence: bytes) -> bytes:
    lines = [sequence[i : i + FASTA_WIDTH] for i in range(0, len(sequence), FASTA_WIDTH)]
    return b">" + name.encode() + b"\n" + b"\n".join(lines) + b"\n"


def _mutate(segment: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Point substitutions away from the segment's ends, so the alignment still spans it."""
    segment = segment.copy()
    margin = min(10, len(segment) // 4)
    positions = rng.choice(np.arange(margin, len(segment) - margin), size=count, replace=False)
    segment[positions] = (segment[positions] + rng.integers(1, 4, size=count)) % 4
    return segment


def _plant(index: int, database: np.ndarray, params: Params, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """A random query carrying a (mutated, maybe reverse-complemented) copy of a database piece."""
    length, planted = int(params["query_length"]), int(params["planted"])
    query = rng.integers(0, 4, size=length, dtype=np.uint8)
    subject = int(rng.integers(0, database.shape[0]))
    offset = int(rng.integers(0, database.shape[1] - planted + 1))
    segment = _mutate(database[subject, offset : offset + planted], int(params["mutations"]), rng)
    strand = "plus" if rng.random() < 0.5 else "minus"
    if strand == "minus":
        segment = (3 - segment)[::-1]  # A<->T, C<->G in the 0..3 coding
    at = int(rng.integers(0, length - planted + 1))
    query[at : at + planted] = segment
    return query, f"q{index:07d}\ts{subject:07d}\t{offset}\t{strand}\n"


def _check_sizes(params: Params) -> None:
    if int(params["planted"]) > min(int(params["length"]), int(params["query_length"])):
        raise StageError("planted must not exceed length or query_length")
    if int(params["mutations"]) * 4 > int(params["planted"]):
        raise StageError("too many mutations for the planted length (BLAST would miss them)")
    if min(int(params[k]) for k in ("sequences", "queries", "pieces")) < 1:
        raise StageError("sequences, queries and pieces must be positive")


def generate(work_dir: Path, params: Params, progress: Progress) -> None:
    """Seeded random database and queries, and planted.tsv saying where each query came from."""
    _check_sizes(params)
    rng = np.random.default_rng(int(params["seed"]))
    database = rng.integers(0, 4, size=(int(params["sequences"]), int(params["length"])), dtype=np.uint8)
    with open(work_dir / "database.fasta", "wb") as out:
        for index, row in enumerate(database):
            out.write(_fasta_record(f"s{index:07d}", BASES[row].tobytes()))
    with open(work_dir / "queries.fasta", "wb") as out, open(work_dir / "planted.tsv", "w") as table:
        table.write("query\tsubject\toffset\tstrand\n")
        for index in range(int(params["queries"])):
            query, line = _plant(index, database, params, rng)
            out.write(_fasta_record(f"q{index:07d}", BASES[query].tobytes()))
            table.write(line)
    progress.advance()


# -- split ------------------------------------------------------------------------------


def _read_records(path: Path) -> list[bytes]:
    """FASTA records, each with its header line, as raw bytes."""
    text = path.read_bytes()
    return [b">" + part for part in text.split(b"\n>") if part.strip(b">\n")] if text else []


def _piece(work_dir: Path, index: int, kind: str) -> Path:
    suffix = "fasta" if kind == "query" else "tsv"
    return work_dir / "pieces" / f"{kind}_{index:04d}.{suffix}"


def split(work_dir: Path, params: Params, progress: Progress) -> None:
    """Format the database for BLAST and cut the queries into `pieces` files of contiguous records."""
    database, queries = work_dir / "database.fasta", work_dir / "queries.fasta"
    require(database, queries)
    (work_dir / "db").mkdir(exist_ok=True)
    run_tool(["makeblastdb", "-in", database, "-dbtype", "nucl", "-parse_seqids", "-out", work_dir / "db" / "db"])
    records = [r.lstrip(b">") for r in _read_records(queries)]
    (work_dir / "pieces").mkdir(exist_ok=True)
    for index, part in enumerate(np.array_split(np.arange(len(records)), int(params["pieces"]))):
        body = b"".join(b">" + records[i].rstrip(b"\n") + b"\n" for i in part)
        _piece(work_dir, index, "query").write_bytes(body)
    progress.advance()


# -- blastn -----------------------------------------------------------------------------


def _search(work_dir: Path, index: int) -> None:
    """One piece against the database; written under a temporary name so a killed run leaves no result."""
    query, hits = _piece(work_dir, index, "query"), _piece(work_dir, index, "hits")
    temporary = hits.with_suffix(".tmp")
    if query.stat().st_size == 0:  # more pieces than queries: nothing to search
        temporary.write_text("")
    else:
        run_tool(
            [
                "blastn",
                "-query",
                query,
                "-db",
                work_dir / "db" / "db",
                "-outfmt",
                "6",
                "-evalue",
                "1e-10",
                "-num_threads",
                "1",
                "-out",
                temporary,
            ]
        )
    os.replace(temporary, hits)


def blastn(work_dir: Path, params: Params, progress: Progress) -> None:
    """Search every piece in parallel (threads: blastn does the work, one thread each)."""
    pieces = range(int(params["pieces"]))
    require(work_dir / "db" / "db.nsq", *(_piece(work_dir, i, "query") for i in pieces))
    parallel_map(partial(_search, work_dir), pieces, progress)


# -- merge ------------------------------------------------------------------------------


def _sort_key(line: str) -> tuple[str, float, str]:
    """By query, best hit (highest bit score) first, then subject for a stable order."""
    fields = line.split("\t")
    return fields[0], -float(fields[11]), fields[1]


def merge(work_dir: Path, params: Params, progress: Progress) -> None:
    """Concatenate the pieces' hits and sort them into hits.tsv."""
    pieces = [_piece(work_dir, i, "hits") for i in range(int(params["pieces"]))]
    require(*pieces)
    lines = [line for path in pieces for line in path.read_text().splitlines() if line.strip()]
    malformed = [line for line in lines if len(line.split("\t")) != HIT_FIELDS]
    if malformed:
        raise StageError(f"malformed blastn output line: {malformed[0]!r}")
    lines.sort(key=_sort_key)
    temporary = work_dir / "hits.tsv.tmp"
    temporary.write_text("".join(line + "\n" for line in lines))
    os.replace(temporary, work_dir / "hits.tsv")
    progress.advance()


STAGES = {"generate": generate, "split": split, "blastn": blastn, "merge": merge}


# -- verify (on the host, after the workflow) ---------------------------------------------


def _parse_hits(path: Path, problems: list[str]) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """(query, subject) -> [(sstart, send)], noting malformed or unsorted lines in `problems`."""
    found: dict[tuple[str, str], list[tuple[int, int]]] = {}
    previous: tuple[str, float, str] | None = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split("\t")
        try:
            if len(fields) != HIT_FIELDS:
                raise ValueError(f"{len(fields)} fields")
            numbers = [float(f) for f in fields[2:]]
            if not 0 <= numbers[0] <= 100 or min(numbers[1:8]) < 0:
                raise ValueError("value out of range")
        except ValueError as exc:
            problems.append(f"hits.tsv line {number} malformed ({exc}): {line!r}")
            continue
        key = _sort_key(line)
        if previous is not None and key < previous:
            problems.append(f"hits.tsv line {number} out of order")
        previous = key
        found.setdefault((fields[0], fields[1]), []).append((int(fields[8]), int(fields[9])))
    return found


def verify(work_dir: Path, params: Params) -> list[str]:
    """Every planted (query, subject) pair is a hit starting near the planted offset, on its strand."""
    hits_path, planted_path = work_dir / "hits.tsv", work_dir / "planted.tsv"
    missing = [f"missing {p}" for p in (hits_path, planted_path) if not p.exists()]
    if missing:
        return missing
    problems: list[str] = []
    found = _parse_hits(hits_path, problems)
    tolerance = max(5, int(params["planted"]) // 5)
    planted_lines = planted_path.read_text().splitlines()[1:]
    if len(planted_lines) != int(params["queries"]):
        problems.append(f"planted.tsv has {len(planted_lines)} queries, expected {int(params['queries'])}")
    for line in planted_lines:
        query, subject, offset, strand = line.split("\t")
        spans = found.get((query, subject), [])
        near = [
            (start, end)
            for start, end in spans
            if (start < end) == (strand == "plus") and abs(min(start, end) - 1 - int(offset)) <= tolerance
        ]
        if not near:
            problems.append(f"planted {query} <- {subject}:{offset} ({strand}) not found (hits: {spans[:3]})")
    return problems
