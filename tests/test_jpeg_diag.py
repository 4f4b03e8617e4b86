"""bench/jpeg_diag.py on a CPU Triton (pytriton wheel): the detector with and without the lone-frame graphs answers
every frame, alone and 8 at once, with its own frame's boxes (on a CPU both run the same function eagerly; on a GPU
the graphs are what it checks: the H200 run that found the geometry bug is bench/results/jpeg_diag.json)."""

import json

from bench import jpeg_diag


def test_every_frame_alone_and_together_is_answered_with_its_own_boxes(tmp_path):
    assert jpeg_diag.main(["--cpu", "--frames", "3", "--repeat", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "jpeg_diag.json").read_text())
    assert sorted(set(result["sizes"])) == ["1280x720", "1920x1080", "640x480"]
    for mode in ("lone", "nog"):
        alone = result["runs"][f"{mode} one at a time"]
        assert alone["total"] == {"1280x720": 1, "1920x1080": 1, "640x480": 1} and alone["wrong"] == {}
        assert result["runs"][f"{mode} 8 at once"] == {"total": 3, "wrong_frames": []}
