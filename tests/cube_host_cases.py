"""The cube path's host side (kernels/cute/fwd_cube.py forward_cubes, usable) on CPU under TRITON_INTERPRET=1, with the
CuTe kernel replaced by a stand-in that checks what it is handed: the copies of the blocks after the cubes hold the
cube order's rows (block_stats gather_from; with PSA_CUTE_CUBE_KV=0 k and v copied whole), the statistics and lists
are those of the whole cube order, and an output written in block order through the permutation lands in the caller's
order. Prints one JSON line; run by tests/test_cube_host_interpret.py in a subprocess (TRITON_INTERPRET before Triton,
cutlass-dsl importable)."""
import itertools
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from interp_common import case_recorder, cfg_of, rnd  # noqa: E402
from kernels.cute import fwd_cube  # noqa: E402
from kernels.reorder import full_order, orders_on  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402

RES = {}
case = case_recorder(RES)


@case("forward_cubes_hands_the_kernel_its_blocks")
def _():
    out = {}
    os.environ["PSA_MORTON_CUBES"] = "1"
    os.environ["PSA_CUTE_PAIR"] = "1"  # (the pair kernel below its 72 blocks: these grids are tiny)
    for (grid, B, H), kv in itertools.product((((5, 9, 13), 1, 2), ((4, 8, 8), 2, 1)), (True, False)):
        # a rest of 201 rows; every block a cube. kv: k and v through the view too (PSA_CUTE_CUBE_KV), else
        # copies of every block
        os.environ["PSA_CUTE_CUBE_KV"] = "1" if kv else "0"
        T = grid[0] * grid[1] * grid[2]
        x = [rnd(B, T, H, 128, seed=s, dtype=torch.bfloat16).transpose(1, 2) for s in range(3)]  # [B, L, H * D]
        cfg = cfg_of(128, 0.3, "pwt")
        perm = orders_on(grid, "cpu")[0]
        lay = fwd_cube.usable(x[0], cfg, perm, 0)
        fperm = full_order(perm, 0)
        seen = {}

        def stand_in(qr, kr, vr, o, st, idx, vbias, cfg_, perm=None, cube=None):
            qc, kc, vc, g, n_cube, kv_ = cube
            goff, p = n_cube * 64, perm.long()
            ok = kv_ == kv
            for r, c, off in zip((qr, kr, vr), (qc, kc, vc), (goff, goff if kv else 0, goff if kv else 0)):
                want = c[:, :, p]
                ok &= r.shape[2] == (T - off or 64) and (off == T or torch.equal(r, want[:, :, off:]))
            ref = kts.block_stats(*(c[:, :, p].contiguous() for c in (qc, kc, vc)), cfg_)
            idx_ref, _ = kts.route(ref, cfg_, qc.dtype)
            seen.setdefault("copies_right", []).append(bool(ok))
            seen.setdefault("stats_equal", []).append(bool(torch.equal(st.kbar, ref.kbar) and torch.equal(
                st.qbar, ref.qbar)))
            seen.setdefault("lists_equal", []).append(bool(torch.equal(idx, idx_ref)))
            o[:, :, p] = qc[:, :, p]  # identity "attention", written in block order through the permutation
            return o

        y = fwd_cube.forward_cubes(*x, cfg, fperm, *lay, stand_in)
        out[f"{grid} kv={kv}"] = {"layout": list(lay[0]) + [lay[1]], "output_is_q": bool(torch.equal(y, x[0])), **seen}
    os.environ.pop("PSA_CUTE_CUBE_KV")
    return out


@case("usable_only_for_the_cube_order_without_a_prefix")
def _():
    grid = (5, 9, 13)
    q = rnd(1, 585, 2, 128, dtype=torch.bfloat16).transpose(1, 2)  # the caller's [B, L, H * D]
    cfg = cfg_of(128, 0.3, "pwt")
    os.environ["PSA_CUTE_PAIR"] = "1"
    os.environ["PSA_MORTON_CUBES"] = "1"
    perm = orders_on(grid, "cpu")[0]
    r = {"on": fwd_cube.usable(q, cfg, perm, 0), "prefix": fwd_cube.usable(q, cfg, perm, 3),
         "drop": fwd_cube.usable(q, cfg_of(128, 0.3, "drop"), perm, 0),
         "contiguous": fwd_cube.usable(q.contiguous(), cfg, perm, 0)}
    os.environ["PSA_CUTE_CUBE_VIEW"] = "0"
    r["view_off"] = fwd_cube.usable(q, cfg, perm, 0)
    os.environ.pop("PSA_CUTE_CUBE_VIEW")
    os.environ["PSA_MORTON_CUBES"] = "0"
    r["order_off"] = fwd_cube.usable(q, cfg, orders_on(grid, "cpu")[0], 0)
    return {k: (list(v[0]) + [v[1]]) if v else None for k, v in r.items()}


print("RESULTS_JSON " + json.dumps(RES), flush=True)
