"""One whole DiT step of ComfyUI's own WanModel at Wan2.1-14B size, through our node's override.

    python bench/dit_step.py --comfy PATH_TO_ComfyUI --out DIR [--res 480p,720p] [--repeats 3] [--full-protocol]
    python bench/dit_step.py --comfy PATH --out DIR --tiny          (CPU smoke test: tiny model, tiny latent)

Builds comfy.ldm.wan.model.WanModel (dim 5120, 40 heads, 40 blocks, ffn 13824, text_dim 4096; random bf16
weights allocated straight on the GPU, no download), B=1, 81 frames: 480p latent 21x60x104 -> 21x30x52 =
32760 tokens, 720p 21x90x160 -> 21x45x80 = 75600 tokens, T5 context 512 tokens. Per resolution it times
one forward (CUDA events, median of --repeats after one warm-up) with
  dense_sdpa      ComfyUI's default attention (forced to PyTorch SDPA, as on an H200)
  attn_free       every attention call replaced by returning q (bounds any attention speed-up)
  fa4_dense       self-attention through FA4 (flash_attn.cute), when installed
  sparse          our override, every block sparse: pwt, density 0.125, Morton, band 1
  protocol_dense  our override on a step inside the dense 20% (the override's cost when it stays dense)
  protocol_sparse our override on a later step: first and last block dense, the 38 others sparse
and composes the paper's protocol scaled down to 10 steps (2 dense + 8 sparse steps) from the measured
steps; --full-protocol also runs the 10 steps back to back. Self-checks (non-zero exit on failure): every
output finite; the override ran sparse on exactly 40 / 38 / 0 self-attention calls of the three steps;
the backend that ran is reported. Writes DIR/dit_step.json and DIR/dit_step.md.

The device gets only this repo: pass --comfy to a copy of ComfyUI (its comfy/ folder and comfyui_version.py
are enough; nothing is downloaded).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("dit_step")

WAN14 = dict(model_type="t2v", dim=5120, ffn_dim=13824, num_heads=40, num_layers=40, freq_dim=256, text_dim=4096,
             in_dim=16, out_dim=16)
WAN_TINY = dict(model_type="t2v", dim=256, ffn_dim=512, num_heads=2, num_layers=4, freq_dim=256, text_dim=4096,
                in_dim=16, out_dim=16)
LATENTS = {"480p": (21, 60, 104), "720p": (21, 90, 160), "tiny": (3, 16, 32)}
TEXT_TOKENS = 512
PROTOCOL_STEPS, PROTOCOL_DENSE = 10, 2  # the paper's 50 steps with 10 dense, scaled down
SPARSE_KNOBS = dict(variant="pwt", density=0.125, band=1, reorder="morton", min_tokens=0, backend="auto")


def load_comfy(path: Path, cpu: bool):
    if not (path / "comfy" / "ldm" / "wan" / "model.py").is_file():
        raise SystemExit(f"--comfy {path}: no comfy/ldm/wan/model.py there (need a ComfyUI checkout or copy)")
    sys.path.insert(0, str(path))
    import comfy.options

    comfy.options.args_parsing = False
    import comfy.cli_args

    # "ComfyUI's default attention on that GPU" is PyTorch SDPA; force it so CPU runs use it too
    comfy.cli_args.args.use_pytorch_cross_attention = True
    comfy.cli_args.args.cpu = cpu
    import comfy.ldm.modules.attention as attention
    import comfy.ldm.wan.model as wan
    import comfy.ops

    version = "?"
    vfile = path / "comfyui_version.py"
    if vfile.is_file():
        version = vfile.read_text().split('"')[1] if '"' in vfile.read_text() else "?"
    return wan, comfy.ops, attention, version


def load_pack():
    spec = importlib.util.spec_from_file_location("psa_pack", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["psa_pack"] = mod
    spec.loader.exec_module(mod)
    import psa_pack.kernels as kernels
    from psa_pack.nodes import patch, policy
    return kernels, patch, policy


def build_model(wan, ops, cfg: dict, device, dtype, seed: int = 0):
    """WanModel with random weights made on `device` (ComfyUI's ops allocate without initialising)."""
    import torch

    with torch.device(device):
        model = wan.WanModel(operations=ops.disable_weight_init, device=device, dtype=dtype, **cfg)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() <= 1 and "modulation" not in name:
                p.fill_(1.0 if ("norm" in name or name.endswith("weight")) else 0.0)
                if name.endswith("bias"):
                    p.zero_()
            else:
                fan_in = p.shape[1] if p.dim() >= 2 else p.shape[-1]
                if p.dim() == 5:  # patch embedding conv
                    fan_in = math.prod(p.shape[1:])
                std = 0.02 if "modulation" in name else 0.5 / math.sqrt(fan_in)
                p.copy_(torch.randn(p.shape, generator=g, device=device, dtype=torch.float32).mul_(std).to(p.dtype))
    return model.eval()


class Timer:
    def __init__(self, device):
        import torch
        self.cuda = torch.device(device).type == "cuda"
        self.torch = torch

    def __call__(self, fn, repeats: int) -> tuple[float, list[float], object]:
        torch = self.torch
        out = fn()  # warm-up (autotune, compile, caches)
        times = []
        for _ in range(repeats):
            if self.cuda:
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                out = fn()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1000.0)
            else:
                t0 = time.perf_counter()
                out = fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times), times, out


def attention_free(func, *args, **kwargs):
    """Override that skips attention: returns q in the output layout (near-zero cost)."""
    q = args[0]
    if not hasattr(q, "shape"):
        q = q.take()
    if kwargs.get("skip_reshape") and not kwargs.get("skip_output_reshape"):
        b, h, t, d = q.shape
        return q.transpose(1, 2).reshape(b, t, h * d)
    return q


def self_attention_free(func, *args, **kwargs):
    """Override that skips self-attention only (q and k of one length): the cross-attention to the text still
    runs through ComfyUI's function, as it does under our override (bounds a self-attention speed-up)."""
    q, k = args[0], args[1]
    if not hasattr(q, "shape"):
        q, k = q.take(), k.take()
    ax = 2 if kwargs.get("skip_reshape") else 1
    if q.shape[ax] != k.shape[ax]:
        return func(*args, **kwargs)
    return attention_free(func, *args, **kwargs)


class FA4Dense:
    """Override: self-attention through FA4 (dense), everything else through ComfyUI's function."""

    def __init__(self, fa4):
        self.fa4 = fa4

    def __call__(self, func, *args, **kwargs):
        q, k, v = args[:3]
        heads = kwargs.get("heads", args[3] if len(args) > 3 else None)
        if kwargs.get("skip_reshape") or q.shape[1] != k.shape[1]:
            return func(*args, **kwargs)
        b, t, hd = q.shape
        qt, kt, vt = (x.view(b, x.shape[1], heads, hd // heads) for x in (q, k, v))
        out = self.fa4(qt, kt, vt)
        out = out[0] if isinstance(out, tuple) else out
        return out.reshape(b, t, hd)


def schedule(steps: int):
    import torch
    return torch.linspace(1.0, 0.0, steps + 1)


def options(patch, override, sigma: float, sample_sigmas, *, wrapper: bool):
    import torch
    to = {"sigmas": torch.tensor([sigma]), "sample_sigmas": sample_sigmas, "cond_or_uncond": [0]}
    if override is not None:
        to[patch.OVERRIDE] = override
    if wrapper:
        to["wrappers"] = {patch.WRAPPER_DIFFUSION_MODEL: {patch.KEY: [patch.ForwardWrapper(override)]}}
    return to


def run_resolution(res: str, model, cfg: dict, args, env, results: dict) -> list[str]:
    import torch
    kernels, patch, policy = env["kernels"], env["patch"], env["policy"]
    device, dtype = env["device"], env["dtype"]
    failures: list[str] = []
    f, h, w = LATENTS[res]
    tokens = f * (h // 2) * (w // 2)
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(1, 16, f, h, w, generator=g, device=device, dtype=torch.float32).to(dtype)
    ctx = torch.randn(1, TEXT_TOKENS, cfg["text_dim"], generator=g, device=device, dtype=torch.float32).to(dtype)
    t = torch.tensor([500.0], device=device)
    timer = Timer(device)
    row = {"resolution": res, "latent": [f, h, w], "tokens": tokens, "steps": {}}
    # the backend auto picks at this size (a small probe would see the CuTe backend's small-problem rule)
    heads = cfg["num_heads"]
    probe = torch.empty(1, heads, tokens, cfg["dim"] // heads, device=device, dtype=dtype)
    row["backend"], row["backend_reason"] = kernels.select_backend(
        probe, env["SparseConfig"](scale=1.0, **{k: SPARSE_KNOBS[k] for k in ("variant", "density", "band")}),
        args.backend)
    del probe
    results["rows"].append(row)
    n_blocks = cfg["num_layers"]

    def forward(to):
        with torch.inference_mode():
            return model(x, t, ctx, transformer_options=to)

    def record(name, fn, expect_sparse=None, override=None):
        try:
            if torch.device(device).type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            if override is not None:
                patch.reset_run(override.uid)
            med, times, out = timer(fn, args.repeats)
            entry = {"median_s": med, "times_s": times, "finite": bool(torch.isfinite(out).all())}
            if torch.device(device).type == "cuda":
                entry["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
            if override is not None:
                tally = patch.run_state(override.uid).tally
                calls = args.repeats + 1
                entry["sparse_calls_per_step"] = tally.sparse / calls
                entry["dense_calls_per_step"] = {r: n / calls for r, n in tally.dense.items()}
                if expect_sparse is not None and tally.sparse != expect_sparse * calls:
                    failures.append(f"{res} {name}: {tally.sparse / calls} sparse calls per step, expected {expect_sparse}")
            if not entry["finite"]:
                failures.append(f"{res} {name}: non-finite output")
            row["steps"][name] = entry
            log.info("%s %-16s %8.3f s  %s", res, name, med, {k: v for k, v in entry.items() if k not in ("times_s",)})
            return out
        except Exception as e:  # keep measuring the others; the failure is reported and fails the run
            failures.append(f"{res} {name}: {type(e).__name__}: {e}")
            row["steps"][name] = {"error": traceback.format_exc(limit=4)}
            log.error("%s %s failed: %s", res, name, e)
            return None

    sched = schedule(PROTOCOL_STEPS)
    mid_sigma = float(sched[PROTOCOL_STEPS // 2])  # a step after the dense 20%
    dense_out = record("dense_sdpa", lambda: forward({"sigmas": torch.tensor([mid_sigma]), "sample_sigmas": sched}))
    record("attn_free", lambda: forward({patch.OVERRIDE: attention_free}))
    record("self_attn_free", lambda: forward({patch.OVERRIDE: self_attention_free}))
    if env.get("fa4") is not None:
        record("fa4_dense", lambda: forward({patch.OVERRIDE: FA4Dense(env["fa4"])}))

    all_sparse = patch.SparseAttentionOverride(
        policy.Knobs(dense_steps=0, dense_blocks=(), **SPARSE_KNOBS), family="wan", total_blocks=n_blocks)
    sparse_out = record("sparse", lambda: forward(options(patch, all_sparse, mid_sigma, sched, wrapper=True)),
                        expect_sparse=n_blocks, override=all_sparse)
    if args.profile and torch.device(device).type == "cuda":
        row["profile_sparse"] = profile_step(
            lambda: forward(options(patch, all_sparse, mid_sigma, sched, wrapper=True)))
    proto = patch.SparseAttentionOverride(
        policy.Knobs(dense_steps=-1, dense_blocks=(0, -1), **SPARSE_KNOBS), family="wan", total_blocks=n_blocks)
    record("protocol_dense", lambda: forward(options(patch, proto, float(sched[0]), sched, wrapper=True)),
           expect_sparse=0, override=proto)
    record("protocol_sparse", lambda: forward(options(patch, proto, mid_sigma, sched, wrapper=True)),
           expect_sparse=n_blocks - 2, override=proto)

    if dense_out is not None and sparse_out is not None:
        d = dense_out.float()
        row["sparse_vs_dense_rel_err"] = float((sparse_out.float() - d).norm() / d.norm())

    st = row["steps"]
    med = {k: v.get("median_s") for k, v in st.items()}
    if med.get("dense_sdpa") and med.get("attn_free"):
        row["attention_s"] = med["dense_sdpa"] - med["attn_free"]
        row["attention_share"] = row["attention_s"] / med["dense_sdpa"]
        row["bound_speedup"] = med["dense_sdpa"] / med["attn_free"]
    if med.get("dense_sdpa") and med.get("self_attn_free") and med.get("attn_free"):
        row["self_attention_s"] = med["dense_sdpa"] - med["self_attn_free"]
        row["cross_attention_s"] = med["self_attn_free"] - med["attn_free"]
        row["self_bound_speedup"] = med["dense_sdpa"] / med["self_attn_free"]
    if med.get("sparse") and med.get("self_attn_free"):
        row["sparse_self_attention_s"] = med["sparse"] - med["self_attn_free"]
    for k in ("sparse", "fa4_dense", "protocol_sparse"):
        if med.get(k) and med.get("dense_sdpa"):
            row[f"{k}_speedup"] = med["dense_sdpa"] / med[k]
    if med.get("protocol_dense") and med.get("protocol_sparse") and med.get("dense_sdpa"):
        total = PROTOCOL_DENSE * med["protocol_dense"] + (PROTOCOL_STEPS - PROTOCOL_DENSE) * med["protocol_sparse"]
        row["protocol_composed_s"] = total
        row["protocol_dense_baseline_s"] = PROTOCOL_STEPS * med["dense_sdpa"]
        row["protocol_speedup"] = row["protocol_dense_baseline_s"] / total
    if args.full_protocol:
        def run10():
            out = None
            for i in range(PROTOCOL_STEPS):
                out = forward(options(patch, proto, float(sched[i]), sched, wrapper=True))
            return out
        r = record("protocol_10_steps", run10, expect_sparse=(PROTOCOL_STEPS - PROTOCOL_DENSE) * (n_blocks - 2),
                   override=proto)
        if r is not None and med.get("dense_sdpa"):
            row["protocol_10_steps_speedup"] = PROTOCOL_STEPS * med["dense_sdpa"] / st["protocol_10_steps"]["median_s"]
    del x, ctx
    return failures


def profile_step(fn, top: int = 16) -> list:
    """[(kernel, device ms in one step, launches)] of one call of fn under torch.profiler, the largest first: how
    the step's attention calls compare with the operator timed alone (bench/pieces.py)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = [(ev.key, (getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)) / 1e3, ev.count)
            for ev in prof.key_averages()]
    rows = [r for r in rows if r[1] > 0]
    return sorted(rows, key=lambda r: -r[1])[:top]


def table(results: dict) -> str:
    lines = [f"# Whole DiT step: ComfyUI WanModel, {results['model_label']}, B=1, {results['device_name']}",
             "",
             f"{results['timestamp']}; torch {results['torch']}, triton {results.get('triton')}, ComfyUI "
             f"{results['comfyui']}; default attention `{results['default_attention']}`; sparse backend "
             + (", ".join(f"{r['resolution']} `{r['backend']}`" for r in results["rows"] if "backend" in r)
                or f"`{results.get('backend')}`") + f"; knobs {results['knobs']}; median of {results['repeats']} after 1 warm-up.",
             "",
             "| res | tokens | dense SDPA | attention-free (bound) | attention share | FA4 dense | sparse all blocks | "
             "protocol dense step | protocol sparse step | 10-step protocol (2 dense + 8 sparse) |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def s(row, k):
        v = row["steps"].get(k, {}).get("median_s")
        return "-" if v is None else f"{v:.3f} s"

    for row in results["rows"]:
        sp = lambda k: f" ({row[k]:.2f}x)" if k in row else ""  # noqa: E731
        lines.append(
            f"| {row['resolution']} | {row['tokens']} | {s(row, 'dense_sdpa')} | {s(row, 'attn_free')}"
            f"{sp('bound_speedup')} | {100 * row.get('attention_share', float('nan')):.0f}% | {s(row, 'fa4_dense')}"
            f"{sp('fa4_dense_speedup')} | {s(row, 'sparse')}{sp('sparse_speedup')} | {s(row, 'protocol_dense')} | "
            f"{s(row, 'protocol_sparse')}{sp('protocol_sparse_speedup')} | "
            + (f"{row['protocol_composed_s']:.2f} s vs {row['protocol_dense_baseline_s']:.2f} s "
               f"({row['protocol_speedup']:.2f}x)" if "protocol_speedup" in row else "-") + " |")
    lines += ["", "Speed-ups are against the dense SDPA step. attention share = (dense - attention-free) / dense. "
              "sparse_vs_dense_rel_err (random weights, a sanity number only): "
              + ", ".join(f"{r['resolution']} {r.get('sparse_vs_dense_rel_err', float('nan')):.3f}"
                          for r in results["rows"])]
    split = [r for r in results["rows"] if "self_attention_s" in r]
    if split:
        lines += ["", "Self- vs cross-attention (self_attn_free skips only the self-attention; the T5 cross-attention "
                  "still runs dense, as under our override):", "",
                  "| res | self-attention-free step (bound) | dense self-attention | cross-attention | "
                  "our self-attention in the sparse step | vs dense self-attention |", "|---|---|---|---|---|---|"]
        for r in split:
            ours = r.get("sparse_self_attention_s")
            lines.append(f"| {r['resolution']} | {r['steps']['self_attn_free']['median_s']:.3f} s "
                         f"({r['self_bound_speedup']:.2f}x) | {r['self_attention_s']:.3f} s | "
                         f"{r['cross_attention_s']:.3f} s | " + ("-" if ours is None else f"{ours:.3f} s") + " | "
                         + ("-" if not ours else f"{r['self_attention_s'] / ours:.2f}x") + " |")
    for r in results["rows"]:
        if r.get("profile_sparse"):
            lines += ["", f"Kernels of one sparse step at {r['resolution']} (torch.profiler, device ms in the step, "
                      "launches): " + "; ".join(f"{k[:48]} {ms:.1f} x{n}" for k, ms, n in r["profile_sparse"])]
    if results["failures"]:
        lines += ["", "FAILURES:"] + [f"- {f}" for f in results["failures"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comfy", type=Path, required=True, help="ComfyUI checkout or copy (needs comfy/)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--res", default="480p,720p")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="tiny model and latent on CPU (smoke test)")
    ap.add_argument("--full-protocol", action="store_true", help="also run the 10 protocol steps back to back")
    ap.add_argument("--backend", default="auto", choices=["auto", "triton", "cute", "torch"])
    ap.add_argument("--profile", action="store_true", help="also a kernel table of one sparse step (CUDA)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.out.mkdir(parents=True, exist_ok=True)

    import torch
    tiny = args.tiny or not torch.cuda.is_available()
    wan, ops, attention, comfy_version = load_comfy(args.comfy.resolve(), cpu=tiny)
    kernels, patch, policy = load_pack()
    SPARSE_KNOBS["backend"] = args.backend
    if tiny and not args.tiny:
        log.warning("no CUDA device: running the tiny CPU configuration")
    device = "cpu" if tiny else "cuda"
    dtype = torch.float32 if tiny else torch.bfloat16
    cfg = WAN_TINY if tiny else WAN14
    resolutions = ["tiny"] if tiny else [r.strip() for r in args.res.split(",") if r.strip()]
    try:
        import triton
        triton_version = triton.__version__
    except Exception:
        triton_version = None
    fa4 = None
    if not tiny:
        try:
            from flash_attn.cute import flash_attn_func as fa4
        except Exception as e:
            log.info("FA4 not installed (%s): no fa4_dense column", type(e).__name__)
    results = {
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "device_name": torch.cuda.get_device_name() if device == "cuda" else "CPU",
        "torch": torch.__version__, "triton": triton_version, "comfyui": comfy_version,
        "default_attention": attention.optimized_attention.__name__,
        "model_label": "Wan2.1-14B size (dim 5120, 40 heads, 40 blocks, ffn 13824), bf16 random weights" if not tiny
        else "tiny (dim 256, 2 heads, 4 blocks), fp32",
        "model_config": cfg, "knobs": dict(SPARSE_KNOBS), "repeats": args.repeats,
        "protocol": f"{PROTOCOL_STEPS} steps, first {PROTOCOL_DENSE} dense, blocks 0 and -1 dense",
        "rows": [], "failures": [],
    }
    probe_q = torch.zeros(1, cfg["num_heads"], 64, cfg["dim"] // cfg["num_heads"], device=device, dtype=dtype)
    from psa_pack.kernels.config import SparseConfig
    name, reason = kernels.select_backend(probe_q, SparseConfig(scale=1.0), args.backend)
    results["backend"] = name
    results["backend_reason"] = reason
    if device == "cuda" and name == "torch":
        results["failures"].append(f"sparse backend on CUDA is the torch reference ({reason}): not a speed measurement")

    t0 = time.perf_counter()
    model = build_model(wan, ops, cfg, device, dtype)
    results["build_s"] = time.perf_counter() - t0
    log.info("model built in %.1f s (%d params)", results["build_s"], sum(p.numel() for p in model.parameters()))
    env = dict(kernels=kernels, patch=patch, policy=policy, device=device, dtype=dtype, fa4=fa4,
               SparseConfig=SparseConfig)
    dispatch = getattr(kernels, "dispatch", None)
    for res in resolutions:
        results["failures"] += run_resolution(res, model, cfg, args, env, results)
        # a fast backend that failed at run time falls back to the reference inside the operator: not a
        # measurement of the fast path
        failed = sorted(k for k in getattr(dispatch, "_logged", ()) if str(k).startswith("fail:"))
        if failed:
            results["failures"].append(f"{res}: backend failure(s) {failed}; sparse timings used the fallback")
        if device == "cuda":
            torch.cuda.empty_cache()
    (args.out / "dit_step.json").write_text(json.dumps(results, indent=1) + "\n")
    md = table(results)
    (args.out / "dit_step.md").write_text(md)
    print(md)
    return 1 if results["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
