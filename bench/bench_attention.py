"""Triton backend on the GPU: correctness at real sizes, tile sweep, time vs density and vs T, breakdown,
peak memory, torch.compile, Morton reorder; peers (cuDNN SDPA, FA4, official PISA, Sol-Attn) when present.

    python bench/bench_attention.py --out DIR [--sections check,sweep,density,web,tokens,flux,reorder,compile,peers,plot]

Writes DIR/results.json, DIR/results.md (tables), DIR/speedup_h200.json and DIR/bench_h200.png. The method
is in bench/README.md. Shapes are named by value: B1_H40_T32760_D128 = batch 1, 40 heads, 32760 tokens,
head_dim 128. Timings: median of triton.testing.do_bench (CUDA events), random bf16 inputs unless said.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from kernels import reference  # noqa: E402
from kernels import triton as kt  # noqa: E402
from kernels.config import SparseConfig  # noqa: E402
from kernels.routing import block_stats, route  # noqa: E402
from kernels.triton import fwd as ktf  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402

logging.basicConfig(level=logging.INFO, format="%(message)s")
RES: dict = {"sections": {}}
DEV = "cuda"
WAN14 = (1, 40, 32760, 128)
WAN13 = (1, 12, 32760, 128)
FLUX = (1, 24, 4608, 128)
WAN720 = (1, 40, 75600, 128)
DENSITIES = [0.05, 0.1, 0.125, 0.2, 0.25, 0.4, 0.6, 0.8, 1.0]
TOKENS = [4096, 8192, 16384, 32760, 75600]


def name(shape):
    B, H, T, D = shape
    return f"B{B}_H{H}_T{T}_D{D}"


def rnd(shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, device=DEV, dtype=torch.float32, generator=g).to(dtype)


def qkv(shape, dtype=torch.bfloat16, seed=0):
    return tuple(rnd(shape, dtype, seed + i) for i in range(3))


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def ms(fn, rep=200):
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def event_ms(fn, n=10):
    """Mean ms of n back-to-back calls between two CUDA events, one call outside the timing (no L2 flush
    between calls, unlike ms()): the protocol of bench/cute_check.py and bench/probes/."""
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / n


def cfg_of(D, density, variant, band=1, sinks=0, cov=False):
    return SparseConfig(density=density, variant=variant, band=band, n_sink_blocks=sinks, cov_bias=cov,
                        block_size=64, scale=D ** -0.5)


def sdpa_cudnn(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v)


def sdpa_flash(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v)


def section(fn):
    def run(*a, **kw):
        t0 = time.time()
        print(f"\n=== {fn.__name__} ===", flush=True)
        try:
            fn(*a, **kw)
        except Exception:
            tb = traceback.format_exc()
            print(tb, flush=True)
            RES["sections"].setdefault(fn.__name__, {})["error"] = tb
        print(f"--- {fn.__name__}: {time.time() - t0:.1f} s", flush=True)
        torch.cuda.empty_cache()
    return run


def env():
    p = torch.cuda.get_device_properties(0)
    RES["env"] = {
        "gpu": p.name, "sm": f"{p.major}.{p.minor}", "n_sm": p.multi_processor_count,
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    print(RES["env"], flush=True)


@section
def check():
    """bf16 kernel vs the float64 reference under identical routing, real sizes; density 1 vs SDPA."""
    from kernels.synthetic import dit_like_qkv
    rows = []

    def one(label, q, k, v, cfg):
        q64, k64, v64 = q.double(), k.double(), v.double()
        st = block_stats(q64, k64, v64, 64, need_hnorm=cfg.cov_bias)
        r = route(st, cfg)
        ref = reference.forward(q64, k64, v64, cfg, routing=r, stats=st)
        out = kt.forward_with_routing(q, k, v, cfg, r)
        e_same = rel(out, ref)
        # own stats + own routing (the production path) vs the float64 reference with its own routing
        own = kt.forward(q, k, v, cfg)
        _, idx, _ = kt.prepare(q, k, v, cfg)
        agree = (idx.long() == r.idx.long()).all(-1).float().mean().item()
        e_own = rel(own, ref)
        # PyTorch's own bf16 error on the same problem: the reference run on the bf16 tensors (float32 math)
        ref_bf = reference.forward(q, k, v, cfg, routing=r)
        e_torch = rel(ref_bf, ref)
        finite = bool(torch.isfinite(out).all() and torch.isfinite(own).all())
        row = dict(case=label, variant=cfg.variant, density=cfg.density, rel_same_routing=e_same,
                   rel_own_routing=e_own, routing_rows_equal=agree, torch_bf16_rel=e_torch, finite=finite,
                   ok=finite and e_same <= 3e-3)
        rows.append(row)
        print(row, flush=True)
        del ref, out, own, ref_bf

    for variant in ("pwt", "pisa", "drop"):
        q, k, v = qkv((1, 2, 32760, 128), seed=1)
        one("random B1_H2_T32760_D128", q, k, v, cfg_of(128, 0.125, variant))
    q, k, v = qkv((2, 2, 4999, 128), seed=2)
    one("random B2_H2_T4999_D128", q, k, v, cfg_of(128, 0.2, "pwt", band=2, sinks=1))
    q, k, v = qkv((2, 2, 4999, 128), seed=2)
    one("random B2_H2_T4999_D128 cov_bias", q, k, v, cfg_of(128, 0.2, "pisa", cov=True))
    q, k, v = qkv((1, 2, 50, 64), seed=3)
    one("random B1_H2_T50_D64", q, k, v, cfg_of(64, 0.5, "pwt"))
    q, k, v = qkv((1, 3, 3000, 64), torch.float16, seed=4)
    one("random fp16 B1_H3_T3000_D64", q, k, v, cfg_of(64, 0.15, "pwt"))
    try:
        q, k, v = dit_like_qkv((21, 30, 52), heads=2, head_dim=128, dtype=torch.bfloat16, device=DEV)
        for variant in ("pwt", "drop"):
            one("dit_like B1_H2_T32760_D128 (raster)", q, k, v, cfg_of(128, 0.125, variant))
    except Exception:
        traceback.print_exc()
    # density 1 == dense
    for shape in [(1, 2, 32760, 128), (2, 2, 4999, 64), (1, 2, 50, 128)]:
        q, k, v = qkv(shape, seed=5)
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        sd = F.scaled_dot_product_attention(q, k, v)
        for variant in ("pwt", "pisa", "drop"):
            out = kt.forward(q, k, v, cfg_of(shape[-1], 1.0, variant))
            row = dict(case=f"density1 {name(shape)}", variant=variant, rel_vs_sdpa_bf16=rel(out, sd),
                       rel_vs_fp64=rel(out, ref), sdpa_rel_vs_fp64=rel(sd, ref))
            row["ok"] = row["rel_vs_fp64"] <= 2 * row["sdpa_rel_vs_fp64"] + 1e-4
            rows.append(row)
            print(row, flush=True)
    RES["sections"]["check"] = {"rows": rows}


@section
def sweep():
    """Tile configs of the attention kernel alone (routing precomputed) at the Wan2.1-14B shape."""
    q, k, v = qkv(WAN14)
    rows = []
    for variant in ("pwt",):
        cfg = cfg_of(128, 0.125, variant)
        st, idx, vbias = kt.prepare(q, k, v, cfg)
        out = torch.empty_like(q)
        for c in ktf._configs(True) + [triton.Config({"BLOCK_N": 128, "BLOCK_V": 64, "USE_TMA": False},
                                                     num_warps=4, num_stages=3)]:
            conf = dict(BLOCK_N=c.kwargs["BLOCK_N"], BLOCK_V=c.kwargs["BLOCK_V"], USE_TMA=c.kwargs["USE_TMA"],
                        num_warps=c.num_warps, num_stages=c.num_stages)
            try:
                t = ms(lambda: ktf.attention(q, k, v, out, st, idx, vbias, cfg, config=conf), rep=100)
            except Exception as e:
                t = float("nan")
                print("config failed", conf, type(e).__name__, str(e)[:200])
            rows.append(dict(variant=variant, **conf, ms=t))
            print(rows[-1], flush=True)
    cfg = cfg_of(128, 0.125, "pwt")
    st, _, _ = kt.prepare(q, k, v, cfg)
    rows.append(dict(route_kernel_ms=ms(lambda: kts.route(st, cfg, q.dtype)),
                     route_torch_ms=ms(lambda: kts.route_torch(st, cfg, q.dtype))))
    print(rows[-1], flush=True)
    RES["sections"]["sweep"] = {"shape": name(WAN14), "density": 0.125, "rows": rows}


def breakdown(q, k, v, cfg):
    """ms of: statistics, routing, attention (autotuned), whole forward; all heads at once (no chunking)."""
    st, idx, vbias = kt.prepare(q, k, v, cfg)
    out = torch.empty_like(q)
    t_stats = ms(lambda: kts.block_stats(q, k, v, cfg))
    t_stats_noh = ms(lambda: kts.block_stats(q, k, v, cfg, need_h=False))
    t_route = ms(lambda: kts.route(st, cfg, q.dtype))
    ktf.attention(q, k, v, out, st, idx, vbias, cfg)
    t_attn = ms(lambda: ktf.attention(q, k, v, out, st, idx, vbias, cfg))
    return dict(stats_ms=t_stats, stats_without_hbar_ms=t_stats_noh, route_ms=t_route, attn_ms=t_attn,
                K=idx.shape[-1], tma=ktf._tma_ok(q.device))


def peak_scratch(fn, q):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base - out.numel() * out.element_size()
    return peak / (q.numel() * q.element_size())


@section
def density():
    q, k, v = qkv(WAN14)
    rows = []
    t_cudnn = ms(lambda: sdpa_cudnn(q, k, v))
    t_flash = ms(lambda: sdpa_flash(q, k, v))
    RES["sections"]["density"] = {"shape": name(WAN14), "sdpa_cudnn_ms": t_cudnn, "sdpa_flash_ms": t_flash,
                                  "rows": rows}
    print(dict(sdpa_cudnn_ms=t_cudnn, sdpa_flash_ms=t_flash), flush=True)
    for d in DENSITIES:
        for variant in ("pwt", "pisa", "drop"):
            cfg = cfg_of(128, d, variant)
            t = ms(lambda: kt.forward(q, k, v, cfg))
            row = dict(variant=variant, density=d, ms=t, speedup_vs_cudnn=t_cudnn / t)
            if d in (0.125, 0.25) or variant == "pwt":
                row["scratch_frac_of_q"] = peak_scratch(lambda: kt.forward(q, k, v, cfg), q)
            if d == 0.125:
                row.update(breakdown(q, k, v, cfg))
                os.environ["PSA_TRITON_SCRATCH"] = "0"
                row["ms_unchunked"] = ms(lambda: kt.forward(q, k, v, cfg))
                row["scratch_frac_unchunked"] = peak_scratch(lambda: kt.forward(q, k, v, cfg), q)
                del os.environ["PSA_TRITON_SCRATCH"]
            rows.append(row)
            print(row, flush=True)


@section
def web():
    """The node's estimated speed-up curve (web/js/speedup_h200.json): pwt through the public API as the node calls
    it at Wan2.1-14B 480p (backend auto, Morton over the 21 x 30 x 52 latent grid, ComfyUI's [B, L, H*D] memory
    seen as [B, H, L, D]) per density, against cuDNN SDPA on contiguous [B, H, T, D]."""
    from kernels import piecewise_sparse_attention as psa
    B, H, T, D = WAN14
    grid = (21, 30, 52)
    q, k, v = qkv(WAN14)
    t_cudnn = ms(lambda: sdpa_cudnn(q, k, v))
    qn, kn, vn = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))  # [B, T, H, D] memory
    del q, k, v
    rows = []
    RES["sections"]["web"] = {"shape": name(WAN14), "sdpa_cudnn_ms": t_cudnn, "grid": list(grid), "rows": rows}
    for d in DENSITIES:
        t = ms(lambda: psa(qn, kn, vn, density=d, variant="pwt", reorder="morton", grid=grid))
        rows.append(dict(density=d, ms=t, speedup_vs_cudnn=t_cudnn / t))
        print(rows[-1], flush=True)


@section
def tokens():
    rows = []
    for T in TOKENS:
        shape = (1, 40, T, 128)
        q, k, v = qkv(shape)
        row = dict(shape=name(shape), T=T, sdpa_cudnn_ms=ms(lambda: sdpa_cudnn(q, k, v), rep=100))
        for variant in ("pwt", "pisa", "drop"):
            row[f"{variant}_ms"] = ms(lambda: kt.forward(q, k, v, cfg_of(128, 0.125, variant)), rep=100)
        row["pwt_scratch_frac_of_q"] = peak_scratch(lambda: kt.forward(q, k, v, cfg_of(128, 0.125, "pwt")), q)
        rows.append(row)
        print(row, flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    RES["sections"]["tokens"] = {"density": 0.125, "rows": rows}


@section
def flux():
    rows = []
    for shape in (FLUX, WAN13):
        q, k, v = qkv(shape)
        row = dict(shape=name(shape), sdpa_cudnn_ms=ms(lambda: sdpa_cudnn(q, k, v)))
        for d in (0.125, 0.2, 0.25):
            for variant in ("pwt", "pisa", "drop"):
                row[f"{variant}_{d}_ms"] = ms(lambda: kt.forward(q, k, v, cfg_of(128, d, variant)))
        rows.append(row)
        print(row, flush=True)
    RES["sections"]["flux"] = {"rows": rows}


@section
def reorder():
    from kernels.reorder import apply_reorder, orders_on
    q, k, v = qkv(WAN14)
    grid = (21, 30, 52)
    perm, inv = orders_on(grid, DEV)
    cfg = cfg_of(128, 0.125, "pwt")
    ref_g = apply_reorder(q, perm, 0)
    g = kt.gather_tokens(q, perm, 0)
    s = kt.scatter_tokens(g, perm, 0)
    row = dict(gather_equal=bool(torch.equal(g, ref_g)), scatter_roundtrip=bool(torch.equal(s, q)))
    row["gather_ms"] = ms(lambda: kt.gather_tokens(q, perm, 0))
    row["torch_index_select_ms"] = ms(lambda: apply_reorder(q, perm, 0))
    row["attn_ms"] = ms(lambda: kt.forward(q, k, v, cfg))
    row["fused_perm_ms"] = ms(lambda: kt.forward(q, k, v, cfg, perm=perm))
    # separate passes: 3 gathers in, 1 scatter out
    row["separate_passes_overhead_frac"] = 4 * row["gather_ms"] / row["attn_ms"]
    row["fused_overhead_frac"] = row["fused_perm_ms"] / row["attn_ms"] - 1
    # fused result equals gather -> attention -> scatter
    a = kt.forward(q, k, v, cfg, perm=perm)
    b = kt.scatter_tokens(kt.forward(*(kt.gather_tokens(x, perm, 0) for x in (q, k, v)), cfg), perm, 0)
    row["fused_vs_separate_rel"] = rel(a, b)
    RES["sections"]["reorder"] = row
    print(row, flush=True)


@section
def compile_check():
    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(128, 128, dtype=torch.bfloat16, device=DEV)

        def forward(self, x):
            qh = self.proj(x)
            cfg = cfg_of(128, 0.25, "pwt")
            return kt.forward(qh, qh, x, cfg) * 2

    m = Attn()
    x = rnd((1, 2, 1000, 128))
    explain = torch._dynamo.explain(m)(x)
    cm = torch.compile(m, fullgraph=True)
    y = cm(x)
    e = m(x)
    row = dict(graph_break_count=explain.graph_break_count, graph_count=explain.graph_count,
               fullgraph_ok=True, rel_compiled_vs_eager=rel(y, e))
    RES["sections"]["compile"] = row
    print(row, flush=True)


@section
def peers():
    """The peers at the ANCHORS.md shapes, a bounded list (the official kernel recompiles and autotunes for
    every sequence length and density, ~30 s each, so it is not swept over every density)."""
    import peers as P  # bench/peers.py (FA4, official PISA, Sol-Attn; wheels carried to the device)
    res = {"versions": P.versions()}
    RES["sections"]["peers"] = res
    q, k, v = qkv(WAN14)
    res["fa4_dense_ms"] = P.time_fa4_dense(q, k, v, ms=ms)
    for key, fn in (("fa4_blocksparse", lambda d: P.time_fa4_blocksparse(q, k, v, d, ms=ms)),
                    ("official_pisa", lambda d: P.time_official_pisa(q, k, v, d, ms=ms)),
                    ("sol_attn", lambda d: P.time_sol_attn(q, k, v, topk_ratio=d, ms=ms))):
        raw = {d: fn(d) for d in ((0.125, 0.25, 0.5) if key == "fa4_blocksparse" else (0.125, 0.25))}
        res[key + "_raw"] = raw
        res[key] = [[d, t] for d, t in raw.items() if isinstance(t, float)]
        print(key, raw, flush=True)
    res["sol_attn_tau_default_ms"] = P.time_sol_attn(q, k, v, ms=ms)
    del q, k, v
    torch.cuda.empty_cache()
    rows = {}
    for shape, ds in ((FLUX, (0.2,)), (WAN13, (0.125,))):
        q, k, v = qkv(shape)
        row = {"fa4_dense_ms": P.time_fa4_dense(q, k, v, ms=ms)}
        for d in ds:
            row[f"fa4_bs_{d}"] = P.time_fa4_blocksparse(q, k, v, d, ms=ms)
            row[f"official_pisa_{d}"] = P.time_official_pisa(q, k, v, d, ms=ms)
            row[f"sol_topk_{d}"] = P.time_sol_attn(q, k, v, topk_ratio=d, ms=ms)
            row[f"ours_pwt_{d}"] = ms(lambda: kt.forward(q, k, v, cfg_of(128, d, "pwt")))
        rows[name(shape)] = row
        print(name(shape), row, flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    for T in TOKENS:
        q, k, v = qkv((1, 40, T, 128))
        rows.setdefault("fa4_dense_by_T", {})[T] = P.time_fa4_dense(q, k, v, ms=ms)
        del q, k, v
    print("fa4 dense by T", rows.get("fa4_dense_by_T"), flush=True)
    res["shapes"] = rows


@section
def plot(out: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    d = RES["sections"].get("density", {})
    ax = axes[0]
    for variant, st in (("pwt", "o-"), ("pisa", "s--"), ("drop", "^:")):
        pts = [(r["density"], r["ms"]) for r in d.get("rows", []) if r["variant"] == variant]
        if pts:
            ax.plot(*zip(*pts), st, label=f"ours {variant} (Triton)")
    if "sdpa_cudnn_ms" in d:
        ax.axhline(d["sdpa_cudnn_ms"], color="k", lw=1, label="cuDNN SDPA (dense)")
    pr = RES["sections"].get("peers", {})
    for key, lab, st in (("fa4_dense_ms", "FA4 dense", "-."),):
        if isinstance(pr.get(key), (int, float)):
            ax.axhline(pr[key], color="gray", ls=st, lw=1, label=lab)
    for key, lab, st in (("fa4_blocksparse", "FA4 block-sparse", "x-"), ("official_pisa", "official PISA", "d-"),
                         ("sol_attn", "Sol-Attn", "v-")):
        pts = pr.get(key)
        if isinstance(pts, list) and pts:
            ax.plot(*zip(*pts), st, label=lab)
    ax.set_xlabel("density (exact fraction of KV blocks)")
    ax.set_ylabel("ms (forward, routing included)")
    ax.set_title(f"{d.get('shape', '')} bf16, {RES['env']['gpu']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1]
    tk = RES["sections"].get("tokens", {}).get("rows", [])
    if tk:
        T = [r["T"] for r in tk]
        ax.loglog(T, [r["sdpa_cudnn_ms"] for r in tk], "k-", label="cuDNN SDPA (dense)")
        for variant, st in (("pwt", "o-"), ("pisa", "s--"), ("drop", "^:")):
            ax.loglog(T, [r[f"{variant}_ms"] for r in tk], st, label=f"ours {variant} d=0.125")
    ax.set_xlabel("tokens T (B1 H40 D128)")
    ax.set_ylabel("ms")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "bench_h200.png", dpi=110)


def write(out: Path):
    (out / "results.json").write_text(json.dumps(RES, indent=1, default=str))
    d = RES["sections"].get("density", {})
    w = RES["sections"].get("web", {})
    if w.get("rows"):  # the node's call (section web) when measured, else the Triton backend's raster call
        pts = [[r["density"], round(w["sdpa_cudnn_ms"] / r["ms"], 3)] for r in w["rows"]]
        what = "the public API as the node calls it: backend auto, Morton, node layout"
    else:
        pts = [[r["density"], round(d["sdpa_cudnn_ms"] / r["ms"], 3)] for r in d.get("rows", [])
               if r["variant"] == "pwt" and "sdpa_cudnn_ms" in d]
        what = "the Triton backend, raster [B, H, T, D]"
    if pts:
        web = {"gpu": RES["env"]["gpu"], "date": RES["env"]["date"][:10], "shape": (w or d)["shape"],
               "variant": "pwt", "baseline": "cuDNN SDPA", "what": what, "points": pts}
        (out / "speedup_h200.json").write_text(json.dumps(web, indent=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--sections", default="check,sweep,density,web,tokens,flux,reorder,compile,peers,plot")
    ap.add_argument("--peers-json", default=None, help="take the peers section from an earlier results.json")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env()
    if a.peers_json:
        RES["sections"]["peers"] = json.loads(Path(a.peers_json).read_text())["sections"]["peers"]
        RES["sections"]["peers"]["from"] = a.peers_json
    secs = a.sections.split(",")
    for s in secs:
        if s == "plot":
            plot(out)
        elif s == "compile":
            compile_check()
        else:
            globals()[s]()
        write(out)
    print("\n=== summary ===")
    print(json.dumps({k: (v if k != "check" else [
        {kk: (round(vv, 6) if isinstance(vv, float) else vv) for kk, vv in r.items()} for r in v.get("rows", [])])
        for k, v in RES["sections"].items() if k in ("check",)}, default=str)[:6000])


if __name__ == "__main__":
    main()
