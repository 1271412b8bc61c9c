"""The cube view's TMA coordinates on the CPU (run by tests/test_cube_view_coords.py in a subprocess: CUTE_DSL_ARCH
before cutlass). kernels/cute/fwd_cube._cube_view folds the tile modes (head, cube index, batch) into one TMA
dimension; the descriptor's stride there is the gcd of their strides, the coordinate CuTe computes is in units of
the first mode's stride. This builds the kernel's TMA atom over the view in a host-only jit function (no GPU: the
descriptor is computed on the host), and prints, per (head, cube, batch) tile, the TMA coordinate and the element
offset of the tile's first row: exact when coordinate x head stride = offset; and the coordinate of the kernel's
form (pair_sched._cube_tile: the first row's raster token x H + head in the mode's first entry). Prints
`RESULTS_JSON {...}`."""
import json
import os
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import cutlass.utils as utils  # noqa: E402
import cutlass.utils.hopper_helpers as sm90_utils  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402
from cutlass.cute.runtime import from_dlpack  # noqa: E402

from kernels.cute.fwd_cube import _cube_view, cube_scalars  # noqa: E402

BS, D = 64, 128
ROWS = []


@cute.jit
def tile(mX4: cute.Tensor, gw: cutlass.Int32, gh: cutlass.Int32, wc: cutlass.Int32, hc: cutlass.Int32,
         fc: cutlass.Int32, cw: cutlass.Int32, ch: cutlass.Int32, cf: cutlass.Int32, h: cutlass.Int32,
         b: cutlass.Int32, flat: cutlass.Int32):
    v = _cube_view(mX4, gw, gh, wc, hc, fc)
    mX = cute.make_tensor(v.iterator, cute.make_layout((v.shape[2], v.shape[3], (v.shape[1], v.shape[0])),
                                                       stride=(v.stride[2], v.stride[3], (v.stride[1], v.stride[0]))))
    s_layout = sm90_utils.make_smem_layout_b(utils.LayoutEnum.from_tensor(mX), (BS, BS, D), mX4.element_type, 1)
    _, gXt = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mX, cute.slice_(s_layout, (None, None, 0)),
                                         (BS, D))
    crd = (0, 0, (h, cw, ch, cf), 0, (0, b))
    gt = cute.flat_divide(gXt, (BS, D))
    # the kernel's form (pair_sched._cube_tile): the flat coordinate in the mode's first entry
    cute.printf("TILE {} {} {}", gt[crd], cute.crd2idx(crd, cute.flat_divide(mX, (BS, D)).layout),
                gt[(0, 0, (flat, 0, 0, 0), 0, (0, b))])


res = {}
for grid, H, B in (((8, 16, 16), 2, 1), ((21, 30, 52), 40, 1), ((6, 18, 27), 3, 2)):
    T = grid[0] * grid[1] * grid[2]
    x = torch.zeros(B, T, H, D, dtype=torch.bfloat16).transpose(1, 2)  # the caller's [B, L, H * D]
    a = from_dlpack(x, assumed_align=16).mark_layout_dynamic(leading_dim=3)
    _, gw, gh, wc, hc, fc = cube_scalars(grid, 0)
    sc = [cutlass.Int32(v) for v in (gw, gh, wc, hc, fc)]
    picks = [(0, 0, 0, 0, 0), (1, 0, 0, 0, 0), (0, 1, 0, 0, 0), (0, 0, 1, 0, 0), (wc - 1, hc - 1, fc - 1, H - 1, B - 1),
             (1, 1, 0, 1, B - 1)]
    fn = cute.compile(tile, a, *sc, *[cutlass.Int32(0)] * 6)
    out = []
    for p in picks:
        r, w = os.pipe()  # the host printf writes to fd 1: read it back
        saved = os.dup(1)
        os.dup2(w, 1)
        cw, ch, cf, h, b = p
        first = ((4 * cf) * gh + 4 * ch) * gw + 4 * cw  # the raster token of the cube's first row
        fn(a, *sc, *[cutlass.Int32(v) for v in p], cutlass.Int32(first * H + h))
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(w)
        line = os.read(r, 4096).decode()
        os.close(r)
        txt = line.split("TILE ")[1].split()
        coord = [int(c) for c in txt[0].strip("()").split(",")]
        flat = [int(c) for c in txt[2].strip("()").split(",")]
        out.append({"tile": p, "coord": coord, "offset": int(txt[1]), "head_stride": x.stride(1), "flat": flat})
    res[f"{grid}_H{H}_B{B}"] = out
print("RESULTS_JSON " + json.dumps(res), flush=True)
