"""Checks of the Triton backward under TRITON_INTERPRET=1 on CPU, at tiny sizes; prints one JSON object.

Run by tests/test_backward_triton_interpret.py in a subprocess (TRITON_INTERPRET must be set before Triton is
imported). The oracle is autograd through the float64 PyTorch reference under the same exact sets (its w
keeps the graph to q^2 and sigma^2); float32 inputs, so the kernels must match it to float32 rounding.
"""
import json
import math
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels import reference  # noqa: E402
from kernels import triton as kt  # noqa: E402
from kernels.routing import block_stats, route  # noqa: E402
from kernels.triton import train  # noqa: E402
from gpu_common import reference_grads  # noqa: E402
from interp_common import case_recorder, cfg_of, rel, rnd  # noqa: E402

RES = {}
case = case_recorder(RES)


def same_routing(q, k, v, cfg, seed=7):
    do = rnd(*q.shape, seed=seed, dtype=q.dtype)
    r, ref_out, ref_g = reference_grads(q, k, v, do, cfg)
    out, lse, vbias, st = train.forward_saving(q, k, v, cfg, routing=r)
    g = train.backward(do, q, k, v, out, lse, vbias, st, cfg)
    res = {"out": rel(out, ref_out)}
    for name, a, b in zip(("dq", "dk", "dv"), g, ref_g):
        res[name] = rel(a, b)
        res[name + "_finite"] = bool(torch.isfinite(a).all())
    res["dtype_ok"] = all(x.dtype == q.dtype for x in g)
    return res


def gated(q, k, block, factor=3.5):
    """Widen one key block around its mean (its sigma^2 x factor^2, k-bar unchanged) so that its PWT bonus
    exceeds ln 64 (gated, w ~ 0.5 -> ~6 on these inputs) while the other blocks stay open."""
    k = k.clone()
    kb = k[..., block * 64:(block + 1) * 64, :]
    k[..., block * 64:(block + 1) * 64, :] = kb.mean(-2, keepdim=True) + factor * (kb - kb.mean(-2, keepdim=True))
    return q, k


def gate_sides(q, k, v, cfg):
    st = block_stats(q.double(), k.double(), v.double(), 64)
    w = 0.5 * cfg.scale ** 2 * st.q2 @ st.ksig2.transpose(-1, -2)
    return {"gated": bool((w > math.log(64)).any()), "open": bool((w <= math.log(64)).any())}


for variant in ("pwt", "pisa", "drop"):
    @case(f"fp32_T200_D64_{variant}")
    def _(variant=variant):
        q, k, v = (rnd(1, 2, 200, 64, seed=s) for s in range(3))
        q, k = gated(q, k, 1)
        cfg = cfg_of(64, 0.3, variant, band=0)
        r = same_routing(q, k, v, cfg)
        r.update(gate_sides(q, k, v, cfg))
        return r


@case("dit_like_pwt_every_statistic_path_is_exercised")
def _():
    # DiT-like inputs (smooth fields + RoPE) with one wild key block (its w gated): the kernels' gradients
    # against the reference, and how far the reference's own gradient moves when one statistic's path is cut
    # (detached): each must move far more than the tolerance, so the comparison sees every path
    from kernels.routing import BlockStats
    from kernels.synthetic import dit_like_qkv
    q, k, v = (x.float() for x in dit_like_qkv((4, 8, 8), heads=2, head_dim=64, dtype=torch.float64))
    q, k = gated(q, k, 2)
    cfg = cfg_of(64, 0.25, "pwt", band=0)
    res = same_routing(q, k, v, cfg)
    res.update(gate_sides(q, k, v, cfg))
    do = rnd(*q.shape, seed=7)

    def ref(cut):
        a, b, c = (x.double().requires_grad_(True) for x in (q, k, v))
        st = block_stats(a, b, c, 64)
        r = route(st, cfg)
        if cut == "w":
            r = type(r)(idx=r.idx, exact=r.exact, w=r.w.detach())
        elif cut is not None:
            fields = {f: getattr(st, f) for f in ("kbar", "vsum", "ksig2", "counts", "qbar", "q2", "hbar", "hnorm")}
            fields[cut] = fields[cut].detach()
            st = BlockStats(**fields)
            r = route(st, cfg)
        return torch.autograd.grad(reference.forward(a, b, c, cfg, routing=r, stats=st), (a, b, c), do.double())

    full = ref(None)
    res["cut"] = {}
    for cut in ("kbar", "vsum", "hbar", "ksig2", "q2", "w"):
        part = ref(cut)
        res["cut"][cut] = max(rel(x, y) for x, y in zip(part, full))
    return res


@case("fp32_B2_T130_D128_pwt_sinks_band")
def _():
    q, k, v = (rnd(2, 1, 130, 128, seed=10 + s) for s in range(3))
    return same_routing(q, k, v, cfg_of(128, 0.3, "pwt", band=1, sinks=1))


@case("fp32_T300_D64_pisa_cov_bias_many_virtual_tiles")
def _():
    # 5 KV blocks with a 44-token last one; cov_bias only routes (no gradient through the norms)
    q, k, v = (rnd(1, 1, 300, 64, seed=20 + s) for s in range(3))
    return same_routing(q, k, v, cfg_of(64, 0.4, "pisa", band=0, cov=True))


@case("fp32_T40_shorter_than_a_block")
def _():
    q, k, v = (rnd(1, 2, 40, 64, seed=30 + s) for s in range(3))
    return same_routing(q, k, v, cfg_of(64, 0.5, "pwt"))


@case("head_chunks_equal_one_pass_B2")
def _():
    # one head per chunk (forward and backward), B = 2 so a chunk of the row statistics is not contiguous
    q, k, v = (rnd(2, 3, 200, 64, seed=70 + s) for s in range(3))
    do = rnd(2, 3, 200, 64, seed=74)
    out = {}
    for var in ("pwt", "drop"):
        cfg = cfg_of(64, 0.3, var, band=0)
        whole = train.backward(do, q, k, v, *train.forward_saving(q, k, v, cfg), cfg)
        orig = train._heads_per_chunk
        try:
            train._heads_per_chunk = lambda *a: 1
            saved = train.forward_saving(q, k, v, cfg)
            chunked = train.backward(do, q, k, v, *saved, cfg)
        finally:
            train._heads_per_chunk = orig
        out[var] = max(rel(a, b) for a, b in zip(chunked, whole))
    return out


@case("density_one_equals_sdpa_gradients")
def _():
    q, k, v = (rnd(1, 2, 130, 64, seed=60 + s) for s in range(3))
    do = rnd(1, 2, 130, 64, seed=64)
    q64, k64, v64 = (x.double().requires_grad_(True) for x in (q, k, v))
    want = torch.autograd.grad(F.scaled_dot_product_attention(q64, k64, v64), (q64, k64, v64), do.double())
    out = {}
    for var in ("pwt", "pisa", "drop"):
        a, b, c = (x.clone().requires_grad_(True) for x in (q, k, v))
        o = kt.forward(a, b, c, cfg_of(64, 1.0, var))
        got = torch.autograd.grad(o, (a, b, c), do)
        out[var] = max(rel(x, y) for x, y in zip(got, want))
    return out


@case("api_morton_prefix_batch2_transposed_views_autograd")
def _():
    # the whole api path with autograd: differentiable gather, the training op, differentiable scatter
    from kernels import dispatch, piecewise_sparse_attention as psa
    grid, npre = (3, 8, 8), 9
    T = npre + math.prod(grid)
    base = [rnd(2, T, 2, 64, seed=110 + s) for s in range(3)]
    do = rnd(2, 2, T, 64, seed=114)
    kw = dict(density=0.25, variant="pwt", band=0, reorder="morton", grid=grid, n_prefix=npre)

    def run(dtype, backend):
        leaves = [x.to(dtype).requires_grad_(True) for x in base]
        q, k, v = (x.transpose(1, 2) for x in leaves)
        out = psa(q, k, v, backend=backend, **kw)
        return out, torch.autograd.grad(out, leaves, do.to(dtype))

    out, g = run(torch.float32, "triton")
    ref, g64 = run(torch.float64, "torch")
    cfg = cfg_of(64, 0.25, "pwt", band=0)
    res = {"out": rel(out, ref), "backend": dispatch.select_backend(out, cfg, "triton")[0],
           "has_grad_fn": out.grad_fn is not None,
           "fell_back": sorted(x for x in dispatch._logged if x.startswith(("fail:", "gather:")))}
    for name, a, b in zip(("dq", "dk", "dv"), g, g64):
        res[name] = rel(a, b)
    return res


@case("fp16_T200_D64_pwt_within_twice_torch_fp16_error")
def _():
    q, k, v = (rnd(1, 1, 200, 64, seed=50 + s, dtype=torch.float16) for s in range(3))
    cfg = cfg_of(64, 0.3, "pwt", band=0)
    r = same_routing(q, k, v, cfg)
    # PyTorch's own float16 error on this problem: the reference's autograd run on float16-rounded float32
    # math with float16 outputs of each gradient (its compute dtype is float32), against float64
    do = rnd(1, 1, 200, 64, seed=7, dtype=torch.float16)
    _, _, g64 = reference_grads(q, k, v, do, cfg)
    qf, kf, vf = (x.float().requires_grad_(True) for x in (q, k, v))
    st = block_stats(qf, kf, vf, 64)
    o = reference.forward(qf, kf, vf, cfg, routing=route(st, cfg), stats=st).half()
    g16 = torch.autograd.grad(o.float(), (qf, kf, vf), do.float())
    r["torch_fp16"] = {n: rel(a.half(), b) for n, a, b in zip(("dq", "dk", "dv"), g16, g64)}
    return r


@case("custom_ops_opcheck")
def _():
    q, k, v = (rnd(1, 1, 100, 64, seed=90 + s).requires_grad_(True) for s in range(3))
    res = {}
    for var in ("pwt", "drop"):
        args = (q, k, v, 0.5, var, 0, 0, False, 64, 0.125)
        r = torch.library.opcheck(torch.ops.psa.triton_train_fwd.default, args,
                                  test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
        res.update({f"{var}:{k2}": str(v2) for k2, v2 in r.items()})
    x = rnd(1, 2, 21, 64, seed=95).requires_grad_(True)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    r = torch.library.opcheck(torch.ops.psa.permute_tokens.default, (x, perm, 5, False),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    res.update({f"permute:{k2}": str(v2) for k2, v2 in r.items()})
    return res


@case("compiled_training_step_aot_eager_and_dynamic_length")
def _():
    # torch.compile sees one differentiable op (fakes + register_autograd): no graph break, the gradients of
    # eager mode, and a second sequence length (automatic dynamic shapes: the fakes on a symbolic T)
    cfg = cfg_of(64, 0.3, "pwt", band=0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 64)

        def forward(self, x):
            return kt.forward(self.proj(x), x, x, cfg).square().mean()

    torch.manual_seed(0)
    m = Block()
    res = {"graph_breaks": torch._dynamo.explain(m)(rnd(1, 2, 200, 64, seed=130)).graph_break_count}
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    for T in (200, 300):
        x = rnd(1, 2, T, 64, seed=131 + T)
        eager = torch.autograd.grad(m(x), list(m.parameters()))
        comp = torch.autograd.grad(cm(x), list(m.parameters()))
        res[f"T{T}"] = max(rel(a, b) for a, b in zip(comp, eager))
    return res


@case("permute_tokens_gradient_is_the_inverse_permutation")
def _():
    x = rnd(1, 2, 21, 64, seed=96).requires_grad_(True)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(1))
    g = rnd(1, 2, 21, 64, seed=97)
    y = kt.gather_tokens(x, perm, 5)
    (gx,) = torch.autograd.grad(y, x, g)
    return {"gather_equal": bool(torch.equal(y, torch.cat([x[..., :5, :], x[..., 5:, :][..., perm, :]], -2))),
            "grad_is_scatter": bool(torch.equal(gx, kt.scatter_tokens(g, perm, 5))),
            "no_grad_path_plain": kt.gather_tokens(x.detach(), perm, 5).grad_fn is None}


@case("inference_path_unchanged_without_grad")
def _():
    # no tensor needs a gradient: the forward op psa::triton_fwd runs, as before (no saved statistics)
    q, k, v = (rnd(1, 2, 200, 64, seed=120 + s) for s in range(3))
    cfg = cfg_of(64, 0.3, "pwt", band=0)
    a = kt.forward(q, k, v, cfg)
    qa = q.clone().requires_grad_(True)
    b = kt.forward(qa, k, v, cfg)
    with torch.no_grad():
        c = kt.forward(qa, k, v, cfg)
    return {"plain_no_grad_fn": a.grad_fn is None, "train_has_grad_fn": b.grad_fn is not None,
            "no_grad_mode_no_grad_fn": c.grad_fn is None, "train_equals_inference": rel(b.detach(), a)}


print("RESULTS_JSON " + json.dumps(RES))
