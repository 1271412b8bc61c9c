"""H200 probe (session 30, for the next device time): what bounds the exact part's tile stream, the L2 or what one SM
can take in? Session 25 ran the pair kernel's K / V tiles alone (no GEMMs, no softmax) at 42.9 GB in 4.54 ms uncapped,
~36 bytes per SM clock per SM. A build that shares tiles between four query blocks (two pair CTAs in a cluster, TMA
multicast: bench/results/pieces_h200.md, Session 30) halves the L2 reads but delivers every tile of the four lists'
union to both SMs, 1.48x the tiles per SM of today's pipelines on random inputs (0.92x DiT-like). Whether that can pay
depends on which of the two is the limit, which this measures.

Kernel: P persistent Triton programs (P in PROBE_PROGRAMS, default 16,33,66,132,264), 4 warps each, each loading
PROBE_ITERS [64, 128] bfloat16 tiles (16 KiB, the pair kernel's K or V tile) through a TMA descriptor, pipelined
PROBE_STAGES deep, from a buffer of PROBE_BUFFER_MB (default 16: one head's K and V at Wan2.1-14B 480p, L2-resident;
then 2048: from HBM) in a scattered order, adding each tile into a float32 register tile and storing one value per
program (nothing optimised away). Per (buffer, P): time (CUDA events, median of 5), TB/s, bytes per SM clock per
program, the median SM clock and power (nvidia-smi, bench/probes/clocks.py's sampler) over PROBE_SECONDS of repeats.

Reading (written before the run): if bytes per clock per program at P = 132 (one per SM) sit near the pair kernel's
~36 and rise well above them at P = 16-33, the L2 (or the fabric all SMs share) bounds the stream, so halving the
reads by multicast would help groups of four on random inputs too; if they stay near 36 at every P, one SM's intake
bounds it, and multicast (every tile into both SMs) cannot help random inputs. Prints one line `RESULT {...}`.

PROBE_BOX_ROWS=R (session 31; default 64) loads each 64-row tile as 64 / R boxes of [R, 128] at scattered rows: the
pattern of a kernel that would read a Morton block straight from the caller's raster layout (an interior 4 x 4 x 4
block is 16 runs of 4 tokens adjacent along W) instead of from block-order copies. Session 31 on an H100 (R = 64):
32-34 bytes per clock per program at P 16-66, 7.4-7.8 TB/s at P 132-264 (bench/results/l2_ingress_s31_h100.txt).
Session 32 (G31, H100): R = 4 at 0.23x / 0.38x of R = 64's TB/s at P 132 / 264.

PROBE_BOX_CUBE=1 (session 33) loads each tile as ONE 4-D box [4, 4, 4, 128] over the buffer viewed as a latent grid
[F, H, W, 128] (W fastest): the 4 x 4 x 4 cube of raster-order tokens an interior Morton block is, in one TMA request
instead of 16 boxes of 4 rows. PROBE_ROW_HEADS=h (default 1) spaces the rows h * 128 elements apart with the other
heads' columns unread: the caller's [B, L, H * D] layout read in place (h = 40: Wan2.1-14B), no layout pass.

    python bench/probes/l2_ingress.py
    TRITON_INTERPRET=1 PROBE_SMOKE=1 python bench/probes/l2_ingress.py     (CPU: the kernel's sums checked, no timing)
"""
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older Triton
    TensorDescriptor = None

SMOKE = os.environ.get("PROBE_SMOKE", "0") == "1"
PROGRAMS = [int(p) for p in os.environ.get("PROBE_PROGRAMS", "16,33,66,132,264").split(",")]
ITERS = int(os.environ.get("PROBE_ITERS", "4096"))
STAGES = int(os.environ.get("PROBE_STAGES", "4"))
BUFFERS_MB = [int(b) for b in os.environ.get("PROBE_BUFFER_MB", "16,2048").split(",")]
BOX_ROWS = int(os.environ.get("PROBE_BOX_ROWS", "64"))
CUBE = os.environ.get("PROBE_BOX_CUBE", "0") == "1"
ROW_HEADS = int(os.environ.get("PROBE_ROW_HEADS", "1"))
SECONDS = float(os.environ.get("PROBE_SECONDS", "2"))
BM, BD = 64, 128  # one K or V tile of the pair kernel


@triton.jit
def _stream_kernel(desc, OUT, n_tiles, iters, BM: tl.constexpr, BD: tl.constexpr, STAGES: tl.constexpr,
                   R: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([R, BD], dtype=tl.float32)
    for i in tl.range(0, iters, num_stages=STAGES):
        t = (pid * 7919 + i * 131) % n_tiles  # scattered, every program its own walk
        for j in tl.static_range(BM // R):  # R = BM: the whole tile in one box
            # box j of tile t: R rows at a scattered offset (a run of a Morton block, R rows apart from the last)
            acc += desc.load([((t + j * 977) % n_tiles) * BM + ((j * 5) % (BM // R)) * R, 0]).to(tl.float32)
    tl.store(OUT + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


@triton.jit
def _cube_kernel(desc, OUT, n_hc, n_wc, n_tiles, iters, BD: tl.constexpr, STAGES: tl.constexpr):
    """Each tile one [4, 4, 4, BD] box of the [F, H, W, BD] grid view: cube t at (t // (n_hc n_wc), t // n_wc % n_hc,
    t % n_wc) in cube units, the same scattered walk as _stream_kernel."""
    pid = tl.program_id(0)
    acc = tl.zeros([64, BD], dtype=tl.float32)
    for i in tl.range(0, iters, num_stages=STAGES):
        t = (pid * 7919 + i * 131) % n_tiles
        cf = t // (n_hc * n_wc)
        ch = (t // n_wc) % n_hc
        cw = t % n_wc
        acc += tl.reshape(desc.load([cf * 4, ch * 4, cw * 4, 0]), [64, BD]).to(tl.float32)
    tl.store(OUT + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


def _grid(rows):
    """[F, H, W] with H = W = 64 (a whole number of 4 x 4 x 4 cubes) holding `rows` tokens."""
    assert rows % (64 * 64 * 4) == 0, rows
    return rows // (64 * 64), 64, 64


def _cube_tokens(rows, t):
    """The raster rows of cube t (the cube kernel's order: f, h, w)."""
    f, h, w = _grid(rows)
    n_hc, n_wc = h // 4, w // 4
    cf, ch, cw = t // (n_hc * n_wc), t // n_wc % n_hc, t % n_wc
    return [((cf * 4 + a) * h + ch * 4 + b) * w + cw * 4 + c for a in range(4) for b in range(4) for c in range(4)]


def _rows(n_tiles, p, i, j, r):
    """The first row of box j of program p's tile i (the kernel's walk)."""
    t = (p * 7919 + i * 131) % n_tiles
    return ((t + j * 977) % n_tiles) * BM + ((j * 5) % (BM // r)) * r


def run(buf, programs, iters, r=None, cube=None):
    """buf: [rows, ROW_HEADS * BD]; only its first BD columns (one head) are read."""
    cube = CUBE if cube is None else cube
    out = torch.empty(programs, device=buf.device, dtype=torch.float32)
    rows, st = buf.shape[0], buf.stride(0)
    if cube:
        f, h, w = _grid(rows)
        desc = TensorDescriptor(buf, [f, h, w, BD], [h * w * st, w * st, st, 1], [4, 4, 4, BD])
        _cube_kernel[(programs,)](desc, out, h // 4, w // 4, rows // 64, iters, BD=BD, STAGES=STAGES, num_warps=4)
        return out
    r = BOX_ROWS if r is None else r
    assert BM % r == 0, f"PROBE_BOX_ROWS={r} must divide {BM}"
    desc = TensorDescriptor(buf, [rows, BD], [st, 1], [r, BD])
    _stream_kernel[(programs,)](desc, out, buf.shape[0] // BM, iters, BM=BM, BD=BD, STAGES=STAGES, R=r, num_warps=4)
    return out


def smoke():
    """CPU (interpreter): each program's sum equals the sum of the boxes its walk reads (whole tiles, and 16 boxes
    of 4 rows per tile)."""
    buf = torch.randn(8 * BM, BD).to(torch.bfloat16)
    n = buf.shape[0] // BM
    for r in (BM, 4):
        out = run(buf, 3, 5, r)
        for p in range(3):
            want = sum(buf[_rows(n, p, i, j, r):][:r].float().sum() for i in range(5) for j in range(BM // r))
            assert abs(float(out[p]) - float(want)) <= 1e-2 * (1 + abs(float(want))), (r, p, float(out[p]),
                                                                                          float(want))
    for heads in (1, 2):  # one 4-D box per tile, rows contiguous and spaced two heads apart
        big = torch.randn(64 * 64 * 4, heads * BD).to(torch.bfloat16)
        n = big.shape[0] // 64
        out = run(big, 3, 5, cube=True)
        for p in range(3):
            want = sum(big[_cube_tokens(big.shape[0], (p * 7919 + i * 131) % n), :BD].float().sum() for i in range(5))
            assert abs(float(out[p]) - float(want)) <= 1e-2 * (1 + abs(float(want))), ("cube", heads, p,
                                                                                         float(out[p]), float(want))
    print("RESULT " + json.dumps({"smoke": "ok", "programs": 3, "iters": 5, "box_rows": [BM, 4], "cube": [1, 2]}))


def main():
    from clocks import sampler, samples
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "sms": torch.cuda.get_device_properties(0).multi_processor_count, "tile_bytes": BM * BD * 2,
           "iters": ITERS, "stages": STAGES, "box_rows": BOX_ROWS, "cube": CUBE, "row_heads": ROW_HEADS}
    path = tempfile.NamedTemporaryFile(suffix=".csv", delete=False).name
    proc = sampler(path)
    for mb in BUFFERS_MB:
        rows = (mb * 2**20) // (BD * 2) // (64 * 64 * 4) * (64 * 64 * 4)  # one head's bytes: mb (whole cubes)
        buf = torch.randn(rows, ROW_HEADS * BD, device="cuda").to(torch.bfloat16)
        for p in PROGRAMS:
            run(buf, p, 8)  # compile
            torch.cuda.synchronize()
            ms = []
            t0 = time.time()
            while time.time() - t0 < SECONDS or len(ms) < 5:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                run(buf, p, ITERS)
                e1.record()
                torch.cuda.synchronize()
                ms.append(e0.elapsed_time(e1))
            t1 = time.time()
            med = statistics.median(ms)
            nbytes = p * ITERS * BM * BD * 2
            d = {"ms_median": round(med, 4), "tb_per_s": round(nbytes / med / 1e9, 3)}
            got = samples(path, t0 + 0.3, t1) if proc is not None else []
            if got:
                clk = statistics.median(r[0] for r in got)
                d.update(sm_clock_mhz=clk, power_w=statistics.median(r[1] for r in got),
                         bytes_per_clock_per_program=round(nbytes / (med * 1e-3) / (clk * 1e6) / p, 2))
            res[f"{mb}MB_P{p}"] = d
            print(mb, p, json.dumps(d), flush=True)
        del buf
        torch.cuda.empty_cache()
    if proc is not None:
        proc.terminate()
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    if TensorDescriptor is None:
        sys.exit("this Triton has no triton.tools.tensor_descriptor")
    smoke() if SMOKE else main()
