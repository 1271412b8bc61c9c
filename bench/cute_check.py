"""Quick device check of the CuTe kernel: cute vs Triton under identical routing at small and odd shapes (density 1
also vs SDPA), then Wan2.1-14B attention-only times over the pipeline depth and the full operator, on random and
DiT-like Morton-ordered inputs.  Usage (repo root, H200, nvidia-cutlass-dsl importable): python3 bench/cute_check.py
[all|correct|perf]"""
import os, sys, time, traceback
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from kernels.config import SparseConfig
from kernels.triton import prepare
from kernels.triton import fwd as TF
t0 = time.time()
from kernels.cute import fwd as CF
print("import cute", time.time() - t0, flush=True)
torch.manual_seed(0)
dev = "cuda"
out = {}
def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()
mode = sys.argv[1] if len(sys.argv) > 1 else "all"
cases = [("drop", 1, 1, 640, 0.25), ("drop", 1, 2, 1000, 0.25), ("pisa", 1, 2, 1000, 0.25), ("pwt", 1, 2, 1000, 0.25),
         ("pwt", 2, 3, 4033, 0.125), ("pisa", 2, 2, 4096, 0.5), ("drop", 1, 2, 4096, 1.0), ("pwt", 1, 2, 4096, 1.0), ("pwt", 1, 2, 1050, 0.25), ("drop", 2, 1, 1050, 0.125), ("pisa", 1, 1, 64, 0.5), ("pwt", 1, 1, 100, 0.5)]
if mode in ("all", "correct"):
    for variant, B, H, T, d in cases:
        try:
            from kernels.synthetic import dit_like_qkv
            q = torch.randn(B, H, T, 128, device=dev, dtype=torch.bfloat16)
            k = torch.randn(B, H, T, 128, device=dev, dtype=torch.bfloat16)
            v = torch.randn(B, H, T, 128, device=dev, dtype=torch.bfloat16)
            cfg = SparseConfig(density=d, variant=variant, scale=128 ** -0.5)
            st, idx, vbias = prepare(q, k, v, cfg)
            o_t = TF.attention(q, k, v, torch.empty_like(q), st, idx, vbias, cfg)
            t1 = time.time()
            o_c = CF.attention(q, k, v, torch.empty_like(q), st, idx, vbias, cfg)
            torch.cuda.synchronize()
            e = rel(o_c, o_t)
            nan = bool(torch.isnan(o_c).any())
            msg = f"{variant} B{B} H{H} T{T} d{d}: cute vs triton rel {e:.2e} nan={nan} ({time.time()-t1:.1f}s)"
            if d == 1.0:
                ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
                msg += f" vs sdpa {rel(o_c, ref):.2e}"
            print(msg, flush=True)
            out[f"{variant}_{B}_{H}_{T}_{d}"] = e
        except Exception as ex:
            traceback.print_exc()
            print("FAIL", variant, B, H, T, d, ex, flush=True)
    print("compile", CF.compile_stats(), flush=True)
if mode in ("all", "perf"):
    B, H, T = 1, 40, 32760
    from kernels.synthetic import dit_like_qkv
    from kernels.reorder import orders_on, apply_reorder
    perm, _ = orders_on((21, 30, 52), torch.device(dev))
    qd, kd, vd = (apply_reorder(x, perm, 0).contiguous() for x in dit_like_qkv((21, 30, 52), heads=H, head_dim=128, dtype=torch.bfloat16, device=dev))
    qr = torch.randn(B, H, T, 128, device=dev, dtype=torch.bfloat16)
    kr = torch.randn_like(qr); vr = torch.randn_like(qr)
    from bench_attention import event_ms as timeit
    import kernels.cute as KC, kernels.triton as KT
    for data, (q, k, v) in (("random", (qr, kr, vr)), ("ditlike-morton", (qd, kd, vd))):
     for variant in ("pwt", "drop"):
        cfg = SparseConfig(density=0.125, variant=variant, scale=128 ** -0.5)
        st, idx, vbias = prepare(q, k, v, cfg)
        o = torch.empty_like(q)
        tt = timeit(lambda: TF.attention(q, k, v, o, st, idx, vbias, cfg))
        line = f"wan14b {data} {variant} d0.125 attention-only: triton {tt:.2f} ms"
        for stg in (3, 4, 5, 6):
            try:
                tc = timeit(lambda: CF.attention(q, k, v, o, st, idx, vbias, cfg, kv_stages=stg))
                line += f" | cute s{stg} {tc:.2f} ms"
            except Exception as ex:
                line += f" | cute s{stg} FAIL {str(ex)[:100]}"
        print(line, flush=True)

        tf_t = timeit(lambda: KT.forward(q, k, v, cfg))
        tf_c = timeit(lambda: KC.forward(q, k, v, cfg))
        print(f"   full operator: triton {tf_t:.2f} ms  cute {tf_c:.2f} ms  speedup {tf_t/tf_c:.2f}x", flush=True)
