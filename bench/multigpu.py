"""Several GPUs (issue 16): Ulysses sequence parallelism and ComfyUI's MultiGPU CFG split, dense vs sparse.

    python bench/multigpu.py ulysses --out DIR [--world 2] [--shape wan14b_720p] [--repeats 5]
    python bench/multigpu.py cfg --comfy PATH --out DIR [--res 720p] [--steps 3]
    python bench/multigpu.py ulysses --out DIR --cpu                 (CPU check: gloo, tiny shape, torch backend)
    python bench/multigpu.py cfg --comfy PATH --out DIR --cpu        (CPU check: tiny Wan, two stand-in CPU devices)
    python bench/multigpu.py cfg --comfy PATH --out DIR --res tiny --backend triton   (tests/test_multigpu_gpu.py)

ulysses: one Wan2.1-14B 720p self-attention call (B1 H40 T75600 D128 bf16, grid 21x45x80, random N(0,1)
inputs) on one GPU against --world GPUs under Ulysses (kernels/ulysses.py: each rank holds T/N tokens of all
heads; all-to-all -> the whole sequence for H/N heads -> attention -> all-to-all back), for dense attention
(PyTorch SDPA on the shard) and the operator (pwt, density 0.125, band 1, Morton, backend auto). One process per
GPU (torch.multiprocessing spawn, NCCL; NVLink multicast off). Times: median of --repeats after one warm-up,
each call between two barriers with the device synchronised (the slowest rank counts); also the all-to-alls
alone and the head-shard attention alone. Checks (non-zero exit on failure): the gathered Ulysses output equals
the one-GPU output (rel L2 <= 1e-3 for sparse: same routing per head; dense likewise).

cfg: ComfyUI's own sampling (comfy.sample.sample, CFG 5, euler) of ComfyUI's WanModel at Wan2.1-14B size
(random bf16 weights, no download; 81 frames, 720p latent 21x90x160) on one GPU (cond and uncond batched) and
under the core "MultiGPU CFG Split" (comfy.multigpu.create_multigpu_deepclones(model, 2): one branch per GPU,
one worker thread per GPU), each dense (variant off) and sparse (the node with dense_steps 0, blocks 0 and -1
dense: 38 of 40 sparse). Time per sampling step: the median of the steps after the first (which carries loading,
autotune and compiles), from the sampler's per-step callback with every GPU synchronised. Checks: sparse calls
on every GPU under the split (the decision log's device field), split vs one-GPU latent within bf16 noise
(rel L2 <= 3e-2), finite. ComfyUI 0.33 or newer (comfy/multigpu.py). Writes DIR/multigpu_<section>.json / .md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("multigpu")
# NVLink multicast stays off (it can take a shared host's GPUs out of service): also for spawned ranks
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)

SHAPES = {"wan14b_720p": dict(heads=40, grid=(21, 45, 80), dim=128),  # T = 75600
          "wan14b_480p": dict(heads=40, grid=(21, 30, 52), dim=128),  # T = 32760
          "tiny": dict(heads=4, grid=(2, 8, 16), dim=64)}
SPARSE = dict(density=0.125, variant="pwt", band=1, reorder="morton")


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


# ---------------------------------------------------------------------------------------------------
# ulysses

def _timed(fn, repeats, sync, barrier):
    """(median seconds, output): each call between barriers with the device synchronised."""
    out = fn()
    sync()
    times = []
    for _ in range(repeats):
        barrier()
        t0 = time.perf_counter()
        out = fn()
        sync()
        barrier()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _ulysses_rank(rank, world, init_file, args_d):
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT))
    from kernels import ulysses

    cpu = args_d["cpu"]
    if cpu:
        torch.set_num_threads(1)
    device = torch.device("cpu") if cpu else torch.device("cuda", rank)
    if not cpu:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if cpu else "nccl", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, **({} if cpu else {"device_id": device}))
    shape = SHAPES[args_d["shape"]]
    H, D, grid = shape["heads"], shape["dim"], shape["grid"]
    T = math.prod(grid)
    dtype = torch.float32 if cpu else torch.bfloat16
    backend = "torch" if cpu else args_d["backend"]
    repeats = args_d["repeats"]
    sync = (lambda: None) if cpu else (lambda: torch.cuda.synchronize(device))
    barrier = dist.barrier
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, T, H, D, generator=g, device=device, dtype=torch.float32).to(dtype) for _ in range(3))
    sparse_shard = lambda a, b, c: ulysses.head_shard_attention(a, b, c, grid=grid, backend=backend, **SPARSE)  # noqa
    dense_shard = lambda a, b, c: ulysses._sdpa(a, b, c, "bshd")  # noqa: E731
    res = {"rank": rank, "world": world, "device": str(device), "tokens": T, "heads": H, "head_dim": D}
    if rank == 0:  # the one-GPU baseline: all heads on this device (the other ranks wait at the next barrier)
        one = lambda: None  # noqa: E731
        ts = {}
        for name, fn in (("dense", dense_shard), ("sparse", sparse_shard)):
            t, out = _timed(lambda fn=fn: fn(q, k, v), repeats, sync, one)
            ts[name] = (t, out)
        res["one_gpu_s"] = {n: t for n, (t, _) in ts.items()}
        ref = {n: o for n, (_, o) in ts.items()}
    barrier()
    s = T // world
    if T % world or H % world:
        raise SystemExit(f"T={T} and H={H} must divide by the world size {world}")
    shard = [x[:, rank * s:(rank + 1) * s].contiguous() for x in (q, k, v)]
    res["ulysses_s"], res["rel_vs_one_gpu"] = {}, {}
    t_a2a, heads = _timed(lambda: [ulysses.seq_to_heads(x) for x in shard], repeats, sync, barrier)
    res["all_to_all_in_s"] = t_a2a
    for name, fn in (("dense", dense_shard), ("sparse", sparse_shard)):
        t_attn, o = _timed(lambda fn=fn: fn(*heads), repeats, sync, barrier)
        t_out, _ = _timed(lambda o=o: ulysses.heads_to_seq(o), repeats, sync, barrier)
        t_all, out = _timed(lambda fn=fn: ulysses.ulysses_attention(*shard, attention=fn), repeats, sync, barrier)
        res["ulysses_s"][name] = {"total": t_all, "head_shard_attention": t_attn, "all_to_all_out": t_out}
        parts = [torch.empty_like(out) for _ in range(world)] if rank == 0 else None
        dist.gather(out.contiguous(), parts, dst=0)
        if rank == 0:
            res["rel_vs_one_gpu"][name] = _rel(torch.cat(parts, dim=1), ref[name])
    if rank == 0:
        res["sparse_vs_dense_rel"] = _rel(ref["sparse"], ref["dense"])
        Path(args_d["out_json"]).write_text(json.dumps(res, indent=1) + "\n")
    dist.destroy_process_group()


def run_ulysses(args) -> int:
    import torch
    import torch.multiprocessing as mp

    if not args.cpu and torch.cuda.device_count() < args.world:
        raise SystemExit(f"ulysses: needs {args.world} CUDA devices, found {torch.cuda.device_count()} (--cpu: gloo)")
    shape = "tiny" if args.cpu and args.shape.startswith("wan14b") else args.shape
    out_json = args.out / "multigpu_ulysses.json"
    with tempfile.TemporaryDirectory() as tmp:
        d = dict(cpu=args.cpu, shape=shape, backend=args.backend, repeats=args.repeats, out_json=str(out_json))
        mp.start_processes(_ulysses_rank, args=(args.world, os.path.join(tmp, "init"), d), nprocs=args.world,
                           join=True, start_method="spawn")
    res = json.loads(out_json.read_text())
    res.update(timestamp=_now(), knobs=dict(SPARSE, backend="torch" if args.cpu else args.backend),
               torch=torch.__version__, device_name="CPU (gloo)" if args.cpu else torch.cuda.get_device_name(0))
    failures = [f"ulysses {n}: rel L2 {e:.2e} vs one GPU > 1e-3" for n, e in res["rel_vs_one_gpu"].items() if e > 1e-3]
    res["failures"] = failures
    out_json.write_text(json.dumps(res, indent=1) + "\n")
    one, uly = res["one_gpu_s"], res["ulysses_s"]
    lines = [f"# Ulysses: one self-attention call, {shape} (H{res['heads']} T{res['tokens']} D{res['head_dim']}), "
             f"{res['device_name']} x{args.world}", "", f"{res['timestamp']}; torch {res['torch']}; knobs "
             f"{res['knobs']}; median of {args.repeats} after 1 warm-up", "",
             f"| | 1 GPU | {args.world} GPUs Ulysses total | speed-up | head-shard attention | all-to-all in (q,k,v) "
             "| all-to-all out | rel L2 vs 1 GPU |", "|---|---|---|---|---|---|---|---|"]
    for n in ("dense", "sparse"):
        u = uly[n]
        lines.append(f"| {n} | {1e3 * one[n]:.2f} ms | {1e3 * u['total']:.2f} ms | {one[n] / u['total']:.2f}x | "
                     f"{1e3 * u['head_shard_attention']:.2f} ms | {1e3 * res['all_to_all_in_s']:.2f} ms | "
                     f"{1e3 * u['all_to_all_out']:.2f} ms | {res['rel_vs_one_gpu'][n]:.1e} |")
    lines += ["", f"sparse vs dense (one GPU, random inputs): rel L2 {res['sparse_vs_dense_rel']:.3f}"]
    lines += [""] + [f"FAILURE: {f}" for f in failures] if failures else []
    (args.out / "multigpu_ulysses.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failures else 0


# ---------------------------------------------------------------------------------------------------
# cfg: ComfyUI's MultiGPU CFG split

def _init_weights(model, device, seed: int = 0):
    """Random weights in place, drawn on `device` (ComfyUI's ops allocate without initialising): norms 1, biases
    0, matrices N(0, 0.5/sqrt(fan_in)), modulation N(0, 0.02); one seed gives the same model every time."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() <= 1 and "modulation" not in name:
                p.fill_(1.0 if "norm" in name and not name.endswith("bias") else 0.0)
                continue
            fan_in = math.prod(p.shape[1:]) if p.dim() >= 2 else p.shape[-1]
            std = 0.02 if "modulation" in name else 0.5 / math.sqrt(fan_in)
            p.copy_(torch.randn(p.shape, generator=g, device=device, dtype=torch.float32).mul_(std).to(p.dtype))
    return model


def _patcher(cfg: dict, device, dtype, seed=0):
    """A ModelPatcher of ComfyUI's Wan2.1 T2V with random weights and a loader factory (what MultiGPU deep-clones)."""
    import comfy.model_patcher
    import comfy.supported_models
    import torch

    mc = comfy.supported_models.WAN21_T2V(dict(cfg, image_model="wan2.1"))
    mc.set_inference_dtype(dtype, None)
    mb = mc.get_model({}, device=device)
    _init_weights(mb.diffusion_model, device, seed)
    p = comfy.model_patcher.ModelPatcher(mb, load_device=device, offload_device=torch.device("cpu"))
    p.cached_patcher_init = (_patcher, (cfg, device, dtype, seed))
    return p


def _sample(model, latent_shape, steps, devices):
    """(latent, seconds per step after the first) of comfy.sample.sample with CFG 5."""
    import comfy.sample
    import torch
    g = torch.Generator().manual_seed(1)
    cond = [[torch.randn(1, 512, 4096, generator=g) * 0.5, {}]]
    neg = [[torch.zeros_like(cond[0][0]), {}]]
    noise = torch.randn(latent_shape, generator=torch.Generator().manual_seed(0))
    stamps = []

    def callback(step, x0, x, total):
        for d in devices:
            if d.type == "cuda":
                torch.cuda.synchronize(d)
        stamps.append(time.perf_counter())
    t0 = time.perf_counter()
    out = comfy.sample.sample(model, noise, steps, 5.0, "euler", "simple", cond, neg, torch.zeros(latent_shape),
                              denoise=1.0, seed=0, disable_pbar=True, callback=callback)
    steps_s = [b - a for a, b in zip([t0] + stamps[:-1], stamps)]
    return out, steps_s


def run_cfg(args) -> int:
    import torch
    import dit_step

    cpu = args.cpu or not torch.cuda.is_available()
    dit_step.load_comfy(args.comfy.resolve(), cpu=cpu)
    try:
        import comfy.multigpu
    except ImportError:
        raise SystemExit("cfg: this ComfyUI has no comfy/multigpu.py (MultiGPU CFG split arrived in 0.33)")
    import comfy.model_management as mm
    kernels, patch, policy = dit_step.load_pack()
    if cpu:  # two stand-in devices: distinct keys for ComfyUI, both the CPU for tensors
        devices = [torch.device("cpu"), torch.device("cpu", 0)]
        mm.get_all_torch_devices = lambda exclude_current=False: list(devices)
    else:
        if torch.cuda.device_count() < 2:
            raise SystemExit(f"cfg: needs 2 CUDA devices, found {torch.cuda.device_count()} (--cpu: stand-ins)")
        devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    res_name = "tiny" if cpu else args.res
    cfg = dit_step.WAN_TINY if res_name == "tiny" else dit_step.WAN14
    f, h, w = dit_step.LATENTS[res_name]
    latent = (1, 16, f, h, w)
    dtype = torch.float32 if cpu else torch.bfloat16
    backend = "torch" if cpu else args.backend
    log_path = args.out / "multigpu_cfg_decisions.jsonl"
    os.environ[patch.DECISION_LOG_ENV] = str(log_path)
    base = _patcher(cfg, devices[0], dtype)
    knobs = dict(SPARSE, dense_steps=0, dense_blocks=(0, -1), min_tokens=0, backend=backend)
    models = {"dense": patch.apply_piecewise_sparse_attention(base, variant="off"),
              "sparse": patch.apply_piecewise_sparse_attention(base, **knobs)}
    results = {"timestamp": _now(), "torch": torch.__version__, "resolution": res_name, "latent": list(latent),
               "tokens": f * (h // 2) * (w // 2), "model": "tiny" if res_name == "tiny" else "Wan2.1-14B size", "knobs": knobs,
               "steps": args.steps, "devices": [str(d) for d in devices],
               "device_name": "CPU" if cpu else torch.cuda.get_device_name(0), "runs": {}, "failures": []}
    outs = {}
    for gpus in (1, 2):
        for name in ("dense", "sparse"):
            m = models[name] if gpus == 1 else comfy.multigpu.create_multigpu_deepclones(models[name], 2,
                                                                                       reuse_loaded=True)
            log_path.unlink(missing_ok=True)
            out, steps_s = _sample(m, latent, args.steps, devices)
            rows = [json.loads(x) for x in log_path.read_text().splitlines()] if log_path.exists() else []
            by_dev = {}
            for r in rows:
                if r["sparse"]:
                    by_dev[r.get("device", "?")] = by_dev.get(r.get("device", "?"), 0) + 1
            key = f"{name}_{gpus}gpu"
            timed = steps_s[1:] or steps_s
            results["runs"][key] = {"step_s": statistics.median(timed), "steps_s": steps_s,
                                    "sparse_calls_by_device": by_dev, "finite": bool(torch.isfinite(out).all())}
            log.info("%s: %.3f s per step %s", key, statistics.median(timed), by_dev)
            outs[key] = out
            if not results["runs"][key]["finite"]:
                results["failures"].append(f"{key}: non-finite latent")
            if not cpu:
                torch.cuda.empty_cache()
    runs = results["runs"]
    want = {str(devices[0])} if cpu else {str(d) for d in devices}  # CPU stand-ins: one device string
    if set(runs["sparse_2gpu"]["sparse_calls_by_device"]) != want:
        results["failures"].append(f"sparse under the split ran sparse on {runs['sparse_2gpu']['sparse_calls_by_device']}"
                                   f", expected every device of {sorted(want)}")
    for name in ("dense", "sparse"):
        e = _rel(outs[f"{name}_2gpu"], outs[f"{name}_1gpu"])
        results[f"{name}_split_vs_one_gpu_rel"] = e
        if e > 3e-2:
            results["failures"].append(f"{name}: split vs one GPU rel L2 {e:.2e} > 3e-2")
    results["sparse_vs_dense_rel"] = _rel(outs["sparse_1gpu"], outs["dense_1gpu"])
    (args.out / "multigpu_cfg.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [f"# MultiGPU CFG split: ComfyUI WanModel ({results['model']}), {res_name} ({results['tokens']} tokens), "
             f"{results['device_name']}", "", f"{results['timestamp']}; torch {results['torch']}; CFG 5, euler, "
             f"{args.steps} steps (the first not counted); sparse: {knobs}", "",
             "| | 1 GPU (cond+uncond batched) | 2 GPUs (MultiGPU CFG split) | split speed-up | sparse calls per device "
             "(split) | split vs 1 GPU rel L2 |", "|---|---|---|---|---|---|"]
    for name in ("dense", "sparse"):
        a, b = runs[f"{name}_1gpu"]["step_s"], runs[f"{name}_2gpu"]["step_s"]
        lines.append(f"| {name} | {a:.3f} s | {b:.3f} s | {a / b:.2f}x | "
                     f"{runs[f'{name}_2gpu']['sparse_calls_by_device'] or '-'} | "
                     f"{results[f'{name}_split_vs_one_gpu_rel']:.1e} |")
    d1, s2 = runs["dense_1gpu"]["step_s"], runs["sparse_2gpu"]["step_s"]
    lines += ["", f"sparse + split vs dense on one GPU: {d1 / s2:.2f}x per step; sparse vs dense latent (random "
              f"weights, a sanity number only): rel L2 {results['sparse_vs_dense_rel']:.2e}"]
    lines += [""] + [f"FAILURE: {x}" for x in results["failures"]] if results["failures"] else []
    (args.out / "multigpu_cfg.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if results["failures"] else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("section", choices=["ulysses", "cfg"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpu", action="store_true", help="CPU check at a tiny size (gloo / stand-in devices)")
    ap.add_argument("--world", type=int, default=2, help="ulysses: processes (GPUs)")
    ap.add_argument("--shape", default="wan14b_720p", choices=sorted(SHAPES))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--comfy", type=Path, help="cfg: a ComfyUI 0.33+ checkout or copy (its comfy/ folder)")
    ap.add_argument("--res", default="720p", choices=["480p", "720p", "tiny"], help="cfg: latent (tiny: tiny model)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--backend", default="auto", choices=["auto", "triton", "cute", "torch"])
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.section == "cfg":
        if args.comfy is None:
            ap.error("cfg needs --comfy")
        return run_cfg(args)
    return run_ulysses(args)


if __name__ == "__main__":
    sys.exit(main())
