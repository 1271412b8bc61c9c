"""Attention alone at the shapes of the 2026 models, called as the node calls it.

    python bench/models.py                 # on a CUDA GPU: cuDNN SDPA, FA4 dense (if importable), ours
    python bench/models.py --tiny          # anywhere: the same code path at a tiny size (checks, no speed)
    python bench/models.py --json out.json

Per model: q, k, v [1, H, T, 128] bf16 random, T = text tokens + latent tokens, the text (kept in front, as
the node passes it) as exact sink blocks, Morton order over the latent grid, the node's default knobs
(pwt, density 0.125, band 1; `--density` to change). Shapes from ComfyUI 0.33's model configs
(comfy/model_detection.py, comfy/supported_models.py) and the official example resolutions:

| model | config | resolution | latent grid | text tokens |
|---|---|---|---|---|
| Wan2.2 TI2V 5B | dim 3072, 24 heads (head_dim 128), patch (1, 2, 2), VAE /16 spatial /4 time | 1280x704, 121 frames | 31 x 22 x 40 = 27280 | 0 (cross-attention) |
| HunyuanVideo 1.5 | hidden 2048, heads = hidden / 128 = 16, patch 1, VAE /16 spatial /4 time | 1280x720, 121 frames | 31 x 45 x 80 = 111600 | --text-video (default 256) |
| Qwen-Image | 24 heads x 128, patch 2, VAE /8 | 1328x1328 | 83 x 83 = 6889 | --text-image (default 128) |
| FLUX.2 dev | hidden 6144, 48 heads x 128, patch 1, VAE /16 | 1024x1024 | 64 x 64 = 4096 | 512 (padded by ComfyUI) |

Text lengths of Qwen-Image and HunyuanVideo 1.5 follow the prompt (no padding); the defaults are a typical
prompt's and can be changed. Timing: triton.testing.do_bench median (warmup 25, rep 200), as bench/README.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels import piecewise_sparse_attention  # noqa: E402

D = 128


def shapes(text_video: int, text_image: int, tiny: bool):
    """(name, heads, n_text, grid)."""
    full = [
        ("Wan2.2-TI2V-5B 720p 121f", 24, 0, (31, 22, 40)),
        ("HunyuanVideo-1.5 720p 121f", 16, text_video, (31, 45, 80)),
        ("Qwen-Image 1328x1328", 24, text_image, (83, 83)),
        ("FLUX.2-dev 1024x1024", 48, 512, (64, 64)),
    ]
    if not tiny:
        return full
    # same structure, a few blocks of tokens: checks the path on a CPU in seconds
    return [(n, 2, min(t, 70), tuple(max(2, g // 4) for g in grid)) for n, _, t, grid in full]


def sdpa_cudnn(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v)


def fa4_dense():
    """FA4's dense forward on [B, H, T, D] tensors, or (None, why)."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # not installed, or no CuTe DSL
        return None, f"{type(e).__name__}: {e}"

    def run(q, k, v):
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
    return run, None


def ours(n_text, grid, density, backend):
    sinks = -(-n_text // 64)

    def run(q, k, v):
        return piecewise_sparse_attention(q, k, v, density=density, variant="pwt", band=1, n_sink_blocks=sinks,
                                          reorder="morton", grid=grid, n_prefix=n_text, backend=backend)
    return run


def timer(cuda: bool):
    if cuda:
        from triton.testing import do_bench
        return lambda fn: do_bench(fn, warmup=25, rep=200, return_mode="median")

    def cpu(fn, n=3):
        fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e3
    return cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (any device): checks the path, no speed")
    ap.add_argument("--density", type=float, default=0.125, help="the node's default: 0.125")
    ap.add_argument("--text-video", type=int, default=256, help="HunyuanVideo 1.5 prompt tokens")
    ap.add_argument("--text-image", type=int, default=128, help="Qwen-Image prompt tokens")
    ap.add_argument("--backend", default="auto", help="our backend (auto / triton / cute / torch)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not a.tiny:
        sys.exit("no CUDA GPU: run with --tiny to check the path on this machine")
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    time_ms = timer(cuda)
    fa4, fa4_why = fa4_dense() if cuda else (None, "no CUDA")
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if cuda else "cpu",
           "density": a.density, "variant": "pwt", "band": 1, "reorder": "morton", "backend": a.backend,
           "fa4": "yes" if fa4 else fa4_why, "PSA_BACKEND": os.environ.get("PSA_BACKEND")}
    print(json.dumps(env))
    rows = []
    print(f"{'model':30s} {'H':>3s} {'text':>5s} {'T':>7s} {'cuDNN ms':>9s} {'FA4 ms':>8s} {'ours ms':>8s} "
          f"{'vs cuDNN':>8s} {'rel err':>8s}")
    for name, H, n_text, grid in shapes(a.text_video, a.text_image, a.tiny):
        T = n_text + math.prod(grid)
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(1, H, T, D, device=dev, dtype=dtype, generator=g) for _ in range(3))
        mine = ours(n_text, grid, a.density, a.backend if cuda else "torch")
        ref = sdpa_cudnn(q, k, v) if cuda else F.scaled_dot_product_attention(q, k, v)
        out = mine(q, k, v)
        err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
        assert math.isfinite(err) and out.shape == q.shape, name
        t_ref = time_ms(lambda: sdpa_cudnn(q, k, v)) if cuda else time_ms(lambda: F.scaled_dot_product_attention(q, k, v))
        t_fa4 = time_ms(lambda: fa4(q, k, v)) if fa4 else None
        t_ours = time_ms(lambda: mine(q, k, v))
        row = {"model": name, "heads": H, "text": n_text, "grid": list(grid), "tokens": T, "cudnn_ms": t_ref,
               "fa4_ms": t_fa4, "ours_ms": t_ours, "speedup_vs_cudnn": t_ref / t_ours, "rel_err_vs_dense": err}
        rows.append(row)
        fa = f"{t_fa4:8.3f}" if t_fa4 is not None else f"{'-':>8s}"
        print(f"{name:30s} {H:3d} {n_text:5d} {T:7d} {t_ref:9.3f} {fa} {t_ours:8.3f} {t_ref / t_ours:7.2f}x "
              f"{err:8.4f}", flush=True)
        del q, k, v, ref, out
        if cuda:
            torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
