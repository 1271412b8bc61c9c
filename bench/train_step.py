"""Training speed and memory on a CUDA GPU (issue 14, item 4): forward + backward of the operator, and one
LoRA-like training step of ComfyUI's WanModel at Wan2.1-1.3B size.

    python bench/train_step.py --out DIR [--comfy PATH_TO_ComfyUI] [--sections check,attn,breakdown,step]

Sections (fixed order; each is skipped, and says so, once --budget-s seconds have passed):
  check      bf16 gradients of pwt / pisa / drop against autograd through the float64 reference under
             identical routing (B1_H2_T4999_D128, d 0.125), next to SDPA's own bf16 gradient error on the same
             problem, and density 1 against SDPA's gradients. A speed-up below is marked unchecked if this fails.
  attn       Wan2.1-1.3B 480p (B1_H12_T32760_D128) and Wan2.1-14B 480p (B1_H40_T32760_D128), density 0.125:
             our forward (the training op, saving its row statistics), forward + backward, and the peak memory
             above inputs / output gradient / gradients, for pwt, pisa, drop; cuDNN and flash SDPA forward +
             backward; FA4 (flash_attn.cute) forward + backward where it imports and its backward runs.
  breakdown  the stages of our backward at Wan2.1-14B 480p pwt (CUDA events between them).
  step       one training step (forward, MSE loss, backward) of comfy.ldm.wan.model.WanModel at 1.3B size (dim
             1536, 12 heads, 30 blocks, random bf16 weights, frozen) with rank-16 LoRA adapters on every Linear
             of every block and per-block gradient checkpointing (ComfyUI's Train LoRA default), 480p 81 frames
             (32760 tokens), T5 context 512: ComfyUI's attention (SDPA) vs our override with every block sparse
             and with the first / last block dense. Needs --comfy (a ComfyUI copy; its comfy/ folder is enough).
Timing: median of --repeats calls after one warm-up call (autotune, compile), each between two CUDA events.
Writes DIR/train_step.json and DIR/train_step.md; prints the table last.

    python bench/train_step.py --out DIR --tiny [--comfy PATH]     (CPU smoke test of this script: the Triton
                                                                    kernels under TRITON_INTERPRET=1, tiny shapes)
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
import traceback
import os
from pathlib import Path

TINY = "--tiny" in sys.argv
if TINY:  # before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels.config import SparseConfig  # noqa: E402

DEV = "cpu" if TINY else "cuda"
DT = torch.float32 if TINY else torch.bfloat16  # the interpreter's tl.dot is wrong on bfloat16
SHAPES = ({"tiny_a": (1, 2, 300, 64), "tiny_b": (1, 3, 200, 64)} if TINY else
          {"wan1.3b_480p": (1, 12, 32760, 128), "wan14b_480p": (1, 40, 32760, 128)})
CHECK_SHAPE = (1, 2, 200, 64) if TINY else (1, 2, 4999, 128)
DENSITY = 0.125
VARIANTS = ("pwt", "pisa", "drop")
WAN13 = dict(model_type="t2v", dim=1536, ffn_dim=8960, num_heads=12, num_layers=30, freq_dim=256, text_dim=4096,
             in_dim=16, out_dim=16)
RES: dict = {"sections": {}}


def rnd(shape, dtype=None, seed=0):
    dtype = DT if dtype is None else dtype
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, device=DEV, dtype=torch.float32, generator=g).to(dtype)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def cfg_of(D, density, variant):
    return SparseConfig(density=density, variant=variant, band=1, block_size=64, scale=D ** -0.5)


def timed(fn, repeats):
    """Median ms of `repeats` calls after one warm-up call, each between two CUDA events."""
    fn()
    times = []
    if TINY:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - t0))
        return statistics.median(times)
    for _ in range(repeats):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def peak_mib(fn, held=()):
    """Peak MiB allocated during fn() above what was allocated before, minus the bytes of what fn returns
    (gradients) and of `held` (e.g. the output gradient made inside)."""
    if TINY:
        fn()
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    outs = out if isinstance(out, (tuple, list)) else (out,)
    peak -= sum(t.numel() * t.element_size() for t in list(outs) + list(held) if isinstance(t, torch.Tensor))
    del out
    return peak / 2**20


def leaves(shape, seed=0, layout="bhtd"):
    xs = [rnd(shape, seed=seed + i) for i in range(3)]
    if layout == "bthd":
        xs = [x.transpose(1, 2).contiguous() for x in xs]
    return [x.requires_grad_(True) for x in xs]


def section(fn):
    def run(args, t0):
        name = fn.__name__
        if time.time() - t0 > args.budget_s:
            print(f"\n=== {name}: skipped (budget {args.budget_s} s spent) ===", flush=True)
            RES["sections"][name] = {"skipped": "budget"}
            return
        t1 = time.time()
        print(f"\n=== {name} ===", flush=True)
        try:
            fn(args)
        except Exception:
            tb = traceback.format_exc()
            print(tb, flush=True)
            RES["sections"].setdefault(name, {})["error"] = tb
        print(f"--- {name}: {time.time() - t1:.1f} s", flush=True)
        if not TINY:
            torch.cuda.empty_cache()
    return run


def _sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def f(q, k, v):
        with sdpa_kernel([b]):
            return F.scaled_dot_product_attention(q, k, v)
    return f


def _fa4():
    from flash_attn.cute import flash_attn_func

    def f(q, k, v):  # [B, T, H, D]
        out = flash_attn_func(q, k, v)
        return out[0] if isinstance(out, tuple) else out
    return f


@section
def check(args):
    from kernels import reference
    from kernels import triton as kt
    from kernels.routing import block_stats, route
    from kernels.triton import train
    out = RES["sections"]["check"] = {"ok": True}
    shape = CHECK_SHAPE
    q, k, v = (rnd(shape, seed=s) for s in range(3))
    do = rnd(shape, seed=9)

    def sdpa_grads(dtype):
        x = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
        return torch.autograd.grad(F.scaled_dot_product_attention(*x), x, do.to(dtype))

    s16, s64 = sdpa_grads(DT), sdpa_grads(torch.float64)
    torch_err = [rel(a, b) for a, b in zip(s16, s64)]
    out["sdpa_bf16_grad_rel"] = torch_err
    for variant in VARIANTS:
        cfg = cfg_of(shape[-1], DENSITY, variant)
        x64 = [t.double().requires_grad_(True) for t in (q, k, v)]
        st = block_stats(*x64, 64)
        r = route(st, cfg)
        want = torch.autograd.grad(reference.forward(*x64, cfg, routing=r, stats=st), x64, do.double())
        r = type(r)(idx=r.idx, exact=r.exact, w=r.w.detach())
        o, lse, vbias, sts = train.forward_saving(q, k, v, cfg, routing=r)
        got = train.backward(do, q, k, v, o, lse, vbias, sts, cfg)
        errs = [rel(a, b) for a, b in zip(got, want)]
        ok = all(e <= 2 * t + 1e-4 for e, t in zip(errs, torch_err))
        out[variant] = {"grad_rel_dq_dk_dv": errs, "ok": ok}
        x = [t.clone().requires_grad_(True) for t in (q, k, v)]
        d1 = torch.autograd.grad(kt.forward(*x, cfg_of(shape[-1], 1.0, variant)), x, do)
        d1_err = [rel(a, b) for a, b in zip(d1, s64)]
        out[variant]["density1_vs_sdpa64"] = d1_err
        out["ok"] &= ok and all(e <= 2 * t + 1e-4 for e, t in zip(d1_err, torch_err))
        print(f"{variant}: grads {['%.2e' % e for e in errs]} density1 {['%.2e' % e for e in d1_err]} "
              f"(SDPA bf16 {['%.2e' % e for e in torch_err]}) ok={ok}", flush=True)


@section
def attn(args):
    from kernels import triton as kt
    res = RES["sections"]["attn"] = {}
    for label, shape in SHAPES.items():
        row = res[label] = {"shape": list(shape), "density": DENSITY}
        do = rnd(shape, seed=7)
        for variant in VARIANTS:
            cfg = cfg_of(shape[-1], DENSITY, variant)
            x = leaves(shape)
            fwd = lambda: kt.forward(*x, cfg)  # noqa: E731  (grad mode: the training op)
            fb = lambda: torch.autograd.grad(kt.forward(*x, cfg), x, do)  # noqa: E731
            e = row[f"ours_{variant}"] = {}
            e["fwd_ms"] = timed(fwd, args.repeats)
            e["fwd_bwd_ms"] = timed(fb, args.repeats)
            e["bwd_ms"] = e["fwd_bwd_ms"] - e["fwd_ms"]
            e["peak_mib"] = peak_mib(fb)
            print(f"{label} ours {variant}: {e}", flush=True)
            del x
        for name, make, layout in (("sdpa_cudnn", lambda: _sdpa("cudnn"), "bhtd"),
                                   ("sdpa_flash", lambda: _sdpa("flash"), "bhtd"), ("fa4", _fa4, "bthd")):
            try:
                f = make()
                x = leaves(shape, layout=layout)
                g = do.transpose(1, 2).contiguous() if layout == "bthd" else do
                e = row[name] = {}
                e["fwd_ms"] = timed(lambda: f(*x), args.repeats)
                fb = lambda: torch.autograd.grad(f(*x), x, g)  # noqa: E731
                e["fwd_bwd_ms"] = timed(fb, args.repeats)
                e["bwd_ms"] = e["fwd_bwd_ms"] - e["fwd_ms"]
                e["peak_mib"] = peak_mib(fb)
                print(f"{label} {name}: {e}", flush=True)
                del x
            except Exception as ex:  # FA4 missing or its SM90 backward not available: recorded, not fatal
                row[name] = {"error": f"{type(ex).__name__}: {str(ex)[:300]}"}
                print(f"{label} {name}: {row[name]['error']}", flush=True)


@section
def breakdown(args):
    from kernels import triton as kt  # noqa: F401  (registers the ops)
    from kernels.triton import train
    if TINY:
        RES["sections"]["breakdown"] = {"skipped": "needs CUDA events"}
        return
    shape = SHAPES["wan14b_480p"]
    cfg = cfg_of(shape[-1], DENSITY, "pwt")
    q, k, v = (rnd(shape, seed=s) for s in range(3))
    do = rnd(shape, seed=7)
    saved = train.forward_saving(q, k, v, cfg)
    train.backward(do, q, k, v, *saved, cfg)  # warm-up (autotune)
    stages: dict[str, float] = {}
    for _ in range(args.repeats):
        prof: list = []
        torch.cuda.synchronize()
        train.backward(do, q, k, v, *saved, cfg, prof=prof)
        torch.cuda.synchronize()
        for (_, a), (name, b) in zip(prof, prof[1:]):
            stages.setdefault(name, []).append(a.elapsed_time(b))
    res = {k2: statistics.median(v2) for k2, v2 in stages.items() if k2 != "start"}
    RES["sections"]["breakdown"] = {"shape": list(shape), "variant": "pwt", "stage_ms": res,
                                    "total_ms": sum(res.values())}
    print(RES["sections"]["breakdown"], flush=True)


def _lora(model, rank=16):
    """Rank-`rank` adapters on every Linear of every block (frozen base weights, trainable A, B)."""
    params = []
    for blk in model.blocks:
        for mod in blk.modules():
            w = getattr(mod, "weight", None)
            if isinstance(mod, torch.nn.Linear) and w is not None and w.dim() == 2:
                a = torch.nn.Parameter(torch.randn(rank, w.shape[1], device=w.device, dtype=w.dtype) / math.sqrt(w.shape[1]))
                b = torch.nn.Parameter(torch.randn(w.shape[0], rank, device=w.device, dtype=w.dtype) * 1e-3)
                orig = mod.forward
                mod.forward = (lambda x, orig=orig, a=a, b=b: orig(x) + (x @ a.t()) @ b.t())
                params += [a, b]
    return params


def _checkpoint_blocks(model):
    """ComfyUI's Train LoRA default: every block's forward under torch.utils.checkpoint (non-reentrant)."""
    for blk in model.blocks:
        orig = blk.forward
        blk.forward = (lambda *a, orig=orig, **kw: torch.utils.checkpoint.checkpoint(orig, *a, use_reentrant=False, **kw))


@section
def step(args):
    if args.comfy is None:
        RES["sections"]["step"] = {"skipped": "no --comfy (a ComfyUI copy is needed for WanModel)"}
        print(RES["sections"]["step"], flush=True)
        return
    import dit_step
    wan, ops, _, comfy_version = dit_step.load_comfy(Path(args.comfy), cpu=TINY)
    kernels, patch, policy = dit_step.load_pack()
    model = dit_step.build_model(wan, ops, dit_step.WAN_TINY if TINY else WAN13, DEV, DT).train()
    model.requires_grad_(False)
    lora = _lora(model)
    _checkpoint_blocks(model)
    f, h, w = dit_step.LATENTS["tiny" if TINY else "480p"]
    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(1, 16, f, h, w, generator=g, device=DEV).to(DT)
    ctx = torch.randn(1, 16 if TINY else dit_step.TEXT_TOKENS, 4096, generator=g, device=DEV).to(DT)
    target = torch.randn(x.shape, generator=g, device=DEV)
    t = torch.tensor([500.0], device=DEV)
    n_blocks = (dit_step.WAN_TINY if TINY else WAN13)["num_layers"]
    sched = dit_step.schedule(10)
    res = RES["sections"]["step"] = {"comfyui": comfy_version, "model": "WanModel 1.3B size, random bf16",
                                     "lora_params": sum(p.numel() for p in lora), "tokens": f * (h // 2) * (w // 2)}

    def train_step(to):
        for p in lora:
            p.grad = None
        out = model(x, t, ctx, transformer_options=to)
        loss = F.mse_loss(out.float(), target)
        loss.backward()
        return loss.detach()

    knobs = dict(variant="pwt", density=0.25 if TINY else DENSITY, band=1, reorder="morton", min_tokens=0,
                 backend="triton" if TINY else "auto", dense_steps=0)
    runs = [("dense_sdpa", None, None),
            ("sparse_all_blocks", policy.Knobs(dense_blocks=(), **knobs), 2 * n_blocks),
            ("sparse_first_last_dense", policy.Knobs(dense_blocks=(0, -1), **knobs), 2 * (n_blocks - 2))]
    for name, kn, expect in runs:
        try:
            if kn is None:
                make_to = lambda: {"sigmas": torch.tensor([0.5]), "sample_sigmas": sched}  # noqa: E731
                ov = None
            else:
                ov = patch.SparseAttentionOverride(kn, family="wan", total_blocks=n_blocks)
                make_to = lambda ov=ov: dit_step.options(patch, ov, 0.5, sched, wrapper=True)  # noqa: E731
            e = res[name] = {}
            if ov is not None:
                patch.reset_run(ov.uid)
            e["step_ms"] = timed(lambda: train_step(make_to()), args.step_repeats)
            e["loss"] = float(train_step(make_to()))
            e["peak_gib"] = peak_mib(lambda: train_step(make_to())) / 1024
            if ov is not None:
                tally = patch.run_state(ov.uid).tally
                calls = args.step_repeats + 3
                e["sparse_calls_per_step"] = tally.sparse / calls
                e["sparse_calls_ok"] = tally.sparse == expect * calls
            print(f"step {name}: {e}", flush=True)
        except Exception as ex:
            res[name] = {"error": traceback.format_exc(limit=6)}
            print(f"step {name} failed: {ex}", flush=True)
    if "step_ms" in res.get("dense_sdpa", {}):
        for name, _, _ in runs[1:]:
            if "step_ms" in res.get(name, {}):
                res[name]["speedup"] = res["dense_sdpa"]["step_ms"] / res[name]["step_ms"]


def table() -> str:
    s = RES["sections"]
    ok = s.get("check", {}).get("ok")
    mark = "" if ok else " (UNCHECKED: the check section failed or did not run)"
    lines = [f"# Training: forward + backward, {RES['env'].get('gpu')}", "",
             f"{RES['env']['date']}; torch {RES['env']['torch']}, triton {RES['env'].get('triton')}; density "
             f"{DENSITY}, band 1, {str(DT).replace('torch.', '')}, median of the repeats after one warm-up{mark}.", ""]
    if "check" in s and "error" not in s["check"]:
        c = s["check"]
        lines += ["| check (B{}_H{}_T{}_D{}) | dq | dk | dv | density 1 vs SDPA (max) |".format(*CHECK_SHAPE),
                  "|---|---|---|---|---|",
                  "| SDPA in the input dtype vs float64 | " + " | ".join(f"{e:.2e}" for e in c["sdpa_bf16_grad_rel"]) + " | - |"]
        for var in VARIANTS:
            if var in c:
                lines.append(f"| ours {var} | " + " | ".join(f"{e:.2e}" for e in c[var]["grad_rel_dq_dk_dv"])
                             + f" | {max(c[var]['density1_vs_sdpa64']):.2e} |")
        lines.append("")
    a = s.get("attn", {})
    for label in SHAPES:
        row = a.get(label)
        if not row:
            continue
        lines += [f"| {label} {tuple(row['shape'])} | fwd ms | bwd ms | fwd+bwd ms | vs SDPA cuDNN | vs FA4 | "
                  "peak MiB |", "|---|---|---|---|---|---|---|"]
        base = row.get("sdpa_cudnn", {}).get("fwd_bwd_ms")
        fa4 = row.get("fa4", {}).get("fwd_bwd_ms")
        for name in [f"ours_{v}" for v in VARIANTS] + ["sdpa_cudnn", "sdpa_flash", "fa4"]:
            e = row.get(name, {})
            if "error" in e:
                lines.append(f"| {name} | {e['error'][:80]} | | | | | |")
                continue
            if "fwd_bwd_ms" not in e:
                continue
            sp = f"{base / e['fwd_bwd_ms']:.2f}x" if base else "-"
            sf = f"{fa4 / e['fwd_bwd_ms']:.2f}x" if fa4 else "-"
            lines.append(f"| {name} | {e['fwd_ms']:.2f} | {e['bwd_ms']:.2f} | {e['fwd_bwd_ms']:.2f} | {sp} | {sf} | "
                         f"{e['peak_mib']:.0f} |")
        lines.append("")
    b = s.get("breakdown", {})
    if "stage_ms" in b:
        lines += ["backward stages, wan14b_480p pwt (ms): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in b["stage_ms"].items()) + f"; total {b['total_ms']:.2f}", ""]
    st = s.get("step", {})
    if "dense_sdpa" in st or "skipped" in st:
        what = "tiny WanModel, tiny latent" if TINY else "WanModel 1.3B, 480p 81f"
        lines += [f"| LoRA training step, {what} | step ms | speed-up | peak GiB | sparse calls ok |",
                  "|---|---|---|---|---|"]
        for name in ("dense_sdpa", "sparse_all_blocks", "sparse_first_last_dense"):
            e = st.get(name, {})
            if "step_ms" in e:
                lines.append(f"| {name} | {e['step_ms']:.0f} | {e.get('speedup', 1.0):.2f}x | {e['peak_gib']:.1f} | "
                             f"{e.get('sparse_calls_ok', '-')} |")
            elif e:
                lines.append(f"| {name} | failed: {e.get('error', '')[-120:]!r} | | | |")
        if "skipped" in st:
            lines.append(f"| (skipped: {st['skipped']}) | | | | |")
    errors = [k for k, v in s.items() if isinstance(v, dict) and "error" in v]
    if errors:
        lines += ["", "SECTION ERRORS: " + ", ".join(errors)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--comfy", default=None, help="ComfyUI copy for the WanModel training step")
    ap.add_argument("--sections", default="check,attn,breakdown,step")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--step-repeats", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=200.0, help="sections starting after this are skipped")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test (TRITON_INTERPRET=1, tiny shapes)")
    args = ap.parse_args(argv)
    if not TINY and not torch.cuda.is_available():
        raise SystemExit("bench/train_step.py needs a CUDA GPU (or --tiny)")
    args.out.mkdir(parents=True, exist_ok=True)
    import triton
    RES["env"] = {"gpu": "CPU (--tiny)" if TINY else torch.cuda.get_device_name(0), "torch": torch.__version__,
                  "triton": triton.__version__,
                  "date": datetime.datetime.now().isoformat(timespec="seconds"), "argv": sys.argv[1:]}
    t0 = time.time()
    sections = {"check": check, "attn": attn, "breakdown": breakdown, "step": step}
    for name in args.sections.split(","):
        sections[name.strip()](args, t0)
        (args.out / "train_step.json").write_text(json.dumps(RES, indent=1, default=str))
    md = table()
    (args.out / "train_step.md").write_text(md)
    print(f"\n(total {time.time() - t0:.0f} s)\n")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
