"""Peer attention kernels, timed on the same q, k, v as ours (issue 3, item 7).

Every ``time_*`` function takes q, k, v as bf16 ``[B, H, T, D]`` CUDA tensors and returns either the median
forward time in milliseconds (``triton.testing.do_bench``, CUDA events) or a string that starts with
``"unavailable: "`` (the peer could not be imported or does not take this input) or ``"failed: "`` (it was
imported but raised). Layout changes each peer needs (FA4 and Sol-Attn take ``[B, T, H, D]``) happen once,
outside the timed region, so only the peer's own call is timed; routing a peer does inside that call (official
PISA's block scoring and top-k, Sol-Attn's selection) is timed, as a user would pay it.

Peers (none is a dependency of the pack; on the H200 they arrive as carried wheels, see
bench/install_on_device.sh):
  * cuDNN SDPA: ``torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)``.
  * FA4 dense: ``flash_attn.cute.flash_attn_func`` (package flash-attn-4, CuTe-DSL).
  * FA4 block-sparse: the same call with ``block_sparse_tensors``: 128x128 blocks, for every (b, h, q-block)
    exactly ``round(fraction * n_kv_blocks)`` KV blocks chosen at random, all passed as *full* blocks (no
    mask_mod, no routing, no approximation), i.e. the ceiling for an exact branch alone.
  * official PISA: ``piecewise_sparse_attention(q, k, v, density)`` from the single Triton file of
    xie-lab-ml/piecewise-sparse-attention, loaded from ``--pisa-dir`` (never part of this repo).
  * Sol-Attn: ``comfy_kitchen.sol_attn`` (comfy-kitchen, the int8 kernel behind ComfyUI's core sparse node),
    with ``topk_ratio`` (SLA-style top-k) or with the threshold ``tau`` at its default.

    python bench/peers.py --out peers.json [--shapes flux,wan13] [--pisa-dir DIR]
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PISA_DIR = Path(os.environ.get("PISA_OFFICIAL_DIR", ROOT / ".carry" / "pisa_official"))
PISA_FILE = "piecewise_sparse_attn_tma.py"

# ANCHORS.md shapes: (B, H, T, D)
SHAPES = {
    "wan14": (1, 40, 32760, 128),   # Wan2.1-14B 480p 81 frames
    "wan13": (1, 12, 32760, 128),   # Wan2.1-1.3B 480p 81 frames
    "flux": (1, 24, 4608, 128),     # FLUX.1 1024x1024
    "wan14_720": (1, 40, 75600, 128),  # Wan2.1-14B 720p 81 frames: dense peers only (ANCHORS)
}
DENSE_ONLY = {"wan14_720"}
SOL_DEFAULT_TAU = 1.0  # comfy_kitchen.sol_attn's default threshold

_ERRORS: dict[str, str] = {}   # first import error per peer, so a missing peer is reported once and cheaply


def shape_name(shape) -> str:
    B, H, T, D = shape
    return f"B{B}_H{H}_T{T}_D{D}"


def default_ms(fn, rep: int = 100) -> float:
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def _short(e: BaseException, n: int = 300) -> str:
    s = f"{type(e).__name__}: {e}".replace("\n", " ")
    return s if len(s) <= n else s[: n - 3] + "..."


def _check(q, k, v):
    if not (q.is_cuda and q.dim() == 4 and q.shape == k.shape == v.shape):
        raise ValueError(f"expected q, k, v of one shape [B, H, T, D] on CUDA, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")


def _bthd(*xs):
    return tuple(x.transpose(1, 2).contiguous() for x in xs)


def _timed(name: str, importer, runner, ms):
    """Import (cached failure), then time; never raises."""
    if name in _ERRORS:
        return _ERRORS[name]
    try:
        mod = importer()
    except Exception as e:  # missing wheel, wrong CUDA, ...
        _ERRORS[name] = f"unavailable: {_short(e)}"
        return _ERRORS[name]
    try:
        fn = runner(mod)
        fn()  # first call: compile / autotune, outside the timing
        torch.cuda.synchronize()
        return (ms or default_ms)(fn)
    except Exception as e:
        traceback.print_exc()
        return f"failed: {_short(e)}"


# ----------------------------------------------------------------------------------------------------- cuDNN
def sdpa_cudnn(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v)


def time_sdpa_cudnn(q, k, v, ms=None):
    _check(q, k, v)

    def importer():
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
        return None

    return _timed("sdpa_cudnn", importer, lambda _: (lambda: sdpa_cudnn(q, k, v)), ms)


# ------------------------------------------------------------------------------------------------------- FA4
def _import_fa4():
    from flash_attn.cute import flash_attn_func
    return flash_attn_func


def _fa4_out(res):
    return res[0] if isinstance(res, tuple) else res


def time_fa4_dense(q, k, v, ms=None):
    _check(q, k, v)
    qt, kt, vt = _bthd(q, k, v)
    return _timed("fa4", _import_fa4, lambda f: (lambda: f(qt, kt, vt)), ms)


def fa4_block_mask(B, H, T, fraction, block=128, seed=0, device="cuda"):
    """A random block mask with exactly ``round(fraction * n)`` of the n KV blocks per (b, h, q-block), as FA4's
    BlockSparseTensorsTorch (all blocks 'full': computed without a mask_mod). Returns (tensors, exact_fraction)."""
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    nm = n = math.ceil(T / block)
    kk = max(1, min(n, round(fraction * n)))
    g = torch.Generator(device=device).manual_seed(seed)
    idx = torch.rand(B, H, nm, n, device=device, generator=g).argsort(dim=-1)[..., :kk]
    idx = idx.sort(dim=-1).values.to(torch.int32).contiguous()
    full_cnt = torch.full((B, H, nm), kk, dtype=torch.int32, device=device)
    mask_cnt = torch.zeros((B, H, nm), dtype=torch.int32, device=device)
    mask_idx = torch.zeros((B, H, nm, 1), dtype=torch.int32, device=device)
    bst = BlockSparseTensorsTorch(mask_block_cnt=mask_cnt, mask_block_idx=mask_idx, full_block_cnt=full_cnt,
                                  full_block_idx=idx, block_size=(block, block))
    return bst, kk / n


def time_fa4_blocksparse(q, k, v, fraction, block=128, seed=0, ms=None):
    """FA4 with a random 128x128 block mask at exactly ``fraction`` (rounded to whole blocks per q-block row)."""
    _check(q, k, v)
    B, H, T, _ = q.shape
    qt, kt, vt = _bthd(q, k, v)

    def runner(f):
        bst, _ = fa4_block_mask(B, H, T, fraction, block, seed, q.device)
        return lambda: f(qt, kt, vt, block_sparse_tensors=bst)

    return _timed("fa4", _import_fa4, runner, ms)


# ----------------------------------------------------------------------------------------------- official PISA
_PISA = {}


def _triton_allocator(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def load_official_pisa(pisa_dir=None):
    """Load ``piecewise_sparse_attention`` from the carried copy of the official kernel file (not in this repo).
    Its kernel builds TMA descriptors inside the kernel, which needs a Triton global-scratch allocator."""
    d = Path(pisa_dir or DEFAULT_PISA_DIR)
    if str(d) in _PISA:
        return _PISA[str(d)]
    path = d / PISA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (carry the official kernel file there, or pass --pisa-dir)")
    import triton
    triton.set_allocator(_triton_allocator)
    spec = importlib.util.spec_from_file_location("pisa_official_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _PISA[str(d)] = mod.piecewise_sparse_attention
    return _PISA[str(d)]


def time_official_pisa(q, k, v, density, use_bias=False, pisa_dir=None, ms=None):
    """Official PISA at ``density`` (its block_size 64; top_k = int(density * n_blocks)); its routing included."""
    _check(q, k, v)
    qc, kc, vc = (x.contiguous() for x in (q, k, v))
    return _timed("official_pisa", lambda: load_official_pisa(pisa_dir),
                  lambda f: (lambda: f(qc, kc, vc, density=density, block_size=64, use_bias=use_bias)), ms)


# --------------------------------------------------------------------------------------------------- Sol-Attn
def _import_sol():
    import comfy_kitchen as ck
    if not ck.sol_attn_is_available(torch.device("cuda")):
        raise RuntimeError("comfy_kitchen.sol_attn_is_available() is False on this GPU/build")
    return ck.sol_attn


def time_sol_attn(q, k, v, topk_ratio=None, tau=SOL_DEFAULT_TAU, ms=None):
    """Sol-Attn: ``topk_ratio`` > 0 keeps that fraction of 64-token KV blocks per query block (tau ignored);
    ``topk_ratio=None`` routes by the threshold ``tau`` (default 1.0, the package default). head_dim 128 only."""
    _check(q, k, v)
    if q.shape[-1] != 128:
        return "unavailable: Sol-Attn takes head_dim 128 only"
    qt, kt, vt = _bthd(q, k, v)
    kw = dict(topk_ratio=float(topk_ratio)) if topk_ratio else dict(tau=float(tau))
    return _timed("sol_attn", _import_sol, lambda f: (lambda: f(qt, kt, vt, **kw)), ms)


# ------------------------------------------------------------------------------------------------ correctness
def _rel(a, b) -> float:
    return float(((a.float() - b.float()).norm() / b.float().norm()).item())


def sanity(q, k, v, fraction=0.125, pisa_dir=None) -> dict:
    """Relative L2 errors that show each peer computes attention on these inputs (small T only: the masked
    reference materialises a T x T mask). Random inputs, so sparse peers differ from dense by design except
    FA4 block-sparse (vs SDPA with the same block mask) and PISA at density 1.0 (vs dense)."""
    out = {}
    B, H, T, D = q.shape
    ref = F.scaled_dot_product_attention(q, k, v)
    qt, kt, vt = _bthd(q, k, v)
    try:
        f = _import_fa4()
        out["fa4_dense_vs_sdpa"] = _rel(_fa4_out(f(qt, kt, vt)).transpose(1, 2), ref)
        bst, _ = fa4_block_mask(B, H, T, fraction, 128, 0, q.device)
        blk = torch.zeros(B, H, math.ceil(T / 128), math.ceil(T / 128), dtype=torch.bool, device=q.device)
        blk.scatter_(-1, bst.full_block_idx.long(), True)
        mask = blk.repeat_interleave(128, -2).repeat_interleave(128, -1)[..., :T, :T]
        ref_m = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out["fa4_blocksparse_vs_masked_sdpa"] = _rel(_fa4_out(f(qt, kt, vt, block_sparse_tensors=bst))
                                                     .transpose(1, 2), ref_m)
        del mask, blk, ref_m
    except Exception as e:
        out["fa4"] = f"failed: {_short(e)}"
    try:
        p = load_official_pisa(pisa_dir)
        out["official_pisa_d1_vs_sdpa"] = _rel(p(q.contiguous(), k.contiguous(), v.contiguous(), density=1.0), ref)
        out["official_pisa_d0.125_vs_sdpa"] = _rel(p(q.contiguous(), k.contiguous(), v.contiguous(),
                                                     density=0.125), ref)
    except Exception as e:
        out["official_pisa"] = f"failed: {_short(e)}"
    if D == 128:
        try:
            s = _import_sol()
            out["sol_attn_tau1_vs_sdpa"] = _rel(s(qt, kt, vt, tau=SOL_DEFAULT_TAU).transpose(1, 2), ref)
            out["sol_attn_topk0.125_vs_sdpa"] = _rel(s(qt, kt, vt, topk_ratio=0.125).transpose(1, 2), ref)
        except Exception as e:
            out["sol_attn"] = f"failed: {_short(e)}"
    return out


# -------------------------------------------------------------------------------------------------- drivers
def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    v = {"torch": torch.__version__, "cuda": torch.version.cuda,
         "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
    for pkg in ("triton", "flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu13", "quack-kernels",
                "apache-tvm-ffi", "comfy-kitchen"):
        try:
            v[pkg] = version(pkg)
        except PackageNotFoundError:
            v[pkg] = None
    c = DEFAULT_PISA_DIR / "COMMIT"
    v["official_pisa_commit"] = c.read_text().strip() if c.is_file() else None
    if torch.cuda.is_available():
        v["gpu"] = torch.cuda.get_device_name()
    return v


def shape_row(q, k, v, fractions=(0.125,), pisa_densities=(0.125,), sol_topk=(0.125,), sol_tau=True,
              dense_only=False, ms=None, pisa_dir=None) -> dict:
    """All peers at one shape. Keys: sdpa_cudnn, fa4_dense, fa4_bs_<f>, pisa_<d>, sol_topk_<r>, sol_tau_<tau>."""
    row = {"sdpa_cudnn": time_sdpa_cudnn(q, k, v, ms=ms), "fa4_dense": time_fa4_dense(q, k, v, ms=ms)}
    if dense_only:
        return row
    for f in fractions:
        row[f"fa4_bs_{f:g}"] = time_fa4_blocksparse(q, k, v, f, ms=ms)
    for d in pisa_densities:
        row[f"pisa_{d:g}"] = time_official_pisa(q, k, v, d, pisa_dir=pisa_dir, ms=ms)
    for r in sol_topk:
        row[f"sol_topk_{r:g}"] = time_sol_attn(q, k, v, topk_ratio=r, ms=ms)
    if sol_tau:
        row[f"sol_tau_{SOL_DEFAULT_TAU:g}"] = time_sol_attn(q, k, v, tau=SOL_DEFAULT_TAU, ms=ms)
    return row


def _num(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def run_all(shapes: dict, densities, tokens, qkv, ms=None, pisa_dir=None) -> dict:
    """Entry point for bench/bench_attention.py. ``shapes`` maps a name to (B, H, T, D) and must hold 'wan14'
    (the density sweep shape); ``qkv(shape)`` makes the inputs, ``ms(fn)`` times. Returns JSON-ready data with
    plot series as [[x, ms], ...] (successful points only) plus every raw result, failures included."""
    res = {"versions": versions(), "per_shape": {}, "density_sweep": {}, "tokens": []}
    for key, shape in shapes.items():
        q, k, v = qkv(shape)
        res["per_shape"][shape_name(shape)] = shape_row(q, k, v, fractions=(0.125, 0.25),
                                                        dense_only=key in DENSE_ONLY, ms=ms, pisa_dir=pisa_dir)
        print({shape_name(shape): res["per_shape"][shape_name(shape)]}, flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    ws = shapes.get("wan14", next(iter(shapes.values())))
    q, k, v = qkv(ws)
    sw = res["density_sweep"]
    sw["shape"] = shape_name(ws)
    sw["fa4_dense"] = res["per_shape"].get(shape_name(ws), {}).get("fa4_dense") or time_fa4_dense(q, k, v, ms=ms)
    for d in densities:
        sw[str(d)] = {"fa4_bs": time_fa4_blocksparse(q, k, v, d, ms=ms),
                      "official_pisa": time_official_pisa(q, k, v, d, pisa_dir=pisa_dir, ms=ms),
                      "sol_topk": time_sol_attn(q, k, v, topk_ratio=d, ms=ms) if d < 1 else "unavailable: topk 1"}
        print({"density": d, **sw[str(d)]}, flush=True)
    del q, k, v
    torch.cuda.empty_cache()
    res["fa4_dense_ms"] = sw["fa4_dense"]
    for key, sub in (("fa4_blocksparse", "fa4_bs"), ("official_pisa", "official_pisa"), ("sol_attn", "sol_topk")):
        res[key] = [[d, sw[str(d)][sub]] for d in densities if _num(sw[str(d)][sub])]
    H, D = ws[1], ws[3]
    for T in tokens:
        shape = (1, H, T, D)
        q, k, v = qkv(shape)
        row = {"T": T, "shape": shape_name(shape), "sdpa_cudnn": time_sdpa_cudnn(q, k, v, ms=ms),
               "fa4_dense": time_fa4_dense(q, k, v, ms=ms),
               "fa4_bs_0.125": time_fa4_blocksparse(q, k, v, 0.125, ms=ms),
               "pisa_0.125": time_official_pisa(q, k, v, 0.125, pisa_dir=pisa_dir, ms=ms),
               "sol_topk_0.125": time_sol_attn(q, k, v, topk_ratio=0.125, ms=ms)}
        res["tokens"].append(row)
        print(row, flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return res


def _fmt(x) -> str:
    return f"{x:.3f}" if _num(x) else str(x)[:60]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--shapes", default="wan14,wan13,flux,wan14_720",
                    help=f"comma list of {','.join(SHAPES)} or BxHxTxD")
    ap.add_argument("--fractions", default="0.125,0.25", help="FA4 block-sparse exact fractions")
    ap.add_argument("--pisa-densities", default="0.125,0.25,1.0")
    ap.add_argument("--sol-topk", default="0.125")
    ap.add_argument("--pisa-dir", default=str(DEFAULT_PISA_DIR))
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    ap.add_argument("--no-sanity", action="store_true", help="skip the error checks at shapes with T <= 8192")
    a = ap.parse_args(argv)
    fl = lambda s: tuple(float(x) for x in s.split(",") if x)  # noqa: E731
    ms = lambda fn: default_ms(fn, rep=a.rep)  # noqa: E731
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "method": "median of triton.testing.do_bench (warmup 25 ms, rep %d ms), random bf16 N(0,1) q/k/v, "
                     "first call (compile/autotune) excluded" % a.rep,
           "versions": versions(), "rows": {}, "sanity": {}}
    for s in a.shapes.split(","):
        shape = SHAPES[s] if s in SHAPES else tuple(int(x) for x in s.split("x"))
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(*shape, device="cuda", generator=g, dtype=torch.float32).to(torch.bfloat16)
                   for _ in range(3))
        t0 = time.time()
        row = shape_row(q, k, v, fractions=fl(a.fractions), pisa_densities=fl(a.pisa_densities),
                        sol_topk=fl(a.sol_topk), dense_only=s in DENSE_ONLY, ms=ms, pisa_dir=a.pisa_dir)
        row["wall_s"] = round(time.time() - t0, 1)
        res["rows"][shape_name(shape)] = row
        if not a.no_sanity and shape[2] <= 8192:
            res["sanity"][shape_name(shape)] = sanity(q, k, v, pisa_dir=a.pisa_dir)
        out.write_text(json.dumps(res, indent=1))  # partial results survive a time-out
        print(shape_name(shape), json.dumps(row), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    cols = sorted({c for r in res["rows"].values() for c in r if c != "wall_s"},
                  key=lambda c: (not c.startswith("sdpa"), not c.startswith("fa4_dense"), c))
    print("\nms (median)  " + "  ".join(cols))
    for name, r in res["rows"].items():
        print(name, "  ".join(_fmt(r.get(c, "-")) for c in cols))
    for name, s in res["sanity"].items():
        print("sanity", name, json.dumps(s))
    print("versions", json.dumps(res["versions"]))
    out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    sys.exit(main())
