"""GPU probe (session 33): does a CuTe TMA load through a hierarchical token view fetch the tile it names?

bench/probes/cube_exact.py ran the pair kernel through a (4 x 4 x 4 cube) token view of the caller's layout and got
outputs unlike the copies' (H100, session 33). This isolates the load: one CTA per (tile, head, batch) loads tile t
of x through the same TMA atom the kernel builds (fwd.py's K-major smem layout, `TileOps._tma_part`) into shared
memory and writes it out row by row; the result must equal x's block-order gather. Views (PROBE_VIEWS):
  flat   the [B, H, T, D] tensor as the kernels see it today (the check of the check);
  cube   T split as ((4, 4, 4), (W/4, H/4, F/4)) over the latent grid, w fastest (cube_exact.py's view): CuTe folds
         the cube index, the head and the batch into one TMA dimension (its tma_gbasis);
  cube1  the same with the cube grid one row of cubes (H = F = 4): fewer folded modes;
  cubes  cube with the caller's token and head strides static (compiled per head count).
Per view and layout (the caller's [B, L, H * D] and a contiguous [B, H, L, D]): max abs difference, the first tile
that differs and which tile's rows it holds instead. Prints `RESULT {...}`.

    python bench/probes/cube_tma.py
    PROBE_COMPILE_ONLY=1 python bench/probes/cube_tma.py     (no GPU: each case compiled for sm_90a, its gbasis printed)
"""
import json
import os
import sys

import torch

sys.path.insert(0, ".")
import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import cutlass.utils as utils  # noqa: E402
import cutlass.utils.hopper_helpers as sm90_utils  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402
from cutlass.cute.runtime import from_dlpack  # noqa: E402

BS, D = 64, 128


def cube_modes(grid, s):
    """The token mode of a latent grid [F, H, W] (raster order, token stride s) split into 4 x 4 x 4 cubes: shape
    ((4, 4, 4), (W/4, H/4, F/4)) and its strides, w fastest at both levels (bench/probes/cube_exact.py uses it too)."""
    gf, gh, gw = grid
    return ((4, 4, 4), (gw // 4, gh // 4, gf // 4)), ((s, gw * s, gh * gw * s), (4 * s, 4 * gw * s, 4 * gh * gw * s))


def cube_perm(grid, device):
    """perm[i] = the raster token at block-order position i of cube_modes' order (cubes in raster order of the cube
    grid, raster order inside a cube)."""
    gf, gh, gw = grid
    f, h, w = torch.meshgrid(torch.arange(gf), torch.arange(gh), torch.arange(gw), indexing="ij")
    r = (f * gh + h) * gw + w
    # [F/4, 4, H/4, 4, W/4, 4] -> cube (fc, hc, wc) outer, (f, h, w) inside it
    return r.reshape(gf // 4, 4, gh // 4, 4, gw // 4, 4).permute(0, 2, 4, 1, 3, 5).reshape(-1).to(device)


def view_of(x, kind, grid, heads):
    """[B, H, T, D] -> (T, D, (H, B)), T flat or as cube modes; "cubes": the caller's layout with its token and head
    strides static (heads * D, D), so CuTe can see each cube coordinate as a multiple of an in-cube stride."""
    if kind == "cubes":
        t_shape, t_stride = cube_modes(grid, heads * D)
        return cute.make_tensor(x.iterator, cute.make_layout(
            (t_shape, D, (heads, x.shape[0])), stride=(t_stride, 1, (D, x.stride[0]))))
    t_shape, t_stride = (x.shape[2], x.stride[2]) if kind == "flat" else cube_modes(grid, x.stride[2])
    return cute.make_tensor(x.iterator, cute.make_layout(
        (t_shape, x.shape[3], (x.shape[1], x.shape[0])), stride=(t_stride, x.stride[3], (x.stride[1], x.stride[0]))))


class TmaCopy:
    def __init__(self, kind, grid, heads):
        self.kind, self.grid, self.heads = kind, grid, heads

    @cute.jit
    def __call__(self, mX4: cute.Tensor, mOut: cute.Tensor, stream: cuda.CUstream):
        dt = mX4.element_type
        mX = view_of(mX4, self.kind, self.grid, self.heads)
        lay = utils.LayoutEnum.from_tensor(mX)
        s_layout = sm90_utils.make_smem_layout_b(lay, (BS, BS, D), dt, 1)
        s0 = cute.slice_(s_layout, (None, None, 0))
        tma, gXt = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mX, s0, (BS, D))
        self.nbytes = cute.size_in_bytes(dt, s0)
        print("tma_gbasis", self.kind, gXt)

        @cute.struct
        class Smem:
            bar: cute.struct.MemRange[cutlass.Int64, 1]
            buf: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(s_layout)], 1024]

        self.smem = Smem
        n_t = cute.ceil_div(cute.size(mX, mode=[0]), BS)
        self.kernel(tma, gXt, mOut, s_layout).launch(grid=[n_t, mX4.shape[1], mX4.shape[0]], block=[128, 1, 1],
                                                     stream=stream)

    @cute.kernel
    def kernel(self, tma: cute.CopyAtom, gXt: cute.Tensor, mOut: cute.Tensor, s_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        t, i_h, i_b = cute.arch.block_idx()
        st = utils.SmemAllocator().allocate(self.smem)
        sX = st.buf.get_tensor(s_layout.outer, swizzle=s_layout.inner)
        bar = st.bar.data_ptr()
        if tidx == 0:
            cute.arch.mbarrier_init(bar, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        gt = cute.flat_divide(gXt, (BS, D))
        tXs, tXg = cpasync.tma_partition(tma, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2),
                                         cute.group_modes(gt, 0, 2))
        if tidx == 0:
            cute.arch.mbarrier_arrive_and_expect_tx(bar, self.nbytes)
            cute.copy(tma, tXg[(None, t, 0, (i_h, i_b))], tXs[(None, 0)], tma_bar_ptr=bar)
        cute.arch.mbarrier_wait(bar, 0)
        for e in cutlass.range(tidx, BS * D, 128, unroll=1):
            r = e // D
            c = e - r * D
            mOut[i_b, i_h, t * BS + r, c] = sX[r, c, 0]


COMPILE_ONLY = os.environ.get("PROBE_COMPILE_ONLY", "0") == "1"


def run(kind, grid, heads, batch, caller_layout):
    T = grid[0] * grid[1] * grid[2]
    dev = torch.device("cpu" if COMPILE_ONLY else "cuda")
    x = torch.randn(batch, heads, T, D, device=dev).to(torch.bfloat16)
    if caller_layout:
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    out = torch.zeros(batch, heads, T, D, device=dev, dtype=torch.bfloat16)
    perm = cube_perm(grid, dev) if kind != "flat" else torch.arange(T, device=dev)
    want = x[:, :, perm]
    stream = cuda.CUstream(0 if COMPILE_ONLY else torch.cuda.current_stream().cuda_stream)
    fn = cute.compile(TmaCopy(kind, grid, heads), from_dlpack(x, assumed_align=16).mark_layout_dynamic(leading_dim=3),
                      from_dlpack(out, assumed_align=16).mark_layout_dynamic(leading_dim=3), stream)
    if COMPILE_ONLY:
        return {"compiled": True}
    fn(from_dlpack(x, assumed_align=16).mark_layout_dynamic(leading_dim=3),
       from_dlpack(out, assumed_align=16).mark_layout_dynamic(leading_dim=3), stream)
    torch.cuda.synchronize()
    diff = (out.float() - want.float()).abs()
    d = {"max_abs_diff": diff.max().item(), "tiles_wrong": int((diff.amax(dim=(0, 1, 3)).reshape(-1, BS).amax(1)
                                                                 > 0).sum()), "tiles": T // BS}
    if d["tiles_wrong"]:
        bad = (diff.amax(dim=(0, 1, 3)) > 0).nonzero()[0].item()
        # which raster token (and head) does the first wrong row hold? match its row against every row of x
        row = out[0, 0, bad].float()
        hit = ((x[0].float() - row).abs().amax(-1) == 0).nonzero().tolist()
        d.update(first_wrong_row=bad, wanted_token=int(perm[bad]), holds_head_token=hit[:3],
                 zero_row=bool(row.abs().max().item() == 0))
    return d


def main():
    if COMPILE_ONLY:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        import cutlass.base_dsl.runtime.cuda as _cuda_rt
        _cuda_rt.get_device_attribute = lambda *a, **k: 228 * 1024
    res = {"gpu": "none" if COMPILE_ONLY else torch.cuda.get_device_name(), "torch": torch.__version__}
    cases = [("flat", (4, 8, 8), 2, 1, True), ("cube", (4, 8, 8), 2, 1, False), ("cube", (4, 8, 8), 2, 1, True),
             ("cube1", (4, 4, 16), 2, 1, True), ("cube", (8, 8, 8), 3, 2, True),
             ("cube", (20, 28, 52), 40, 1, True), ("cubes", (8, 8, 8), 3, 2, True),
             ("cubes", (20, 28, 52), 40, 1, True)]
    views = os.environ.get("PROBE_VIEWS", "flat,cube,cube1,cubes").split(",")
    for kind, grid, heads, batch, caller in cases:
        if kind not in views:
            continue
        key = f"{kind}_{'x'.join(map(str, grid))}_H{heads}_B{batch}_{'caller' if caller else 'contig'}"
        try:
            res[key] = run(kind, grid, heads, batch, caller)
        except Exception as e:  # noqa: BLE001 (a probe: report and go on)
            res[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(key, json.dumps(res[key]), flush=True)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
