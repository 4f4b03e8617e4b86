"""bench/gen_gpu.py's pure parts: each answer's check against its own (prompt, seed)'s reference image, the
tolerance the references give, and the N-machine line from measured costs."""

from __future__ import annotations

import numpy as np
import pytest

from bench.gen_gpu import image_problem, machine_line, reference_tolerance
from serving.bytes_rows import to_rows

pytest.importorskip("PIL")


def refs(n: int = 3, side: int = 16) -> list[np.ndarray]:
    return [np.random.default_rng(i).integers(0, 256, (side, side, 3), dtype=np.uint8) for i in range(n)]


def answer(img: np.ndarray) -> np.ndarray:
    from serving.models.sdxl_generator import png_bytes

    return to_rows([png_bytes(img)])


def test_an_answer_near_its_own_reference_passes_and_one_of_another_prompt_does_not():
    r = refs()
    tol, apart = reference_tolerance(r)
    assert apart > 50 and tol == apart / 4
    rounding = np.clip(r[1].astype(int) + np.random.default_rng(9).integers(-2, 3, r[1].shape), 0, 255)
    assert image_problem(answer(rounding.astype(np.uint8)), 1, r, tol) is None
    assert str(image_problem(answer(r[2]), 1, r, tol)).startswith("nearer to prompt 2's reference")


def test_wrong_size_undecodable_missing_and_two_images_are_each_named():
    r = refs()
    assert "not the declared 16x16" in str(image_problem(answer(np.zeros((8, 16, 3), np.uint8)), 0, r, 10.0))
    assert "does not decode" in str(image_problem(to_rows([b"not a png"]), 0, r, 10.0))
    assert image_problem(None, 0, r, 10.0) == "no image output"
    two = to_rows([bytes(answer(r[0])[0]), bytes(answer(r[0])[0])])
    assert image_problem(two, 0, r, 10.0) == "2 images for one prompt"


def test_an_answer_between_references_is_refused_past_the_tolerance():
    r = refs()
    mid = ((r[0].astype(int) + r[1]) // 2).astype(np.uint8)
    problem = image_problem(answer(mid), 0, r, 5.0) or image_problem(answer(mid), 1, r, 5.0)
    assert problem is not None and "allowed" in problem


def test_the_machine_line_is_linear_until_one_redis_is_busy():
    line = machine_line(0.5, {"redis_main_thread_us_per_job": 200.0})
    assert line["machines_for_seed_goal"] == 90  # 45 images/s at 0.5 a machine
    assert line["redis_jobs_per_s_at_80pct"] == 4000
    assert line["machines_before_redis_limits"] == 8000
    assert line["line"][64] == 32.0
