"""Montage: mosaic a grid of overlapping synthetic sky tiles with the real Montage tools.

The stages follow the ASAx paper's Montage DAG (``workloads.workflows._MONTAGE``)
with a first ``generate`` stage that writes the input tiles, so no data has to be
downloaded: a seeded sky catalogue of Gaussian point sources is rendered into a
grid of slightly overlapping TAN tiles, each with noise and its own background
(offset plus slope), which is exactly what Montage's background matching removes.

Why the tables are built from sorted file lists (``mImgtbl -t``): ``mOverlaps``
numbers images by their ``cntr`` in the raw table, and ``mBgModel``/``mBackground``
look those numbers up in the projected table, so both tables must list the same
files in the same order, which a directory scan does not promise.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np

from .common import Params, Progress, StageError, parallel_map, require, run_tool

SIZES: dict[str, Params] = {
    # grid: tiles per side; tile_px: pixels per tile side; overlap_px: pixels shared by neighbours;
    # sources: catalogue size; add_grid: sub-mosaics per side in the co-add; seed: the sky's seed.
    "test": {"grid": 3, "tile_px": 128, "overlap_px": 16, "sources": 150, "add_grid": 2, "seed": 1},
    "small": {"grid": 10, "tile_px": 640, "overlap_px": 48, "sources": 5000, "add_grid": 4, "seed": 1},
    "study": {"grid": 18, "tile_px": 1280, "overlap_px": 96, "sources": 40000, "add_grid": 4, "seed": 1},
}
DEFAULTS: Params = dict(SIZES["test"])

PIXEL_DEG = 1.0 / 3600.0  # one arcsecond pixels
FIELD_RA, FIELD_DEC = 150.0, 2.0  # field centre (deg)
SKY_LEVEL = 100.0
NOISE_SIGMA = 1.0
PSF_SIGMA_PX = 1.5
BACKGROUND_OFFSET = 20.0  # per-tile offsets are drawn from +-this
BACKGROUND_SLOPE = 0.01  # per-pixel slopes are drawn from +-this
FIT_COLUMNS = (
    "plus", "minus", "a", "b", "c", "crpix1", "crpix2", "xmin", "xmax", "ymin", "ymax",
    "xcenter", "ycenter", "npixel", "rms", "boxx", "boxy", "boxwidth", "boxheight", "boxang",
)  # fmt: skip


# ---------------------------------------------------------------- geometry


def _grid(params: Params) -> int:
    return int(params["grid"])


def tile_names(params: Params) -> list[str]:
    """Tile file names in row-major order: the order of every images table."""
    n = _grid(params)
    return [f"tile_{row:03d}_{col:03d}.fits" for row in range(n) for col in range(n)]


def overlap_pairs(params: Params) -> list[tuple[int, int]]:
    """Index pairs of tiles whose footprints share area: side and diagonal neighbours.

    Tiles are equal squares on a regular grid with a positive overlap, so two tiles
    overlap exactly when their rows and columns each differ by at most one; this is
    what mOverlaps finds (checked by the overlaps stage and the tests).
    """
    n = _grid(params)
    pairs = []
    for i in range(n * n):
        for j in range(i + 1, n * n):
            if abs(i // n - j // n) <= 1 and abs(i % n - j % n) <= 1:
                pairs.append((i, j))
    return pairs


def _add_grid(params: Params) -> int:
    return max(1, int(params["add_grid"]))


def tasks(params: Params) -> dict[str, int]:
    """Progress units per stage, known from the parameters alone (the host plans with them)."""
    tiles = _grid(params) ** 2
    pairs = len(overlap_pairs(params))
    return {
        "generate": 1,
        "imgtbl": 1,
        "project": tiles,
        "overlaps": 1,
        "diff": pairs,
        "fit": pairs,
        "concat": 1,
        "bgmodel": 1,
        "background": tiles,
        "add": _add_grid(params) ** 2 + 1,
    }


def tan_project(ra: np.ndarray, dec: np.ndarray, ra0: float, dec0: float) -> tuple[np.ndarray, np.ndarray]:
    """Gnomonic (TAN) standard coordinates (xi, eta) in degrees of sky points around (ra0, dec0)."""
    a, d = np.radians(ra), np.radians(dec)
    a0, d0 = math.radians(ra0), math.radians(dec0)
    cos_c = math.sin(d0) * np.sin(d) + math.cos(d0) * np.cos(d) * np.cos(a - a0)
    xi = np.cos(d) * np.sin(a - a0) / cos_c
    eta = (math.cos(d0) * np.sin(d) - math.sin(d0) * np.cos(d) * np.cos(a - a0)) / cos_c
    return np.degrees(xi), np.degrees(eta)


def tan_deproject(xi: np.ndarray, eta: np.ndarray, ra0: float, dec0: float) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of `tan_project`: sky (ra, dec) in degrees of standard coordinates in degrees."""
    x, y = np.radians(xi), np.radians(eta)
    a0, d0 = math.radians(ra0), math.radians(dec0)
    denominator = math.cos(d0) - y * math.sin(d0)
    ra = a0 + np.arctan2(x, denominator)
    dec = np.arctan2(math.sin(d0) + y * math.cos(d0), np.hypot(x, denominator))
    return np.degrees(ra) % 360.0, np.degrees(dec)


def world_to_pixel(header: dict[str, float | str], ra: np.ndarray, dec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """1-based FITS pixel positions of sky points in a TAN image without rotation."""
    xi, eta = tan_project(ra, dec, float(header["CRVAL1"]), float(header["CRVAL2"]))
    x = float(header["CRPIX1"]) + xi / float(header["CDELT1"])
    y = float(header["CRPIX2"]) + eta / float(header["CDELT2"])
    return x, y


# ---------------------------------------------------------------- FITS


def _card(key: str, value: float | int | str) -> str:
    """One 80-character header card (strings quoted, numbers right-justified to column 30)."""
    if isinstance(value, str):
        text = f"'{value:<8}'"
        card = f"{key:<8}= {text:<20}"
    elif isinstance(value, bool):
        card = f"{key:<8}= {'T' if value else 'F':>20}"
    elif isinstance(value, int):
        card = f"{key:<8}= {value:>20d}"
    else:
        card = f"{key:<8}= {value:>20.12G}"
    return f"{card:<80}"[:80]


def write_fits(path: Path, data: np.ndarray, header: dict[str, float | int | str]) -> None:
    """Write a 2-D float32 image as a minimal primary-HDU FITS file (big-endian, 2880-byte blocks)."""
    rows, cols = data.shape
    cards = [
        _card("SIMPLE", True),
        _card("BITPIX", -32),
        _card("NAXIS", 2),
        _card("NAXIS1", cols),
        _card("NAXIS2", rows),
    ]
    cards += [_card(key, value) for key, value in header.items()]
    cards.append(f"{'END':<80}")
    text = "".join(cards)
    text += " " * (-len(text) % 2880)
    payload = np.ascontiguousarray(data, dtype=">f4").tobytes()
    payload += b"\0" * (-len(payload) % 2880)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(text.encode("ascii") + payload)
    temporary.replace(path)


def _parse_value(raw: str) -> float | int | str:
    raw = raw.split("/", 1)[0].strip() if not raw.strip().startswith("'") else raw.strip()
    if raw.startswith("'"):
        return raw[1:].split("'", 1)[0].rstrip()
    if raw in ("T", "F"):
        return raw == "T"
    try:
        return int(raw)
    except ValueError:
        try:
            return float(raw.replace("D", "E"))
        except ValueError:
            return raw


def read_header_cards(text: str) -> dict[str, float | int | str]:
    """Keyword -> value of FITS-style cards: 80-column blocks or a Montage .hdr text file."""
    lines = [text[i : i + 80] for i in range(0, len(text), 80)] if "\n" not in text else text.splitlines()
    header: dict[str, float | int | str] = {}
    for line in lines:
        key = line[:8].strip()
        if key == "END":
            break
        if line[8:10] == "= " or (len(line) > 8 and "=" in line[:10]):
            header[key] = _parse_value(line.split("=", 1)[1])
    return header


def read_fits(path: Path) -> tuple[np.ndarray, dict[str, float | int | str]]:
    """Primary image and header of a FITS file (any BITPIX, BSCALE/BZERO applied) as float64."""
    blob = path.read_bytes()
    offset = 0
    while True:
        block = blob[offset : offset + 2880]
        if len(block) < 2880:
            raise StageError(f"{path}: truncated FITS header")
        offset += 2880
        if any(block[i : i + 80].startswith(b"END ") or block[i : i + 80] == b"END" for i in range(0, 2880, 80)):
            break
    header = read_header_cards(blob[:offset].decode("ascii", "replace"))
    dtypes = {8: ">u1", 16: ">i2", 32: ">i4", 64: ">i8", -32: ">f4", -64: ">f8"}
    cols, rows = int(header["NAXIS1"]), int(header["NAXIS2"])
    dtype = np.dtype(dtypes[int(header["BITPIX"])])
    count = cols * rows
    if len(blob) < offset + count * dtype.itemsize:
        raise StageError(f"{path}: truncated FITS data")
    data = np.frombuffer(blob, dtype=dtype, count=count, offset=offset).astype(np.float64).reshape(rows, cols)
    return data * float(header.get("BSCALE", 1.0)) + float(header.get("BZERO", 0.0)), header


# ---------------------------------------------------------------- the synthetic sky


def _tile_header(params: Params, index: int) -> dict[str, float | int | str]:
    """WCS of tile `index`: its own TAN projection centred on a grid point of the field."""
    n, side = _grid(params), int(params["tile_px"])
    step = (side - int(params["overlap_px"])) * PIXEL_DEG
    row, col = divmod(index, n)
    xi = np.array([-(col - (n - 1) / 2) * step])  # RA grows to the left (CDELT1 < 0)
    eta = np.array([(row - (n - 1) / 2) * step])
    ra, dec = tan_deproject(xi, eta, FIELD_RA, FIELD_DEC)
    return {
        "CTYPE1": "RA---TAN",
        "CTYPE2": "DEC--TAN",
        "CRVAL1": float(ra[0]),
        "CRVAL2": float(dec[0]),
        "CRPIX1": (side + 1) / 2,
        "CRPIX2": (side + 1) / 2,
        "CDELT1": -PIXEL_DEG,
        "CDELT2": PIXEL_DEG,
        "EQUINOX": 2000.0,
        "BUNIT": "DN",
    }


def catalogue(params: Params) -> np.ndarray:
    """The seeded sky: rows of (ra, dec, flux), spread over the whole field plus a margin."""
    rng = np.random.default_rng(int(params["seed"]))
    n, side = _grid(params), int(params["tile_px"])
    half = ((n - 1) * (side - int(params["overlap_px"])) + side) / 2 * PIXEL_DEG
    count = int(params["sources"])
    xi = rng.uniform(-half, half, count)
    eta = rng.uniform(-half, half, count)
    ra, dec = tan_deproject(xi, eta, FIELD_RA, FIELD_DEC)
    flux = 200.0 * (1.0 - rng.random(count)) ** -1.0  # Pareto tail: few bright, many faint sources
    return np.column_stack([ra, dec, np.minimum(flux, 2e5)])


def render_tile(params: Params, index: int, sky: np.ndarray) -> tuple[np.ndarray, dict[str, float | int | str]]:
    """Pixels of one tile: sources through a Gaussian PSF, sky, per-tile background plane, noise."""
    header = _tile_header(params, index)
    side = int(params["tile_px"])
    rng = np.random.default_rng([int(params["seed"]), index + 1])
    image = rng.normal(SKY_LEVEL, NOISE_SIGMA, (side, side))
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float64)
    offset = rng.uniform(-BACKGROUND_OFFSET, BACKGROUND_OFFSET)
    slope_x, slope_y = rng.uniform(-BACKGROUND_SLOPE, BACKGROUND_SLOPE, 2)
    image += offset + slope_x * (xx - side / 2) + slope_y * (yy - side / 2)
    x, y = world_to_pixel(header, sky[:, 0], sky[:, 1])
    radius = math.ceil(5 * PSF_SIGMA_PX)
    norm = 1.0 / (2 * math.pi * PSF_SIGMA_PX**2)
    near = (x > -radius) & (x < side + radius) & (y > -radius) & (y < side + radius)
    for px, py, flux in zip(x[near] - 1, y[near] - 1, sky[near, 2], strict=True):  # to 0-based pixel centres
        x0, x1 = max(0, int(px) - radius), min(side, int(px) + radius + 2)
        y0, y1 = max(0, int(py) - radius), min(side, int(py) + radius + 2)
        if x0 >= x1 or y0 >= y1:
            continue
        dx2 = (xx[y0:y1, x0:x1] - px) ** 2 + (yy[y0:y1, x0:x1] - py) ** 2
        image[y0:y1, x0:x1] += flux * norm * np.exp(-dx2 / (2 * PSF_SIGMA_PX**2))
    return image, header


# ---------------------------------------------------------------- helpers for the stages


def _write_list(path: Path, names: list[str]) -> None:
    """An IPAC table with one fname column: the input of ``mImgtbl -t``, fixing the row order."""
    width = max(len("fname"), *(len(name) for name in names))
    lines = [f"|{'fname':<{width}}|"] + [f" {name:<{width}} " for name in names]
    path.write_text("\n".join(lines) + "\n")


def read_table(path: Path) -> list[dict[str, str]]:
    """Rows of an IPAC ASCII table (the Montage .tbl format), split on the header's bars."""
    header: str | None = None
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("\\") or not line.strip():
            continue
        if line.startswith("|"):
            if header is None:
                header = line
            continue
        if header is None:
            continue
        bars = [i for i, char in enumerate(header) if char == "|"]
        spans = list(itertools.pairwise(bars))
        rows.append({header[a + 1 : b].strip(): line[a + 1 : b].strip() for a, b in spans})
    return rows


def _struct(output: str) -> dict[str, str]:
    """Key/value pairs of Montage's last ``[struct stat=..., key=value, ...]`` line."""
    lines = [line for line in output.splitlines() if line.startswith("[struct")]
    if not lines:
        raise StageError(f"no [struct ...] reply in: {output[-200:]!r}")
    return {key: value.strip('"') for key, value in re.findall(r'(\w+)=("[^"]*"|[^,\]]+)', lines[-1])}


def _fresh_dir(path: Path) -> Path:
    """An empty output directory: reruns must not mix old and new files."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _require_tiles(directory: Path, params: Params) -> None:
    require(directory, *(directory / name for name in tile_names(params)))


# ---------------------------------------------------------------- stages


def generate(work_dir: Path, params: Params, progress: Progress) -> None:
    """Write the raw tiles and the catalogue (verify checks source positions against it)."""
    raw = _fresh_dir(work_dir / "raw")
    sky = catalogue(params)
    np.savetxt(work_dir / "catalogue.txt", sky, fmt="%.8f %.8f %.3f", header="ra dec flux")
    for index, name in enumerate(tile_names(params)):
        image, header = render_tile(params, index, sky)
        write_fits(raw / name, image.astype(np.float32), header)
    progress.advance()


def imgtbl(work_dir: Path, params: Params, progress: Progress) -> None:
    """Table the raw tiles in a fixed order and build the mosaic's template header."""
    raw = work_dir / "raw"
    _require_tiles(raw, params)
    _write_list(work_dir / "tiles.lst", tile_names(params))
    run_tool(["mImgtbl", "-t", work_dir / "tiles.lst", raw, work_dir / "images.tbl"])
    run_tool(["mMakeHdr", work_dir / "images.tbl", work_dir / "template.hdr"])
    progress.advance()


def project(work_dir: Path, params: Params, progress: Progress) -> None:
    """Reproject every tile onto the template (one mProjectPP per tile), then table them."""
    raw, template = work_dir / "raw", work_dir / "template.hdr"
    _require_tiles(raw, params)
    require(template, work_dir / "tiles.lst")
    proj = _fresh_dir(work_dir / "proj")
    parallel_map(lambda name: run_tool(["mProjectPP", raw / name, proj / name, template]), tile_names(params), progress)
    run_tool(["mImgtbl", "-t", work_dir / "tiles.lst", proj, work_dir / "pimages.tbl"])


def overlaps(work_dir: Path, params: Params, progress: Progress) -> None:
    """Find overlapping tile pairs; their number must be the one `tasks` promised."""
    require(work_dir / "images.tbl")
    run_tool(["mOverlaps", work_dir / "images.tbl", work_dir / "diffs.tbl"])
    found = len(read_table(work_dir / "diffs.tbl"))
    expected = len(overlap_pairs(params))
    if found != expected:
        raise StageError(f"mOverlaps found {found} overlapping pairs, the grid geometry says {expected}")
    progress.advance()


def _pairs(work_dir: Path) -> list[dict[str, str]]:
    require(work_dir / "diffs.tbl")
    return read_table(work_dir / "diffs.tbl")


def diff(work_dir: Path, params: Params, progress: Progress) -> None:
    """Difference image of every overlapping pair of projected tiles."""
    pairs = _pairs(work_dir)
    proj, template = work_dir / "proj", work_dir / "template.hdr"
    require(template, *(proj / pair[key] for pair in pairs for key in ("plus", "minus")))
    out = _fresh_dir(work_dir / "diff")

    def one(pair: dict[str, str]) -> str:
        return run_tool(["mDiff", proj / pair["plus"], proj / pair["minus"], out / pair["diff"], template])

    parallel_map(one, pairs, progress)


def fit(work_dir: Path, params: Params, progress: Progress) -> None:
    """Fit a plane to every difference image; keep each fit as JSON in fit/<diff>.json."""
    pairs = _pairs(work_dir)
    diffs = work_dir / "diff"
    require(*(diffs / pair["diff"] for pair in pairs))
    out = _fresh_dir(work_dir / "fit")

    def one(pair: dict[str, str]) -> None:
        reply = _struct(run_tool(["mFitplane", diffs / pair["diff"]]))
        reply.update(plus=pair["cntr1"], minus=pair["cntr2"])
        (out / f"{pair['diff']}.json").write_text(json.dumps(reply) + "\n")

    parallel_map(one, pairs, progress)


def concat(work_dir: Path, params: Params, progress: Progress) -> None:
    """Gather the plane fits into fits.tbl, in mFitExec/mConcatFit's column layout."""
    pairs = _pairs(work_dir)
    paths = [work_dir / "fit" / f"{pair['diff']}.json" for pair in pairs]
    require(*paths)
    width = 16
    lines = ["|" + "|".join(name.rjust(width) for name in FIT_COLUMNS) + "|"]
    for path in paths:
        reply = json.loads(path.read_text())
        if reply.get("stat") != "OK":  # mFitExec skips fits that warned (e.g. too few pixels)
            continue
        lines.append(" " + " ".join(str(reply[name]).rjust(width) for name in FIT_COLUMNS) + " ")
    (work_dir / "fits.tbl").write_text("\n".join(lines) + "\n")
    progress.advance()


def bgmodel(work_dir: Path, params: Params, progress: Progress) -> None:
    """Solve for the background plane of every tile that best matches its neighbours."""
    require(work_dir / "pimages.tbl", work_dir / "fits.tbl")
    run_tool(["mBgModel", work_dir / "pimages.tbl", work_dir / "fits.tbl", work_dir / "corrections.tbl"])
    progress.advance()


def background(work_dir: Path, params: Params, progress: Progress) -> None:
    """Subtract each projected tile's background correction into corr/."""
    proj, table, corrections = work_dir / "proj", work_dir / "pimages.tbl", work_dir / "corrections.tbl"
    _require_tiles(proj, params)
    require(table, corrections)
    out = _fresh_dir(work_dir / "corr")

    def one(name: str) -> str:
        # Table mode looks the image up by the exact name in the table, so run where that name resolves.
        return run_tool(
            ["mBackground", "-t", name, out.resolve() / name, table.resolve(), corrections.resolve()], cwd=proj
        )

    parallel_map(one, tile_names(params), progress)


def _sub_header(work_dir: Path, params: Params, index: int) -> Path:
    """Header of sub-mosaic `index` (mTileHdr cuts template.hdr into an add_grid^2 grid)."""
    n = _add_grid(params)
    row, col = divmod(index, n)
    path = work_dir / "add" / f"sub_{row:02d}_{col:02d}.hdr"
    run_tool(["mTileHdr", work_dir / "template.hdr", path, n, n, col, row])
    return path


def add(work_dir: Path, params: Params, progress: Progress) -> None:
    """Co-add tile-parallel like mAddMPI: sub-mosaics in parallel, then join them; then a PNG preview."""
    corr, template = work_dir / "corr", work_dir / "template.hdr"
    _require_tiles(corr, params)
    require(template, work_dir / "tiles.lst")
    out = _fresh_dir(work_dir / "add")
    pieces = _fresh_dir(out / "pieces")
    run_tool(["mImgtbl", "-t", work_dir / "tiles.lst", corr, out / "cimages.tbl"])
    count = _add_grid(params) ** 2

    def one(index: int) -> str:
        header = _sub_header(work_dir, params, index)
        piece = pieces / f"{header.stem}.fits"
        return run_tool(["mAdd", "-e", "-p", corr, out / "cimages.tbl", header, piece])

    parallel_map(one, range(count), progress)
    run_tool(["mImgtbl", pieces, out / "pieces.tbl"])
    run_tool(["mAdd", "-e", "-p", pieces, out / "pieces.tbl", template, work_dir / "mosaic.fits"])
    shape = read_header_cards(template.read_text())
    factor = max(1, math.ceil(max(int(shape["NAXIS1"]), int(shape["NAXIS2"])) / 1024))  # a preview about 1k wide
    run_tool(["mShrink", work_dir / "mosaic.fits", work_dir / "mosaic_small.fits", factor])
    run_tool(
        ["mViewer", "-ct", "1", "-gray", work_dir / "mosaic_small.fits", "-1s", "max", "gaussian-log",
         "-out", work_dir / "mosaic.png"]
    )  # fmt: skip
    progress.advance()


STAGES = {
    "generate": generate,
    "imgtbl": imgtbl,
    "project": project,
    "overlaps": overlaps,
    "diff": diff,
    "fit": fit,
    "concat": concat,
    "bgmodel": bgmodel,
    "background": background,
    "add": add,
}


# ---------------------------------------------------------------- verification


def _check_sources(mosaic: np.ndarray, header: dict[str, float | int | str], sky: np.ndarray) -> list[str]:
    """The brightest sources must peak within 1.5 pixels of where the WCS puts them."""
    rows, cols = mosaic.shape
    x, y = world_to_pixel(header, sky[:, 0], sky[:, 1])
    x, y = x - 1, y - 1
    inside = (x > 5) & (x < cols - 6) & (y > 5) & (y < rows - 6)
    order = [i for i in np.argsort(-sky[:, 2]) if inside[i]][:20]
    if not order:
        return ["no catalogue source falls inside the mosaic"]
    misses = []
    for i in order:
        cx, cy = round(float(x[i])), round(float(y[i]))
        window = mosaic[cy - 3 : cy + 4, cx - 3 : cx + 4]
        if not np.isfinite(window).any():
            misses.append(i)
            continue
        py, px = np.unravel_index(np.nanargmax(window), window.shape)
        if math.hypot(cx - 3 + px - x[i], cy - 3 + py - y[i]) > 1.5:
            misses.append(i)
    if len(misses) > len(order) // 5:
        return [f"{len(misses)} of the {len(order)} brightest sources have no peak at their catalogue position"]
    return []


def _check_backgrounds(work_dir: Path) -> list[str]:
    """Corrected neighbours must agree in their overlaps far better than the raw offsets did."""
    problems = []
    offsets = []
    pairs = read_table(work_dir / "diffs.tbl")
    for pair in pairs[:: max(1, len(pairs) // 40)]:  # an even sample: reading every pair is slow at study size
        a, ha = read_fits(work_dir / "corr" / pair["plus"])
        b, hb = read_fits(work_dir / "corr" / pair["minus"])
        # Both images sit on the template's pixel grid; CRPIX tells their origin on it.
        ox_a, oy_a = -float(ha["CRPIX1"]), -float(ha["CRPIX2"])
        ox_b, oy_b = -float(hb["CRPIX1"]), -float(hb["CRPIX2"])
        dx, dy = round(ox_b - ox_a), round(oy_b - oy_a)
        x0, x1 = max(0, dx), min(a.shape[1], dx + b.shape[1])
        y0, y1 = max(0, dy), min(a.shape[0], dy + b.shape[0])
        if x1 - x0 < 4 or y1 - y0 < 4:
            continue
        delta = a[y0:y1, x0:x1] - b[y0 - dy : y1 - dy, x0 - dx : x1 - dx]
        delta = delta[np.isfinite(delta)]
        if delta.size > 50:
            offsets.append(float(np.median(delta)))
    if not offsets:
        return ["no corrected overlap could be compared"]
    worst = max(abs(o) for o in offsets)
    if worst > BACKGROUND_OFFSET / 4:
        problems.append(f"background-corrected overlaps disagree by up to {worst:.2f} (limit {BACKGROUND_OFFSET / 4})")
    return problems


def verify(work_dir: Path, params: Params) -> list[str]:
    """Problems found in a finished workflow's outputs (an empty list means the mosaic is right)."""
    problems: list[str] = []
    mosaic_path, template = work_dir / "mosaic.fits", work_dir / "template.hdr"
    for path in (mosaic_path, template, work_dir / "catalogue.txt", work_dir / "mosaic.png"):
        if not path.exists():
            problems.append(f"missing output {path}")
    if problems:
        return problems
    if not (work_dir / "mosaic.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n"):
        problems.append("mosaic.png is not a PNG file")
    expected = read_header_cards(template.read_text())
    try:
        mosaic, header = read_fits(mosaic_path)
    except (StageError, KeyError, ValueError) as exc:
        return [*problems, f"mosaic.fits unreadable: {exc}"]
    size = (int(header["NAXIS1"]), int(header["NAXIS2"]))
    if size != (int(expected["NAXIS1"]), int(expected["NAXIS2"])):
        problems.append(f"mosaic is {size[0]}x{size[1]}, template.hdr says {expected['NAXIS1']}x{expected['NAXIS2']}")
    sample = mosaic[::2, ::2]  # statistics of every fourth pixel: cheap on study-sized mosaics
    finite = np.isfinite(sample)
    if finite.mean() < 0.9:
        problems.append(f"only {finite.mean():.0%} of the mosaic's pixels are finite")
    if not finite.any() or float(np.std(sample[finite])) <= 0:
        return [*problems, "mosaic pixels are constant"]
    sky = np.loadtxt(work_dir / "catalogue.txt", ndmin=2)
    problems += _check_sources(mosaic, header, sky)
    if (work_dir / "diffs.tbl").exists() and (work_dir / "corr").is_dir():
        problems += _check_backgrounds(work_dir)
    else:
        problems.append("diffs.tbl or corr/ missing: cannot check background matching")
    return problems
