"""Synthetic: fill memory with floats on one core, then transform them in parallel chunks.

Why this shape: the paper's synthetic workflow is a memory-heavy sequential fill
followed by a CPU-heavy parallel add-and-multiply. Each compute task applies
``x <- (x + a) * b`` `repeat` times to its chunk, a cache-sized block at a time so
the work is arithmetic rather than memory traffic, and reports the chunk's sum and
sum of squares. The transform is affine, y = B x + C with B = b**r and
C = a (b + b**2 + ... + b**r), so `verify` recomputes the checksum from the seed in
closed form, without redoing the arithmetic.

Files in the working directory:
    seed.json                         generate (the seed and size fill works from)
    data.npy                          fill (float64, uniform [0, 1) from the seed)
    chunks/chunk_NNNN.json            compute (one per chunk)
    checksum.json                     compute's last step (sum of the chunk checksums)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .common import Params, Progress, StageError, parallel_map, require

SIZES: dict[str, dict[str, Any]] = {
    "test": {"floats": 2_000_000, "chunks": 8, "repeat": 20, "seed": 1},
    "small": {"floats": 50_000_000, "chunks": 50, "repeat": 2000, "seed": 1},
    "study": {"floats": 400_000_000, "chunks": 100, "repeat": 3000, "seed": 1},
}
DEFAULTS: dict[str, Any] = SIZES["test"]

A, B = 0.5, 0.9999  # b < 1 keeps values bounded; b**repeat stays far from 0, so the input still matters
BLOCK = 32_768  # floats per inner block: 256 KiB, in cache while the `repeat` passes run over it
FILL_BLOCK = 1 << 24  # floats generated per call; the stream is the same however it is cut


def tasks(params: Params) -> dict[str, int]:
    """One task per chunk for compute."""
    return {"generate": 1, "fill": 1, "compute": int(params["chunks"])}


def _write_json(path: Path, data: object) -> None:
    """Atomically, so a killed stage never leaves half a result."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def uniform_blocks(seed: int, count: int) -> Iterator[np.ndarray]:
    """The seeded values, in blocks (the same stream fill writes and verify regenerates)."""
    rng = np.random.default_rng(seed)
    for first in range(0, count, FILL_BLOCK):
        yield rng.random(min(FILL_BLOCK, count - first))


def generate(work_dir: Path, params: Params, progress: Progress) -> None:
    """The input is only a seed and a size: fill makes the data in memory, which is its point."""
    if int(params["floats"]) < int(params["chunks"]) or int(params["chunks"]) < 1:
        raise StageError("need at least one chunk and no more chunks than floats")
    _write_json(work_dir / "seed.json", {"seed": int(params["seed"]), "floats": int(params["floats"])})
    progress.advance()


def fill(work_dir: Path, params: Params, progress: Progress) -> None:
    """All the floats in memory at once (the memory-heavy part), then saved as data.npy."""
    require(work_dir / "seed.json")
    spec = json.loads((work_dir / "seed.json").read_text())
    count = int(spec["floats"])
    data = np.empty(count, dtype=np.float64)
    position = 0
    for block in uniform_blocks(int(spec["seed"]), count):
        data[position : position + block.size] = block
        position += block.size
    temporary = work_dir / "data.tmp.npy"
    np.save(temporary, data)
    os.replace(temporary, work_dir / "data.npy")
    progress.advance()


def chunk_bounds(count: int, chunks: int, index: int) -> tuple[int, int]:
    """Rows [first, end) of chunk `index`: near-equal contiguous pieces."""
    return count * index // chunks, count * (index + 1) // chunks


def _compute_chunk(work_dir: Path, params: Params, index: int) -> None:
    """Transform one chunk block by block and write its checksum."""
    data = np.load(work_dir / "data.npy", mmap_mode="r")
    first, end = chunk_bounds(data.size, int(params["chunks"]), index)
    total = squares = 0.0
    work = np.empty(BLOCK, dtype=np.float64)
    for start in range(first, end, BLOCK):
        block = work[: min(BLOCK, end - start)]
        block[:] = data[start : start + block.size]
        for _ in range(int(params["repeat"])):
            np.add(block, A, out=block)
            np.multiply(block, B, out=block)
        total += float(block.sum())
        squares += float(np.dot(block, block))
    _write_json(_chunk_path(work_dir, index), {"first": first, "end": end, "sum": total, "sumsq": squares})


def _chunk_path(work_dir: Path, index: int) -> Path:
    return work_dir / "chunks" / f"chunk_{index:04d}.json"


def compute(work_dir: Path, params: Params, progress: Progress) -> None:
    """The chunks in parallel processes, then their checksums summed into checksum.json."""
    require(work_dir / "data.npy")
    chunks = range(int(params["chunks"]))
    (work_dir / "chunks").mkdir(exist_ok=True)
    parallel_map(partial(_compute_chunk, work_dir, params), chunks, progress, processes=True)
    parts = [json.loads(_chunk_path(work_dir, i).read_text()) for i in chunks]
    checksum = {
        "count": sum(p["end"] - p["first"] for p in parts),
        "sum": float(np.sum([p["sum"] for p in parts])),
        "sumsq": float(np.sum([p["sumsq"] for p in parts])),
    }
    _write_json(work_dir / "checksum.json", checksum)


STAGES = {"generate": generate, "fill": fill, "compute": compute}


# -- verify (on the host, after the workflow) ---------------------------------------------


def expected_checksum(params: Params) -> dict[str, Any]:
    """The checksum in closed form from the seed: y = scale x + shift, summed (and squared) exactly."""
    repeat = int(params["repeat"])
    scale = B**repeat
    shift = A * sum(B**k for k in range(1, repeat + 1))
    count = int(params["floats"])
    total = squares = 0.0
    for block in uniform_blocks(int(params["seed"]), count):
        total += float(block.sum())
        squares += float(np.dot(block, block))
    return {
        "count": count,
        "sum": scale * total + count * shift,
        "sumsq": scale * scale * squares + 2 * scale * shift * total + count * shift * shift,
    }


def verify(work_dir: Path, params: Params) -> list[str]:
    """checksum.json agrees with the closed form to rtol 1e-9, and with the chunk files."""
    path = work_dir / "checksum.json"
    if not path.exists():
        return [f"missing {path}"]
    got = json.loads(path.read_text())
    expected = expected_checksum(params)
    problems = [
        f"checksum {key}: {got.get(key)!r}, expected {expected[key]!r}"
        for key in ("sum", "sumsq")
        if not isinstance(got.get(key), float) or not np.isclose(got[key], expected[key], rtol=1e-9, atol=0.0)
    ]
    if got.get("count") != expected["count"]:
        problems.append(f"checksum count {got.get('count')}, expected {expected['count']}")
    return problems
