"""The cube path's host side (kernels/cute/fwd_cube.py) on CPU: what forward_cubes hands the CuTe kernel (the rest's
copies, the whole order's statistics and lists, the output through the permutation) and when it takes a call. Cases:
tests/cube_host_cases.py (a subprocess, TRITON_INTERPRET=1). Skipped, with one line, without nvidia-cutlass-dsl."""
import importlib.util

import pytest
from driver import run_driver

if importlib.util.find_spec("cutlass") is None or importlib.util.find_spec("triton") is None:
    pytest.skip("cube host test skipped: needs nvidia-cutlass-dsl and triton", allow_module_level=True)


@pytest.fixture(scope="module")
def res():
    return run_driver("cube_host_cases.py", env=dict(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES=""))


def get(res, name):
    r = res[name]
    assert "error" not in r, r.get("error")
    return r


def test_forward_cubes_hands_the_kernel_its_blocks(res):
    r = get(res, "forward_cubes_hands_the_kernel_its_blocks")
    assert len(r) == 4, r  # two grids, k and v through the view or copied whole (PSA_CUTE_CUBE_KV)
    for kv in (True, False):
        assert r[f"(5, 9, 13) kv={kv}"]["layout"] == [5, 9, 13, 6] and r[f"(4, 8, 8) kv={kv}"]["layout"] == [4, 8, 8, 4]
    for g, d in r.items():
        assert d["output_is_q"] and all(d["copies_right"]) and all(d["stats_equal"]) and all(d["lists_equal"]), (g, d)


def test_usable_only_for_the_cube_order_without_a_prefix(res):
    r = get(res, "usable_only_for_the_cube_order_without_a_prefix")
    assert r == {"on": [5, 9, 13, 6], "prefix": None, "drop": None, "contiguous": None, "view_off": None,
                 "order_off": None}, r
