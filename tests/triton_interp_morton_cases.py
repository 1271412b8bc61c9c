"""The Morton cases of the Triton backend under TRITON_INTERPRET=1 on CPU (tiny sizes); prints one JSON object.

Split from triton_interp_cases.py (same conventions): the gather / scatter kernels and the fused reorder, and the
Morton path's block-order copies per head chunk (their allocations counted), the rolled chunks (PSA_MORTON_ROLL)
among them. Run by tests/test_triton_interpret.py in a subprocess (TRITON_INTERPRET must be set before Triton is
imported).
"""
import json
import math
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from kernels import triton as kt  # noqa: E402
from kernels.reorder import apply_reorder, orders_on  # noqa: E402
from kernels.triton import fwd  # noqa: E402
from interp_common import case_recorder, cfg_of, rnd  # noqa: E402

RES = {}
case = case_recorder(RES)


@case("morton_gather_scatter_and_fused_reorder")
def _():
    grid, npre = (3, 8, 8), 5
    T = npre + math.prod(grid)
    q, k, v = (rnd(1, 2, T, 64, seed=80 + s) for s in range(3))
    perm, inv = orders_on(grid, "cpu")
    g = kt.gather_tokens(q, perm, npre)
    out = {"gather_equals_apply_reorder": bool(torch.equal(g, apply_reorder(q, perm, npre))),
           "scatter_undoes_gather": bool(torch.equal(kt.scatter_tokens(g, perm, npre), q))}
    cfg = cfg_of(64, 0.4, "pwt", band=0)
    fused = kt.forward(q, k, v, cfg, perm=perm, n_prefix=npre)
    sep = kt.gather_tokens(kt.forward(*(kt.gather_tokens(x, perm, npre) for x in (q, k, v)), cfg), inv, npre)
    out["fused_vs_separate_maxdiff"] = float((fused - sep).abs().max())
    # the statistics kernel's gather (default) and the kernels reading through the permutation, every
    # variant, on [B, L, H, D] memory seen as [B, H, L, D] (the node's layout): the output keeps that layout
    for var in ("pwt", "pisa", "drop"):
        c = cfg_of(64, 0.4, var, band=0, sinks=1)
        qt, kt_, vt = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
        sep = kt.gather_tokens(kt.forward(*(kt.gather_tokens(x, perm, npre) for x in (q, k, v)), c), inv, npre)
        via_stats = kt.forward(qt, kt_, vt, c, perm=perm, n_prefix=npre)
        via_attn = kt._forward_impl(qt, kt_, vt, c, perm=perm, n_prefix=npre, reorder_in="attention")
        out[f"{var}_stats_vs_separate"] = float((via_stats - sep).abs().max())
        out[f"{var}_attention_vs_separate"] = float((via_attn - sep).abs().max())
        out[f"{var}_stats_keeps_layout"] = via_stats.stride() == qt.stride()
    return out


class _BigAllocs(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the bytes of every tensor of at least `floor` bytes that kernels/triton/__init__.py allocates
    itself (torch.empty / empty_like called there; the interpreter's own copies are not counted)."""

    def __init__(self, floor):
        super().__init__()
        self.floor, self.sizes = floor, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.__name__.startswith("empty") and isinstance(out, torch.Tensor):
            nbytes = out.numel() * out.element_size()
            f = sys._getframe(1)
            while f is not None and "/torch/" in f.f_code.co_filename:
                f = f.f_back
            if nbytes >= self.floor and f is not None and f.f_code.co_filename.endswith(
                    os.path.join("kernels", "triton", "__init__.py")):
                self.sizes.append(nbytes)
        return out


@case("morton_copies_chunked_under_their_budget")
def _():
    # the node's layout ([B, L, H, D] seen as [B, H, L, D]), B = 2, H = 4, a 5-token prefix: the Triton attention
    # reads q and writes the output through the permutation; only k, v are copied, in head chunks whose copies
    # stay under PSA_MORTON_SCRATCH x q (MORTON_FLOOR lowered so that this tiny problem chunks)
    grid, npre = (3, 8, 8), 5
    T = npre + math.prod(grid)
    q, k, v = (rnd(2, T, 4, 64, seed=130 + s).transpose(1, 2) for s in range(3))
    q_bytes = q.numel() * q.element_size()
    perm, inv = orders_on(grid, "cpu")
    out, floor0, env0 = {}, kt.MORTON_FLOOR, os.environ.get("PSA_MORTON_SCRATCH")
    try:
        kt.MORTON_FLOOR = 0
        for var in ("pwt", "drop"):
            c = cfg_of(64, 0.4, var, band=0, sinks=1)
            sep = kt.gather_tokens(kt.forward(*(kt.gather_tokens(x.contiguous(), perm, npre) for x in (q, k, v)),
                                              c), inv, npre)

            def counted(attention=None, c=c, sep=sep):
                """The Morton call with `attention` (None: the backend's own): its largest difference from the
                separate passes, whether it keeps q's layout, and its large allocations in q's bytes."""
                mode = _BigAllocs(q_bytes // 4)
                with mode:
                    o = kt._forward_impl(q, k, v, c, perm=perm, n_prefix=npre, attention=attention)
                return {"maxdiff_vs_separate": float((o - sep).abs().max()), "keeps_layout": o.stride() == q.stride(),
                        "allocs_in_q": sorted(n / q_bytes for n in mode.sizes)}
            for frac in ("0", "1", "0.25"):
                os.environ["PSA_MORTON_SCRATCH"] = frac
                out[f"{var}_frac{frac}"] = dict(counted(), hc=kt._even_chunks(4, kt._copy_heads(q, 2)))
            # an attention that takes no permutation (CuTe's): q copied too, block-order output scattered back
            # (per chunk when the three copies split: at PSA_MORTON_SCRATCH=1 here 2 chunks of 2 heads)

            # ... or one that writes its output rows through the permutation (CuTe's OUT_PERM): row t of its
            # block-order result lands in row perm[t] of the caller's output, no scatter pass
            def out_perm_attention(qg, kg, vg, o_, *a, perm=None, **kw):
                tmp = fwd.attention(qg, kg, vg, torch.empty_like(qg), *a, **kw)
                o_[:, :, perm.long()] = tmp
                return o_
            out_perm_attention.writes_out_perm = lambda T, cfg: True

            # ... or one that reads the caller's query rows through it as well (CuTe's Q_PERM): k, v copied only,
            # as for this backend's own attention
            def q_perm_attention(q_, kg, vg, o_, *a, perm=None, kv_perm=True, **kw):
                assert not kv_perm and perm is not None
                p_ = perm.long()
                o_[:, :, p_] = fwd.attention(q_[:, :, p_], kg, vg, torch.empty_like(kg), *a, **kw)
                return o_
            q_perm_attention.reads_q_perm = lambda T, cfg: True

            # ... or one without a permutation that can be asked to read q through it (CuTe's, PSA_MORTON_ROLL): in
            # head chunks its q copies go into the caller's output ahead of their chunk, the last chunk reads q
            # through the permutation: only the k, v copies are allocated
            def roll_attention(q_, kg, vg, o_, *a, perm=None, kv_perm=True, **kw):
                if perm is None:  # a block-order q copy, the output over it
                    return fwd.attention(q_, kg, vg, o_, *a, **kw)
                assert not kv_perm
                p_ = perm.long()
                o_[:, :, p_] = fwd.attention(q_[:, :, p_], kg, vg, torch.empty_like(kg), *a, **kw)
                return o_
            roll_attention.can_read_q_perm = True
            roll0 = os.environ.get("PSA_MORTON_ROLL")
            try:
                os.environ["PSA_MORTON_ROLL"] = "1"
                for frac in ("1", "0.5", "0"):  # 2 chunks of 2 heads, 4 of 1, one chunk (no roll: 3 copies)
                    os.environ["PSA_MORTON_SCRATCH"] = frac
                    out[f"{var}_roll_attention_frac{frac}"] = counted(roll_attention)
                # uneven chunks (3 + 1 heads: the 1-head chunk first, its copy where the 3 heads go) in both layouts
                fperm = kt._full_perm(perm, npre, T, q.device)
                for lay, args in (("node", (q, k, v)), ("raster", tuple(x.contiguous() for x in (q, k, v)))):
                    for bthd in (False, True):
                        o = kt._forward_rolled(*args, c, perm, fperm, npre, 3, 1 << 30, roll_attention, {}, bthd)
                        out[f"{var}_rolled_3_1_{lay}_bthd{int(bthd)}"] = float((o - sep).abs().max())
            finally:
                if roll0 is None:
                    os.environ.pop("PSA_MORTON_ROLL", None)
                else:
                    os.environ["PSA_MORTON_ROLL"] = roll0
            for frac in ("1", "0"):
                os.environ["PSA_MORTON_SCRATCH"] = frac
                for name, att in (("no_perm", lambda *a, **kw: fwd.attention(*a, **kw)),
                                  ("out_perm", out_perm_attention), ("q_perm", q_perm_attention)):
                    out[f"{var}_{name}_attention_frac{frac}"] = counted(att)
    finally:
        kt.MORTON_FLOOR = floor0
        if env0 is None:
            os.environ.pop("PSA_MORTON_SCRATCH", None)
        else:
            os.environ["PSA_MORTON_SCRATCH"] = env0
    # real sizes with the real floor: Wan2.1-14B 480p / 720p (40 heads) two chunks, Wan2.1-1.3B 480p and FLUX.1
    # 1024^2 one (their copies fit MORTON_FLOOR)
    meta = lambda B, H, T, D: torch.empty(B, H, T, D, dtype=torch.bfloat16, device="meta")  # noqa: E731
    out["real_hc"] = {name: kt._even_chunks(s[1], kt._copy_heads(meta(*s), 2, 1.0)) for name, s in
                      (("wan14_480p", (1, 40, 32760, 128)), ("wan14_720p", (1, 40, 75600, 128)),
                       ("wan13_480p", (1, 12, 32760, 128)), ("flux_1024", (1, 24, 4608, 128)))}
    # at the default budget (frac None: 1, and 0.5 from MORTON_LARGE_BYTES of q): 720p's 738 MiB of q in 4 chunks
    out["default_hc"] = {name: kt._even_chunks(s[1], kt._copy_heads(meta(*s), 2)) for name, s in
                         (("wan14_480p", (1, 40, 32760, 128)), ("wan14_720p", (1, 40, 75600, 128)),
                          ("wan13_480p", (1, 12, 32760, 128)), ("flux_1024", (1, 24, 4608, 128)))}
    # the rolled chunks (PSA_MORTON_ROLL, PSA_MORTON_SCRATCH unset): the k, v copies under 0.75x q, so 480p in 3
    # chunks of 14 heads, 720p in 4 as the others, the smaller ones in one
    scratch0 = os.environ.pop("PSA_MORTON_SCRATCH", None)
    try:
        out["roll_hc"] = {name: kt._roll_heads(meta(*s), s[1]) for name, s in
                          (("wan14_480p", (1, 40, 32760, 128)), ("wan14_720p", (1, 40, 75600, 128)),
                           ("wan13_480p", (1, 12, 32760, 128)), ("flux_1024", (1, 24, 4608, 128)))}
    finally:
        if scratch0 is not None:
            os.environ["PSA_MORTON_SCRATCH"] = scratch0
    # the three copies of an attention without a permutation: both limits x 1.5, so the same chunks
    out["real_hc_3copies"] = {
        name: kt._even_chunks(s[1], kt._copy_heads(meta(*s), 3, 1.5, int(1.5 * kt.MORTON_FLOOR))) for name, s in
        (("wan14_480p", (1, 40, 32760, 128)), ("wan14_720p", (1, 40, 75600, 128)),
         ("wan13_480p", (1, 12, 32760, 128)), ("flux_1024", (1, 24, 4608, 128)))}
    return out


print("RESULTS_JSON " + json.dumps(RES))
