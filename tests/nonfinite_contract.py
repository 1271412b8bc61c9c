"""The non-finite contract of the operator (issue 12, class 1; ../shared/MATH.md "Non-finite inputs"), as data.

For every variant, backend and density, a row of the output is NaN/inf only where dense attention's row is
(dense = explicit softmax in float64 on the same values). One call covers every placement at once: each
head carries one kind of poison (heads are independent in attention):

    head 0  clean                            head 4  -inf key element in the sink block 0
    head 1  NaN query element                head 5  +inf key element in the short last block
    head 2  +inf query element               head 6  +inf and -inf keys in block 2 (its k-bar is NaN)
    head 3  +inf key element in block 3      head 7  +inf value element (dense: every row non-finite)

T = 350 (N = 6 blocks of 64, the last of 30 tokens), band 0, one sink block: S_i = {0, i} plus the top-k, so at
density 0.5 block 3 is the band of query block 3, exact through the top-k or a virtual token elsewhere (the
result records that it was virtual for some query block). `finite_inputs_case` covers huge finite values
(float16 near its maximum, a float16 H-bar above 65504 from moderate values, large float32, a first-order term
beyond the float16 range): the output must be finite everywhere.

Used in-process by tests/test_nonfinite.py (torch reference; Triton / CuTe on CUDA) and, for the Triton
kernels under TRITON_INTERPRET=1, as a subprocess: `python tests/nonfinite_contract.py` prints one JSON line.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

T, BS, H = 350, 64, 8
VARIANTS = ("pwt", "pisa", "drop")
DENSITIES = (0.25, 0.5, 1.0)
INF, NAN = float("inf"), float("nan")
# head -> [(tensor, token, dim, value)]
POISON = {
    1: [("q", 5, 3, NAN)],
    2: [("q", 200, 1, INF)],
    3: [("k", 3 * BS + 7, 3, INF)],
    4: [("k", 10, 2, -INF)],
    5: [("k", 330, 5, INF)],
    6: [("k", 2 * BS + 2, 0, INF), ("k", 2 * BS + 12, 1, -INF)],
    7: [("v", 100, 4, INF)],
}


def poisoned_inputs(D=64, dtype=None, device="cpu", seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, T, D, generator=g, dtype=torch.float64) for _ in range(3))
    named = {"q": q, "k": k, "v": v}
    for h, places in POISON.items():
        for name, t, d, val in places:
            named[name][0, h, t, d] = val
    return tuple(x.to(device=device, dtype=dtype or torch.float32) for x in (q, k, v))


def dense_float64(q, k, v, scale=None):
    """Explicit softmax attention in float64 (the oracle): [B, H, T, D]."""
    import torch

    q, k, v = (x.double() for x in (q, k, v))
    s = q.shape[-1] ** -0.5 if scale is None else scale
    p = torch.softmax((q @ k.transpose(-1, -2)) * s, dim=-1)
    return p @ v


def row_finite(x):
    import torch

    return torch.isfinite(x).all(-1)


def run(backend, variant, density, dtype, q, k, v, sinks=1):
    from kernels import piecewise_sparse_attention as psa

    return psa(q, k, v, density=density, variant=variant, band=0, n_sink_blocks=sinks, backend=backend,
               on_failure="raise")


def poisoned_case(backend, variant, density, dtype_name, D=64, device="cpu"):
    """{"spurious": rows non-finite where dense is finite (must be 0), "missing": rows finite where dense is
    not, "rows": dense-finite rows, "d1_err": at density 1 the max |ours - dense| / max |dense| over the
    dense-finite rows, "block3_virtual": the poisoned block 3 is a virtual token for some query block}."""
    import torch

    from kernels.config import SparseConfig
    from kernels.routing import block_stats, route

    dtype = getattr(torch, dtype_name)
    q, k, v = poisoned_inputs(D, dtype, device)
    out = run(backend, variant, density, dtype, q, k, v)
    dense = dense_float64(q, k, v)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.double().cpu(), k.double().cpu(), v.double().cpu())
    ok_dense = row_finite(dense).cpu()
    ok = row_finite(out).cpu()
    res = {"spurious": int((~ok & ok_dense).sum()), "missing": int((ok & ~ok_dense).sum()),
           "rows": int(ok_dense.sum()), "oracles_agree": bool(torch.equal(ok_dense, row_finite(sdpa))),
           "shape_ok": out.shape == q.shape and out.dtype == q.dtype,
           "spurious_heads": sorted({int(h) for h in torch.nonzero(~ok & ok_dense)[:, 1].tolist()})}
    if density == 1.0:
        m = ok_dense[..., None].expand_as(dense).to(dense.device)
        diff = (out.double() - dense).abs()[m & torch.isfinite(out.double())]
        res["d1_err"] = float(diff.max() / dense.abs()[m].max()) if diff.numel() else 0.0
    cfg = SparseConfig(density=density, variant=variant if variant != "drop" else "pisa", band=0, n_sink_blocks=1,
                       scale=D ** -0.5)
    exact = route(block_stats(q.double(), k.double(), v.double(), BS), cfg).exact[0, 3].cpu()  # head 3
    res["block3_virtual"] = bool((~exact[:, 3]).any())
    return res


# kind -> (densities, n_sink_blocks) it runs at
FINITE_KINDS = {"fp16_near_max": ((0.5, 1.0), 1), "fp16_hbar_above_65504": ((0.5, 1.0), 1),
                "fp32_large": ((0.5, 1.0), 1), "fp16_first_order_beyond_range": ((0.125,), 0)}


def finite_inputs(kind, D=64, device="cpu", seed=1):
    """Finite inputs that overflow a careless float16 or float32 path; (q, k, v) in the kind's dtype."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def rnd():
        return torch.randn(1, 2, T, D, generator=g, dtype=torch.float64)
    if kind == "fp16_near_max":
        # |x| in [3e4, 6e4], random signs: k - k-bar reaches 1.2e5 and H_j ~ 1e11, both beyond float16
        q, k, v = (torch.sign(rnd()) * (3e4 + 3e4 * torch.rand(1, 2, T, D, generator=g, dtype=torch.float64))
                   for _ in range(3))
        dtype = torch.float16
    elif kind == "fp16_hbar_above_65504":
        # moderate values, keys = values: H-bar's diagonal ~ 64 * 40^2 = 1e5 does not fit a float16
        q = rnd() * 0.05
        k = rnd() * 40
        v = k.clone()
        dtype = torch.float16
    elif kind == "fp32_large":
        q, k, v = (rnd() * 1e6 for _ in range(3))
        dtype = torch.float32
    elif kind == "fp16_first_order_beyond_range":
        # every query along u; block 0 (query block 0's only exact block at density 1/6 without sinks) points
        # away from u, every other block's k-bar along u with a spread of 3e4 inside it: query block 0's mass
        # is in virtual tokens whose first-order term s q H-bar (~1e10 in float32) leaves the float16 range,
        # while dense attention (a convex mix of the values) stays below 6e4
        u = rnd()[0, 0, 0]
        u = u / u.norm()
        q = (u * 400).expand(1, 2, T, D).clone()
        k = rnd().clamp(-1.9, 1.9) * 3e4 + u * 300
        k[..., :BS, :] = -u * 300
        v = k.clone()
        dtype = torch.float16
    else:
        raise ValueError(kind)
    return tuple(x.to(device=device, dtype=dtype) for x in (q, k, v))


def finite_inputs_case(backend, variant, density, kind, D=64, device="cpu", sinks=1):
    """{"nonfinite": output elements that are NaN/inf (must be 0), "dense_finite": the float64 oracle is finite,
    "hbar_rel": the backend's H-bar against float64 (pisa, pwt), "rel_vs_ref64": rel. L2 distance to the float64
    reference under the same routing, with torch's own float16 error beside it (fp16_hbar_above_65504)}."""
    import torch

    from kernels import reference
    from kernels.config import SparseConfig
    from kernels.routing import block_stats, route

    q, k, v = finite_inputs(kind, D, device)
    out = run(backend, variant, density, q.dtype, q, k, v, sinks=sinks)
    res = {"nonfinite": int((~torch.isfinite(out)).sum()), "inputs_finite": all(bool(torch.isfinite(x).all())
                                                                               for x in (q, k, v)),
           "dense_finite": bool(torch.isfinite(dense_float64(q, k, v)).all())}
    if variant != "drop":
        # H-bar as the backend computes it against float64: k - k-bar reaches 2 max|k| (fp16_near_max)
        hb64 = block_stats(*(x.double() for x in (q, k, v)), BS).hbar
        if backend == "torch":
            hb = block_stats(q, k, v, BS).hbar
        else:
            from kernels.triton import stats as tstats
            cfg = SparseConfig(density=density, variant=variant, band=0, n_sink_blocks=sinks, scale=D ** -0.5)
            st_t = tstats.block_stats(q, k, v, cfg)
            tstats.finalize_hbar(st_t, -(-q.shape[-2] // BS), q.dtype)  # H-bar from the statistics' partials
            hb = st_t.hbar
        res["hbar_rel"] = float((hb.double() - hb64).norm() / hb64.norm())
    if kind == "fp16_hbar_above_65504":
        cfg = SparseConfig(density=density, variant=variant, band=0, n_sink_blocks=1, scale=D ** -0.5)
        q64, k64, v64 = (x.double() for x in (q, k, v))
        st = block_stats(q64, k64, v64, BS)
        r = route(st, cfg)
        ref = reference.forward(q64, k64, v64, cfg, routing=r, stats=st)
        if backend == "torch":
            got = reference.forward(q, k, v, cfg, routing=r)
        else:
            from kernels import triton as kt
            got = kt.forward_with_routing(q, k, v, cfg, r)
        res["hbar_max"] = float(st.hbar.abs().max())
        res["rel_vs_ref64"] = float((got.double() - ref).norm() / ref.norm())
        # torch's own float16 error on this problem (float32 compute, float16 output), the honest yardstick
        own = reference.forward(q.float(), k.float(), v.float(), cfg, routing=r).half()
        res["torch_fp16_rel"] = float((own.double() - ref).norm() / ref.norm())
    return res


def all_cases(backend, dtypes=("float32", "float16"), D=64, device="cpu"):
    out = {}
    for dt in dtypes:
        for variant in VARIANTS:
            for density in DENSITIES:
                key = f"{variant}-d{density}-{dt}"
                try:
                    out[key] = poisoned_case(backend, variant, density, dt, D, device)
                except Exception:
                    out[key] = {"error": traceback.format_exc()}
    for kind, (densities, sinks) in FINITE_KINDS.items():
        for variant in VARIANTS:
            for density in densities:
                key = f"{kind}-{variant}-d{density}"
                try:
                    out[key] = finite_inputs_case(backend, variant, density, kind, D, device, sinks)
                except Exception:
                    out[key] = {"error": traceback.format_exc()}
    return out


def autograd_case(backend="triton"):
    """Inputs that require grad: "auto" must differentiate (the torch reference while `backend` has no backward),
    an explicit `backend` without a backward must raise naming it."""
    import torch

    from kernels import dispatch
    from kernels import piecewise_sparse_attention as psa

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 130, 64, generator=g).requires_grad_() for _ in range(3))
    res = {"differentiable": backend in dispatch.DIFFERENTIABLE}
    out = psa(q, k, v, density=0.5)
    res["auto_grad_fn"] = out.grad_fn is not None
    out.sum().backward()
    res["grads_finite"] = all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v))
    try:
        res["explicit_grad_fn"] = psa(q, k, v, density=0.5, backend=backend).grad_fn is not None
        res["explicit_error"] = None
    except ValueError as e:
        res["explicit_grad_fn"], res["explicit_error"] = None, str(e)
    with torch.no_grad():
        res["no_grad_backend"] = dispatch.select_backend(q, _cfg(), "auto", k=k, v=v)[0]
    return res


def _cfg():
    from kernels.config import SparseConfig
    return SparseConfig(density=0.5, scale=0.125)


def case_ids(dtypes=("float32", "float16")):
    poisoned = [f"{v}-d{d}-{dt}" for dt in dtypes for v in VARIANTS for d in DENSITIES]
    finite = [f"{kind}-{v}-d{d}" for kind, (ds, _) in FINITE_KINDS.items() for v in VARIANTS for d in ds]
    return poisoned, finite


if __name__ == "__main__":
    # the Triton kernels under the interpreter: TRITON_INTERPRET must be set before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = all_cases(sys.argv[1] if len(sys.argv) > 1 else "triton")
    try:
        res["autograd"] = autograd_case()
    except Exception:
        res["autograd"] = {"error": traceback.format_exc()}
    print("RESULTS_JSON " + json.dumps(res))
