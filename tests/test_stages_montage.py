"""The Montage stages: FITS and WCS helpers everywhere, the whole workflow where Montage is installed.

Where the host lacks Montage's binaries (CI), the stages run in the workflow image
(`tests.stage_runner`); the pure-NumPy helpers need neither.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.stage_runner import run_stage
from workloads.stages import montage
from workloads.stages.common import StageError

# ---------------------------------------------------------------- without Montage


def test_fits_round_trip(tmp_path: Path) -> None:
    data = np.arange(35, dtype=np.float32).reshape(5, 7) - 3.5
    header = {"CTYPE1": "RA---TAN", "CRVAL1": 150.25, "CRPIX1": 3.5, "EQUINOX": 2000.0, "NAME": "a b"}
    path = tmp_path / "x.fits"
    montage.write_fits(path, data, header)
    blob = path.read_bytes()
    assert len(blob) % 2880 == 0
    assert blob.startswith(b"SIMPLE  =                    T")
    back, read = montage.read_fits(path)
    np.testing.assert_array_equal(back, data)
    assert read["NAXIS1"] == 7 and read["NAXIS2"] == 5 and read["BITPIX"] == -32
    assert read["CTYPE1"] == "RA---TAN" and read["NAME"] == "a b"
    assert read["CRVAL1"] == pytest.approx(150.25) and read["EQUINOX"] == pytest.approx(2000.0)


def test_fits_reader_rejects_truncation(tmp_path: Path) -> None:
    path = tmp_path / "x.fits"
    montage.write_fits(path, np.ones((100, 100), np.float32), {})
    path.write_bytes(path.read_bytes()[:4000])
    with pytest.raises(StageError, match="truncated"):
        montage.read_fits(path)


def test_montage_hdr_text_is_read() -> None:
    text = "SIMPLE  = T\nNAXIS1  = 354\nCTYPE1  = 'RA---TAN'\nCDELT1  =   -0.000277778\nEND\n"
    header = montage.read_header_cards(text)
    assert header == {"SIMPLE": True, "NAXIS1": 354, "CTYPE1": "RA---TAN", "CDELT1": -0.000277778}


def test_tan_round_trip() -> None:
    xi = np.array([-0.1, 0.0, 0.05, 0.2])
    eta = np.array([0.1, 0.0, -0.07, 0.2])
    ra, dec = montage.tan_deproject(xi, eta, 150.0, 2.0)
    back_xi, back_eta = montage.tan_project(ra, dec, 150.0, 2.0)
    np.testing.assert_allclose(back_xi, xi, atol=1e-10)
    np.testing.assert_allclose(back_eta, eta, atol=1e-10)


@pytest.mark.parametrize("size", sorted(montage.SIZES))
def test_task_counts_follow_the_grid(size: str) -> None:
    params = montage.SIZES[size]
    n = int(params["grid"])
    counts = montage.tasks(params)
    assert list(counts) == list(montage.STAGES)
    assert counts["project"] == counts["background"] == n * n
    assert counts["diff"] == counts["fit"] == 2 * n * (n - 1) + 2 * (n - 1) ** 2  # sides + diagonals
    assert counts["add"] == int(params["add_grid"]) ** 2 + 1
    assert montage.SIZES["test"] == montage.DEFAULTS


def test_tiles_are_deterministic_and_share_sources() -> None:
    params = montage.DEFAULTS
    sky = montage.catalogue(params)
    first, header = montage.render_tile(params, 0, sky)
    again, _ = montage.render_tile(params, 0, sky)
    np.testing.assert_array_equal(first, again)
    neighbour, other = montage.render_tile(params, 1, sky)
    # A bright source in the overlap of tiles 0 and 1 peaks at its predicted pixel in both.
    x0, y0 = montage.world_to_pixel(header, sky[:, 0], sky[:, 1])
    x1, y1 = montage.world_to_pixel(other, sky[:, 0], sky[:, 1])
    side = int(params["tile_px"])
    both = [i for i in np.argsort(-sky[:, 2]) if 4 < x0[i] < side - 4 and 4 < x1[i] < side - 4 and 4 < y0[i] < side - 4]
    assert both, "the test sky should put a source in the first overlap"
    i = both[0]
    for image, x, y in ((first, x0[i], y0[i]), (neighbour, x1[i], y1[i])):
        col, row = round(float(x)) - 1, round(float(y)) - 1  # FITS pixels are 1-based
        window = image[row - 3 : row + 4, col - 3 : col + 4]
        assert np.unravel_index(np.argmax(window), window.shape) == (3, 3)


# ---------------------------------------------------------------- with Montage


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole workflow at the test size, each stage checked to finish with total/total progress."""
    work_dir = tmp_path_factory.mktemp("montage")
    progress = work_dir.parent / "montage.progress"
    counts = montage.tasks(montage.DEFAULTS)
    for stage in montage.STAGES:
        done = run_stage("montage", stage, work_dir, progress)
        assert done.returncode == 0, f"{stage}: {done.stderr}"
        assert progress.read_text().strip() == f"{counts[stage]}/{counts[stage]}", stage
    return work_dir


def test_workflow_produces_a_verified_mosaic(finished: Path) -> None:
    assert montage.verify(finished, montage.DEFAULTS) == []
    assert len(montage.read_table(finished / "diffs.tbl")) == len(montage.overlap_pairs(montage.DEFAULTS))
    assert len(list((finished / "fit").glob("*.json"))) == len(montage.overlap_pairs(montage.DEFAULTS))


def test_verify_catches_a_zeroed_mosaic(finished: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(finished, broken)
    data, header = montage.read_fits(broken / "mosaic.fits")
    keep = {k: v for k, v in header.items() if k not in ("SIMPLE", "BITPIX", "NAXIS", "NAXIS1", "NAXIS2")}
    montage.write_fits(broken / "mosaic.fits", np.zeros_like(data, dtype=np.float32), keep)
    problems = montage.verify(broken, montage.DEFAULTS)
    assert any("constant" in problem for problem in problems)


def test_verify_catches_uncorrected_backgrounds_and_a_bad_png(finished: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(finished, broken)
    shutil.rmtree(broken / "corr")
    shutil.copytree(broken / "proj", broken / "corr")
    (broken / "mosaic.png").write_bytes(b"not a png")
    problems = montage.verify(broken, montage.DEFAULTS)
    assert any("background-corrected overlaps disagree" in problem for problem in problems)
    assert any("not a PNG" in problem for problem in problems)


def test_verify_catches_misplaced_sources(finished: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(finished, broken)
    sky = np.loadtxt(broken / "catalogue.txt", ndmin=2)
    sky[:, 1] += 5 / 3600  # five pixels north of where the tiles put them
    np.savetxt(broken / "catalogue.txt", sky)
    assert any("brightest sources" in problem for problem in montage.verify(broken, montage.DEFAULTS))


@pytest.mark.parametrize("stage", ["imgtbl", "project", "diff", "bgmodel", "add"])
def test_stage_without_inputs_fails_naming_the_file(stage: str, tmp_path: Path) -> None:
    done = run_stage("montage", stage, tmp_path / "empty", tmp_path / "progress")
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("stage error:")]
    assert len(lines) == 1 and "missing input" in lines[0] and str(tmp_path / "empty") in lines[0]
