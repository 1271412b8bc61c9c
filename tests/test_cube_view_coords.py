"""The cube view's folded TMA dimension is exact (kernels/cute/fwd_cube._cube_view): for tiles of several heads,
cubes and batches of the caller's [B, L, H * D], the coordinate CuTe gives the TMA unit, times the head stride (the
fold's first mode, its unit), is the element offset of the tile's first row, and the kernel's division-free form of
the coordinate (pair_sched._cube_tile) gives the same. Session 34's first cube view put the cube index first: the
head's stride D / 4 s came out as 1 and the GPU run read and wrote the wrong tiles. Runs on the CPU
(tests/cube_coords_case.py, a subprocess); skipped, with one line, without nvidia-cutlass-dsl."""
import importlib.util

import pytest
from driver import run_driver

if importlib.util.find_spec("cutlass") is None:
    pytest.skip("cube view coordinate test skipped: nvidia-cutlass-dsl is not installed (pip install .[cute])",
                allow_module_level=True)


def test_folded_tma_coordinate_addresses_the_tile():
    res = run_driver("cube_coords_case.py", env=dict(CUTE_DSL_ARCH="sm_90a"))
    assert len(res) == 3
    for case, tiles in res.items():
        for t in tiles:
            assert t["coord"][:4] == [0, 0, 0, 0], (case, t)
            assert t["coord"][4] * t["head_stride"] == t["offset"], (case, t)
            assert t["flat"] == t["coord"], (case, t)  # the kernel's division-free form addresses the same tile
