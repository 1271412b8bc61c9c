"""Every piece of the operator against its own bound on the GPU (issue 11), in one run.

    python bench/pieces.py --out DIR [--shapes wan14,wan14_720,wan13,flux] [--backends triton,cute]
                           [--old DIR_WITH_kernels_old] [--ditlike] [--morton] [--flux-node] [--rep 100]

Per shape (B1, D128, bf16, random N(0,1) inputs; pwt at density 0.125, FLUX 0.2):
  * ceilings measured first: device-to-device copy bandwidth (bytes read + written), bf16 GEMM TFLOP/s;
  * statistics (block_stats) for pwt and for drop, against one read of the tensors they need;
  * routing (scores + top-k + H-bar reduction) against the bytes it must write (bias rows, index lists);
  * attention kernels under identical routing: drop = the exact part (TFLOP/s of the routed tiles), pwt - drop
    = the virtual-token work (against its FLOPs at the exact part's rate);
  * the full operator, and a torch.profiler kernel table of one call;
  * with --old: the same through a copy of the previous kernels (package `kernels_old`), in the same run;
  * --ditlike: the exact part on DiT-like Morton-ordered inputs (kernels/synthetic.py at the real size) and the
    share of KV blocks adjacent query blocks have in common; --morton: reorder="morton" vs "none" through the
    public API, time and peak extra memory; --flux-node: FLUX 1024^2 as the node calls it, eager vs through the
    CUDA-graph cache (kernels/graphs.py) vs a hand-captured graph replayed alone.
Timing: median of triton.testing.do_bench (CUDA events), first call outside the timing. Writes DIR/pieces.json
after every shape and prints one line per measurement; a short table last.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import pieces_sweep as psw  # noqa: E402  (bench/: the knob sweeps)
from triton.testing import do_bench  # noqa: E402

from kernels.config import SparseConfig  # noqa: E402

SHAPES = {"wan14": (1, 40, 32760, 128), "wan14_720": (1, 40, 75600, 128), "wan13": (1, 12, 32760, 128),
          "flux": (1, 24, 4608, 128)}
GRIDS = {"wan14": (21, 30, 52), "wan14_720": (21, 45, 80), "wan13": (21, 30, 52), "flux": (64, 64)}
RES: dict = {"shapes": {}}
T0 = time.time()
REP = 100
DEV, DT = "cuda", torch.bfloat16  # --dry: CPU, float16, TRITON_INTERPRET=1 (a smoke test of this script)


def say(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def ms(fn):
    fn()
    sync()
    if DEV != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return do_bench(fn, warmup=25, rep=REP, return_mode="median")


def timed(d, key, fn):
    try:
        d[key] = ms(fn)
        say(f"  {key}: {d[key]:.4f} ms")
    except Exception as e:
        traceback.print_exc()
        d[key] = f"failed: {type(e).__name__}: {str(e)[:200]}"
        say(f"  {key}: FAILED {d[key]}")
    return d[key]


def cfg_of(variant, density, D=128):
    return SparseConfig(density=density, variant=variant, band=1, n_sink_blocks=0, scale=D ** -0.5)


def rnd(shape, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, device=DEV, generator=g, dtype=torch.float32).to(DT)


def ceilings():
    n, m = (2**30, 8192) if DEV == "cuda" else (2**20, 256)
    x = torch.empty(n, device=DEV, dtype=DT)
    y = torch.empty_like(x)
    t = ms(lambda: y.copy_(x))
    a = torch.randn(m, m, device=DEV, dtype=torch.float32).to(DT)
    b = torch.randn(m, m, device=DEV, dtype=torch.float32).to(DT)
    tg = ms(lambda: a @ b)
    c = {"copy_TBps": 2 * x.numel() * 2 / t / 1e9, "gemm_bf16_TFLOPs": 2 * m**3 / tg / 1e9}
    del x, y, a, b
    empty()
    say("ceilings", c)
    return c


def empty():
    if DEV == "cuda":
        torch.cuda.empty_cache()


def kernel_table(fn, top=12):
    """[(kernel name, total ms, calls)] of one call of fn, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    sync()
    acts = [ProfilerActivity.CUDA] if DEV == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        fn()
        sync()
    rows = []
    for ev in prof.key_averages():
        t = (getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)) if DEV == "cuda" \
            else ev.cpu_time_total
        if t > 0:
            rows.append((ev.key[:90], t / 1e3, ev.count))
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


def pieces(label, pkg, backends, q, k, v, density, bw, out):
    """Statistics, routing, attention (drop / pwt under the same routing) and the full operator of one kernels
    package (`kernels` or `kernels_old`)."""
    kt = importlib.import_module(f"{pkg}.triton")
    kts = importlib.import_module(f"{pkg}.triton.stats")
    ktf = importlib.import_module(f"{pkg}.triton.fwd")
    B, H, T, D = q.shape
    n = -(-T // 64)
    cpwt, cdrop = cfg_of("pwt", density, D), cfg_of("drop", density, D)
    d = out.setdefault(label, {})
    # statistics
    t_st = timed(d, "stats_pwt_ms", lambda: kts.block_stats(q, k, v, cpwt))
    timed(d, "stats_drop_ms", lambda: kts.block_stats(q, k, v, cdrop))
    st = kts.block_stats(q, k, v, cpwt)

    def route_once():
        if hasattr(st, "hbar_ready"):
            st.hbar_ready = False
        return kts.route(st, cpwt, q.dtype)

    timed(d, "routing_pwt_ms", route_once)
    idx, vbias = route_once()
    if getattr(st, "hbar", None) is None and hasattr(kts, "finalize_hbar"):
        kts.finalize_hbar(st, n, q.dtype)
    # bounds: one read of q, k, v (+ the statistics written); routing: bias rows + lists written
    qkv_bytes = 3 * q.numel() * q.element_size()
    d["stats_pwt_bound_ms"] = (qkv_bytes + B * H * n * D * (4 * 4 + 2 * 2)) / bw / 1e6
    d["stats_drop_bound_ms"] = (2 * q.numel() * 2 + B * H * n * D * 8) / bw / 1e6
    d["routing_bound_ms"] = (B * H * n * n * 2 + idx.numel() * 4) / bw / 1e6
    n_sel = int((idx >= 0).sum())
    d["exact_tflop"] = n_sel * 64 * 64 * D * 4 / 1e12
    d["virtual_tflop"] = B * H * n * 64 * n * D * 4 / 1e12
    d["exact_l2_gb"] = n_sel * 2 * 64 * D * 2 / 1e9
    outb = torch.empty_like(q)
    timed(d, "attn_triton_drop_ms", lambda: ktf.attention(q, k, v, outb, st, idx, vbias, cdrop))
    timed(d, "attn_triton_pwt_ms", lambda: ktf.attention(q, k, v, outb, st, idx, vbias, cpwt))
    if "cute" in backends:
        try:
            kcf = importlib.import_module(f"{pkg}.cute.fwd")
            timed(d, "attn_cute_drop_ms", lambda: kcf.attention(q, k, v, outb, st, idx, None, cdrop))
            timed(d, "attn_cute_pwt_ms", lambda: kcf.attention(q, k, v, outb, st, idx, vbias, cpwt))
            if "probe" in inspect.signature(kcf.attention).parameters:
                # the pwt build (the pair kernel from 512 blocks on) without its virtual tiles (wrong outputs,
                # timing only): pwt - this = the virtual tiles inside that kernel, this - drop = what the pwt
                # build's exact part costs over the drop kernel's
                timed(d, "attn_cute_pwt_novt_ms",
                      lambda: kcf.attention(q, k, v, outb, st, idx, vbias, cpwt, probe="novt"))
            if "q_rs" in inspect.signature(kcf.attention).parameters:
                psw.cute_qrs(d, kcf, q, k, v, st, idx, vbias, cdrop, cpwt)
        except Exception as e:
            d["attn_cute"] = f"unavailable: {type(e).__name__}: {str(e)[:200]}"
            say("  cute unavailable:", d["attn_cute"])
    del st, idx, vbias
    timed(d, "full_triton_pwt_ms", lambda: kt.forward(q, k, v, cpwt))
    timed(d, "full_triton_drop_ms", lambda: kt.forward(q, k, v, cdrop))
    try:
        d["profile_triton_pwt"] = kernel_table(lambda: kt.forward(q, k, v, cpwt))
    except Exception as e:
        d["profile_triton_pwt"] = f"failed: {e}"
    if "cute" in backends:
        try:
            kc = importlib.import_module(f"{pkg}.cute")
            if kc.available():
                timed(d, "full_cute_pwt_ms", lambda: kc.forward(q, k, v, cpwt))
                timed(d, "full_cute_drop_ms", lambda: kc.forward(q, k, v, cdrop))
                d["profile_cute_pwt"] = kernel_table(lambda: kc.forward(q, k, v, cpwt))
        except Exception as e:
            d["full_cute"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    for be in ("triton", "cute"):
        a, b = d.get(f"attn_{be}_drop_ms"), d.get(f"attn_{be}_pwt_ms")
        if isinstance(a, float) and isinstance(b, float):
            d[f"virtual_{be}_ms"] = b - a
            d[f"exact_{be}_TFLOPs"] = d["exact_tflop"] / a * 1e3
            d[f"exact_{be}_l2_TBps"] = d["exact_l2_gb"] / a
    a, b, c = d.get("attn_cute_drop_ms"), d.get("attn_cute_pwt_novt_ms"), d.get("attn_cute_pwt_ms")
    if all(isinstance(x, float) for x in (a, b, c)):
        d["virtual_cute_in_kernel_ms"] = c - b
        d["pwt_exact_over_drop_cute_ms"] = b - a
    sync()
    empty()
    say(label, {k2: v2 for k2, v2 in d.items() if not k2.startswith("profile")})


# issue #11: statistics variants (kernels.triton.stats module attributes; unnamed ones keep their defaults).
# "split" is the default two-kernel design; "fold*" move the key / value statistics into the H-sum pass
# (stats2._kv_hsum_kernel) with the statistics kernel on q only; "*tc*" take the column sums of q (and drop's k) on
# tensor cores in a pipelined loop (stats2._qk_sums_tc_kernel)
def adjacent_shared_fraction(idx) -> float:
    """Mean over adjacent query-block pairs (2i, 2i + 1) of the share of block 2i's routed KV blocks that block
    2i + 1 routes too (idx: [B, H, N, K], -1 padded): what the pair kernel's shared exact tiles can reuse."""
    a, b = idx[..., 0::2, :].long(), idx[..., 1::2, :].long()
    m = min(a.shape[-2], b.shape[-2])
    a, b = a[..., :m, :], b[..., :m, :]
    inter = ((a[..., :, None] == b[..., None, :]) & (a[..., :, None] >= 0)).any(-1).sum(-1).float()
    return float((inter / (a >= 0).sum(-1).clamp(min=1)).mean())


def ditlike(shape, grid, density, backends, out):
    """Exact part on DiT-like Morton-ordered inputs; share of KV blocks that adjacent query blocks have in common."""
    from kernels import triton as kt
    from kernels.reorder import apply_reorder, orders_on
    from kernels.synthetic import dit_like_qkv
    from kernels.triton import fwd as ktf
    B, H, T, D = shape
    q, k, v = dit_like_qkv(grid, heads=H, head_dim=D, dtype=DT, device=DEV)
    perm, _ = orders_on(grid, DEV)
    q, k, v = (apply_reorder(x, perm) for x in (q, k, v))
    d = out.setdefault("ditlike_morton", {})
    cpwt, cdrop = cfg_of("pwt", density, D), cfg_of("drop", density, D)
    st, idx, vbias = kt.prepare(q, k, v, cpwt)
    d["adjacent_shared_fraction"] = adjacent_shared_fraction(idx)
    say("  adjacent query blocks share", d["adjacent_shared_fraction"])
    outb = torch.empty_like(q)
    timed(d, "attn_triton_drop_ms", lambda: ktf.attention(q, k, v, outb, st, idx, vbias, cdrop))
    timed(d, "attn_triton_pwt_ms", lambda: ktf.attention(q, k, v, outb, st, idx, vbias, cpwt))
    if "cute" in backends:
        try:
            from kernels.cute import fwd as kcf
            timed(d, "attn_cute_drop_ms", lambda: kcf.attention(q, k, v, outb, st, idx, None, cdrop))
            timed(d, "attn_cute_pwt_ms", lambda: kcf.attention(q, k, v, outb, st, idx, vbias, cpwt))
            psw.cute_qrs(d, kcf, q, k, v, st, idx, vbias, cdrop, cpwt)
            from kernels import cute as kc
            timed(d, "full_cute_pwt_ms", lambda: kc.forward(q, k, v, cpwt))
        except Exception as e:
            d["cute"] = f"unavailable: {type(e).__name__}: {str(e)[:200]}"
    timed(d, "full_triton_pwt_ms", lambda: kt.forward(q, k, v, cpwt))
    del q, k, v, st, idx, vbias
    empty()


def morton(shape, grid, density, backends, out, pkgs=("kernels",)):
    """reorder="morton" vs "none" through the public API, on contiguous [B, H, T, D] inputs and as the node calls
    it ([B, L, H*D] memory seen as [B, H, L, D], the output reshaped back to [B, L, H*D]); peak extra memory."""
    B, H, T, D = shape
    q, k, v = (rnd(shape, s) for s in range(3))
    qn, kn, vn = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    d = out.setdefault("morton", {})
    base = torch.cuda.memory_allocated() if DEV == "cuda" else 0
    for pkg in pkgs:
        psa = importlib.import_module(pkg).piecewise_sparse_attention
        tag = "" if pkg == "kernels" else "old_"
        for be in backends:
            for reorder in ("none", "morton"):
                key = f"{tag}{be}_{reorder}"
                kw = dict(density=density, variant="pwt", reorder=reorder, grid=grid if reorder == "morton" else None,
                          backend=be, on_failure="raise")
                timed(d, key + "_ms", lambda: psa(q, k, v, **kw))
                timed(d, key + "_node_layout_ms",
                      lambda: psa(qn, kn, vn, **kw).transpose(1, 2).reshape(B, T, H * D))
                if DEV == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    o = psa(qn, kn, vn, **kw).transpose(1, 2).reshape(B, T, H * D)
                    torch.cuda.synchronize()
                    d[key + "_node_peak_extra_x_q"] = ((torch.cuda.max_memory_allocated() - base - o.numel() * 2)
                                                       / (q.numel() * 2))
                    del o
    say("  morton", d)
    del q, k, v, qn, kn, vn
    empty()


def _median_ms(values):
    """The median of the rounds that were timed (timed() leaves a failure's text instead), or None."""
    ok = [x for x in values if isinstance(x, float)]
    return statistics.median(ok) if ok else None


def _graphs_env(on: bool):
    """PSA_CUDA_GRAPHS for the calls that follow: off times the eager call, on the call through kernels/graphs.py."""
    import os
    os.environ["PSA_CUDA_GRAPHS"] = "1" if on else "0"


def flux_node(density, backends, out):
    """FLUX.1 1024^2 as ComfyUI's override hands it over: [B, H, L, D], 512 text tokens first, a 64 x 64 grid.
    Per backend: the eager call, the call through the CUDA-graph cache (kernels/graphs.py: copy-in, replay, clone)
    and a hand-captured graph of the whole call replayed alone."""
    from kernels import graphs
    from kernels import piecewise_sparse_attention as psa
    shape = (1, 24, 512 + 4096, 128) if DEV == "cuda" else (1, 2, 512 + 256, 64)
    grid = (64, 64) if DEV == "cuda" else (16, 16)
    q, k, v = (rnd(shape, s) for s in range(3))
    d = out.setdefault("flux_node", {})
    timed(d, "sdpa_ms", lambda: F.scaled_dot_product_attention(q, k, v))
    for be in backends:
        kw = dict(density=density, variant="pwt", n_sink_blocks=8, reorder="morton", grid=grid, n_prefix=512,
                  backend=be, on_failure="raise")
        _graphs_env(False)
        timed(d, f"{be}_eager_ms", lambda: psa(q, k, v, **kw))
        if DEV != "cuda":
            continue
        eager = psa(q, k, v, **kw)
        _graphs_env(True)
        graphs.clear()
        empty()
        base, base_res = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        timed(d, f"{be}_graphs_ms", lambda: psa(q, k, v, **kw))
        d[f"{be}_graphs_equal_eager"] = bool(torch.equal(psa(q, k, v, **kw), eager))
        # live bytes of the entry (static q, k, v, output) and, after empty_cache, what stays reserved (+ its pool)
        d[f"{be}_graphs_held_MiB"] = (torch.cuda.memory_allocated() - base) / 2**20
        empty()
        d[f"{be}_graphs_reserved_MiB"] = (torch.cuda.memory_reserved() - base_res) / 2**20
        d[f"{be}_graphs_counts"] = dict(graphs.cache().counts)
        graphs.clear()
        _graphs_env(False)
        try:
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                psa(q, k, v, **kw)
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                o = psa(q, k, v, **kw)
            timed(d, f"{be}_graph_replay_ms", g.replay)
            d[f"{be}_graph_equal_eager"] = bool(torch.equal(o, eager))
        except Exception as e:
            d[f"{be}_graph"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
            say("  graph failed", d[f"{be}_graph"])
        _graphs_env(True)
        # with the [B, L, H*D] the node hands back to ComfyUI: the output in q's layout and then reshaped (a copy,
        # what the node did until session 8), and written token-major (out_layout="bthd": the reshape a view)
        B, H, T, D = q.shape
        graphs.clear()
        for lay in ("q", "bthd"):
            timed(d, f"{be}_graphs_flat_{lay}_ms",
                  lambda: psa(q, k, v, out_layout=lay, **kw).transpose(1, 2).reshape(B, T, H * D))
        graphs.clear()
    sd = lambda: F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(  # noqa: E731
        q.shape[0], q.shape[2], -1)
    timed(d, "sdpa_flat_ms", sd)  # ComfyUI's own optimized attention does the same reshape
    del q, k, v
    empty()


def breakeven(outdir, install=False, rounds=3):
    """The node's sparse call (auto backend, Morton over a square image grid, 512 text tokens first as sink
    blocks) vs dense SDPA, FLUX-like 24 heads: the table nodes/breakeven_<gpu>.json the node's policy reads on
    this GPU model (written to `outdir`; `install`: also into nodes/). Its rows time the call as the node makes
    it (through the CUDA-graph cache where kernels/graphs.py allows); rows_eager the same call with
    PSA_CUDA_GRAPHS=0. Each cell is the median of `rounds` rounds (each a do_bench median), the rounds alternated
    over the cells of one size: one do_bench can catch a slow phase of the machine (session 23, A33: 0.298 ms in
    a cell that three other runs put at 0.157-0.180), and the policy interpolates between neighbouring sizes."""
    from kernels import graphs
    from kernels import piecewise_sparse_attention as psa
    rows, rows_eager = [], []
    sides = (48, 64, 80, 96, 128) if DEV == "cuda" else (8, 12)
    for side in sides:
        T = 512 + side * side
        shape = (1, 24, T, 128) if DEV == "cuda" else (1, 2, T, 64)
        q, k, v = (rnd(shape, s) for s in range(3))
        d, got = {}, {}
        for r in range(rounds):
            tag_r = f"_r{r}" if rounds > 1 else ""
            got.setdefault("dense", []).append(
                timed(d, f"T{T}_sdpa{tag_r}_ms", lambda: F.scaled_dot_product_attention(q, k, v)))
            for density in (0.125, 0.2, 0.3):
                kw = dict(density=density, variant="pwt", n_sink_blocks=8, reorder="morton", grid=(side, side),
                          n_prefix=512)
                for on, tag in ((True, ""), (False, "_eager")):
                    _graphs_env(on)
                    got.setdefault((density, tag), []).append(
                        timed(d, f"T{T}_d{density}{tag}{tag_r}_ms", lambda: psa(q, k, v, **kw)))
                graphs.clear()
        dense = _median_ms(got["dense"])
        for density in (0.125, 0.2, 0.3):
            for tag, dest in (("", rows), ("_eager", rows_eager)):
                t = _median_ms(got[(density, tag)])
                if t is not None and dense is not None:
                    dest.append([T, density, round(t, 4), round(dense, 4)])
        del q, k, v
        empty()
    _graphs_env(True)
    gpu = torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu"
    table = {"gpu": gpu, "date": RES["env"]["date"], "heads": 24, "head_dim": 128,
             "what": "pwt via kernels.piecewise_sparse_attention (backend auto, Morton, 512 text tokens as 8 sink "
                     "blocks; through the CUDA-graph cache up to PSA_CUDA_GRAPH_MAX_TOKENS, rows_eager without it) "
                     "vs F.scaled_dot_product_attention, bf16, median ms (bench/pieces.py --breakeven)",
             "rounds": rounds,
             "rows": rows, "rows_eager": rows_eager}
    RES["breakeven"] = table
    name = f"breakeven_{_policy().gpu_slug(gpu)}.json"  # the file nodes/speed.py looks for on this GPU model
    (outdir / name).write_text(json.dumps(table, indent=1))
    if install and DEV == "cuda":
        (ROOT / "nodes" / name).write_text(json.dumps(table, indent=1))
        say(f"  break-even table installed: nodes/{name}")


def _policy():
    """nodes/policy.py on its own (pure Python; the repository root is no importable package name here)."""
    import importlib.util
    if "psa_nodes_policy" not in sys.modules:
        spec = importlib.util.spec_from_file_location("psa_nodes_policy", ROOT / "nodes" / "policy.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["psa_nodes_policy"] = mod  # before exec: its dataclasses look their module up
        spec.loader.exec_module(mod)
    return sys.modules["psa_nodes_policy"]


def _f(x, nd=3):
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) else "-"


def write_md(res: dict, path: Path) -> None:
    """The per-piece table (ms, bound, % of bound) of every shape, old next to new, and the extra sections."""
    c = res.get("ceilings", {})
    lines = [f"# Every piece of the operator against its bound ({res.get('env', {}).get('gpu', '?')})", "",
             f"{res.get('env', {})}; ceilings measured in the same run: copy {_f(c.get('copy_TBps'), 2)} TB/s "
             f"(read + write), bf16 GEMM {_f(c.get('gemm_bf16_TFLOPs'), 0)} TFLOP/s. B1 D128 bf16, random N(0,1) "
             "inputs, pwt at density 0.125 (FLUX 0.2), band 1; median of triton.testing.do_bench. Bounds: statistics "
             "= one read of the tensors they need + their outputs at the copy rate; routing = its bias rows and "
             "lists written; exact part = the routed tiles' FLOPs at the GEMM rate (and their L2 bytes); virtual = "
             "its FLOPs at the exact part's measured rate.", ""]
    for sname, out in res.get("shapes", {}).items():
        lines += [f"## {sname} {out.get('shape')} density {out.get('density')}", "",
                  "| piece | old ms | new ms | bound ms | new % of bound |", "|---|---|---|---|---|"]
        o, n = out.get("old", {}), out.get("new", {})
        gemm = c.get("gemm_bf16_TFLOPs", 0) or 1

        def row(label, key, bound):
            nv = n.get(key)
            pct = f"{100 * bound / nv:.0f}%" if isinstance(nv, float) and isinstance(bound, float) and nv else "-"
            lines.append(f"| {label} | {_f(o.get(key))} | {_f(nv)} | {_f(bound)} | {pct} |")
        row("statistics (pwt)", "stats_pwt_ms", n.get("stats_pwt_bound_ms"))
        row("statistics (drop)", "stats_drop_ms", n.get("stats_drop_bound_ms"))
        row("routing (pwt)", "routing_pwt_ms", n.get("routing_bound_ms"))
        ex = n.get("exact_tflop")
        ex_b = ex / gemm * 1e3 if isinstance(ex, float) else None
        for be in ("triton", "cute"):
            row(f"exact part = drop attention ({be})", f"attn_{be}_drop_ms", ex_b)
            row(f"pwt attention ({be})", f"attn_{be}_pwt_ms", None)
            vt = n.get("virtual_tflop")
            rate = n.get(f"exact_{be}_TFLOPs")
            row(f"virtual tokens = pwt - drop ({be})", f"virtual_{be}_ms",
                vt / rate * 1e3 if isinstance(vt, float) and isinstance(rate, float) else None)
            if be == "cute":
                row("  of which the virtual tiles in the pwt kernel = pwt - its build without them (cute)",
                    "virtual_cute_in_kernel_ms",
                    vt / rate * 1e3 if isinstance(vt, float) and isinstance(rate, float) else None)
                row("  of which the pwt kernel's exact part over the drop kernel's (cute)",
                    "pwt_exact_over_drop_cute_ms", None)
            row(f"full operator pwt ({be})", f"full_{be}_pwt_ms", None)
            row(f"full operator drop ({be})", f"full_{be}_drop_ms", None)
        for be in ("triton", "cute"):
            if isinstance(n.get(f"exact_{be}_TFLOPs"), float):
                lines.append(f"\nexact part ({be}): {n[f'exact_{be}_TFLOPs']:.0f} TFLOP/s, its routed K/V tiles "
                             f"{n['exact_l2_gb']:.1f} GB from L2 at {n[f'exact_{be}_l2_TBps']:.2f} TB/s")
        for key in ("profile_cute_pwt", "profile_triton_pwt"):
            if isinstance(n.get(key), list):
                lines += ["", f"kernels of one call ({key[8:]}, torch.profiler): " + "; ".join(
                    f"{r[0][:40]} {r[1]:.3f} ms x{r[2]}" for r in n[key])]
                break
        for extra in ("ditlike_morton", "morton", "sweep"):
            if extra in out:
                lines += ["", f"{extra}: " + ", ".join(f"{k} {_f(v)}" for k, v in out[extra].items())]
        lines.append("")
    if "flux_node" in res:
        lines += ["## FLUX.1 1024^2 as the node calls it", "",
                  ", ".join(f"{k} {_f(v) if not isinstance(v, (bool, dict, str)) else v}"
                            for k, v in res["flux_node"].items()), ""]
    if "breakeven" in res:
        lines += [f"## Break-even (nodes/breakeven_{_policy().gpu_slug(res['breakeven']['gpu'])}.json)", "",
                  "| T | density | sparse ms (node: CUDA-graph cache) | eager ms | SDPA ms | ratio |", "|---|---|---|---|---|---|"]
        eager = {(r[0], r[1]): r[2] for r in res["breakeven"].get("rows_eager", [])}
        lines += [f"| {r[0]} | {r[1]} | {r[2]:.3f} | {_f(eager.get((r[0], r[1])))} | {r[3]:.3f} | {r[2] / r[3]:.2f} |"
                  for r in res["breakeven"]["rows"]]
    path.write_text("\n".join(lines) + "\n")


def main(argv=None):
    global REP
    psw.bind(sys.modules[__name__])
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="wan14,wan14_720,wan13,flux")
    ap.add_argument("--backends", default="triton,cute")
    ap.add_argument("--old", default=None, help="folder holding a package kernels_old (the previous kernels)")
    ap.add_argument("--ditlike", action="store_true")
    ap.add_argument("--morton", action="store_true")
    ap.add_argument("--flux-node", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--breakeven", action="store_true")
    ap.add_argument("--install-breakeven", action="store_true",
                    help="with --breakeven: also write the table into nodes/, where the node reads it")
    ap.add_argument("--breakeven-rounds", type=int, default=3,
                    help="with --breakeven: each cell is the median of this many alternated rounds")
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--dry", action="store_true", help="CPU smoke test under TRITON_INTERPRET=1, tiny shapes")
    a = ap.parse_args(argv)
    REP = a.rep
    global DEV, DT
    if a.dry:
        DEV, DT = "cpu", torch.float16
        for key in SHAPES:
            SHAPES[key] = (1, 2, 585, 64) if key != "flux" else (1, 2, 300, 64)
        GRIDS.update({"wan14": (5, 117), "wan13": (5, 117), "wan14_720": (5, 117)})
    outdir = Path(a.out)
    outdir.mkdir(parents=True, exist_ok=True)
    backends = [b for b in a.backends.split(",") if b]
    RES["env"] = {"gpu": torch.cuda.get_device_properties(0).name if DEV == "cuda" else "cpu (dry run)", "torch": torch.__version__, "triton": triton.__version__,
                  "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    try:
        import cutlass
        RES["env"]["cutlass_dsl"] = getattr(cutlass, "__version__", "?")
    except Exception:
        pass
    RES["ceilings"] = ceilings()
    bw = RES["ceilings"]["copy_TBps"] * 1e3  # GB/s
    pkgs = ["kernels"]
    if a.old:
        sys.path.insert(0, a.old)
        pkgs.append("kernels_old")
    for sname in [s for s in a.shapes.split(",") if s]:
        shape = SHAPES[sname]
        density = 0.2 if sname == "flux" else 0.125
        q, k, v = (rnd(shape, s) for s in range(3))
        out = RES["shapes"].setdefault(sname, {"shape": list(shape), "density": density})
        say(f"=== {sname} {shape} density {density}")
        for pkg in pkgs:
            try:
                pieces("new" if pkg == "kernels" else "old", pkg, backends, q, k, v, density, bw, out)
            except Exception:
                out[pkg + "_error"] = traceback.format_exc()
                traceback.print_exc()
        if a.sweep and sname in ("wan14", "wan14_720", "flux"):
            try:
                psw.sweep(q, k, v, density, out)
            except Exception:
                out["sweep_error"] = traceback.format_exc()
                traceback.print_exc()
        del q, k, v
        empty()
        try:
            if a.ditlike and sname in ("wan14", "wan13"):
                ditlike(shape, GRIDS[sname], density, backends, out)
            if a.morton and sname != "flux":
                morton(shape, GRIDS[sname], density, backends, out, pkgs)
        except Exception:
            out["extra_error"] = traceback.format_exc()
            traceback.print_exc()
        (outdir / "pieces.json").write_text(json.dumps(RES, indent=1, default=str))
    if a.breakeven:
        try:
            breakeven(outdir, install=a.install_breakeven, rounds=max(1, a.breakeven_rounds))
        except Exception:
            RES["breakeven_error"] = traceback.format_exc()
            traceback.print_exc()
    if a.flux_node:
        try:
            flux_node(0.2, backends, RES)
        except Exception:
            RES["flux_node_error"] = traceback.format_exc()
            traceback.print_exc()
    (outdir / "pieces.json").write_text(json.dumps(RES, indent=1, default=str))
    try:
        write_md(RES, outdir / "pieces.md")
    except Exception:
        traceback.print_exc()
    print("\nshape     pkg  stats(pwt/drop)  routing  attn_tri(drop/pwt)  attn_cute(drop/pwt)  full(tri/cute)")
    for sname, out in RES["shapes"].items():
        for lab in ("old", "new"):
            d = out.get(lab)
            if not d:
                continue

            def f(key):
                x = d.get(key)
                return f"{x:.3f}" if isinstance(x, float) else "-"
            print(f"{sname:9s} {lab}  {f('stats_pwt_ms')}/{f('stats_drop_ms')}  {f('routing_pwt_ms')}  "
                  f"{f('attn_triton_drop_ms')}/{f('attn_triton_pwt_ms')}  {f('attn_cute_drop_ms')}/"
                  f"{f('attn_cute_pwt_ms')}  {f('full_triton_pwt_ms')}/{f('full_cute_pwt_ms')}")


if __name__ == "__main__":
    main()
