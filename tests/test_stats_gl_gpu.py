"""The Gluon statistics kernel (kernels/triton/stats_gl.py, PSA_STATS_GLUON=1) on an SM90 GPU: every statistic and
H-bar against the float64 reference and against the Triton kernel (stats_h) it replaces, in the raster and node
layouts, bfloat16 and float16, pwt and pisa, short last blocks, batch 2, a head chunk's view, keys with a large common
offset, and non-finite inputs (the flagged programs redone by stats_h's fix-up launch, equal to stats_h's outputs).
Skipped without an SM90 GPU (CI); run on the H200 with `pytest -m gpu tests/test_stats_gl_gpu.py`."""
import math

import pytest
import torch

from gpu_common import cfg_of, rnd

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs an SM90 GPU")]

NAMES = ("kbar", "qbar", "q2", "ksig2", "kbar_lp", "vmean_lp", "hbar")


def _stats(q, k, v, variant, gluon, monkeypatch):
    from kernels.triton import stats as kts
    from kernels.triton import stats_gl
    monkeypatch.setenv("PSA_STATS_GLUON", "1" if gluon else "0")
    assert stats_gl.usable(q, k, v, None, None) == gluon
    st = kts.block_stats(q, k, v, cfg_of(q.shape[-1], 0.125, variant))
    kts.finalize_hbar(st, st.kbar.shape[-2], q.dtype)
    return {n: getattr(st, n) for n in NAMES if getattr(st, n) is not None}


def _ref(q, k, v):
    from kernels.routing import block_stats
    r = block_stats(q.double(), k.double(), v.double(), 64)
    return {"kbar": r.kbar, "qbar": r.qbar, "q2": r.q2, "ksig2": r.ksig2, "hbar": r.hbar}


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _check(q, k, v, variant, monkeypatch, tol=2e-5):
    gl_out = _stats(q, k, v, variant, True, monkeypatch)
    tr_out = _stats(q, k, v, variant, False, monkeypatch)
    ref = _ref(q, k, v)
    assert set(gl_out) == set(tr_out)
    for n, x in gl_out.items():
        assert x.shape == tr_out[n].shape and x.dtype == tr_out[n].dtype, n
        assert torch.isfinite(x).all(), n
        if n in ref:  # float32 statistics and H-bar: as close to float64 as the Triton kernel's, within tol
            e_gl, e_tr = _rel(x, ref[n]), _rel(tr_out[n], ref[n])
            assert e_gl <= max(tol, 4 * e_tr), f"{n}: rel {e_gl:.2e} (Triton {e_tr:.2e})"
        else:  # the input-dtype k-bar and value means: within one rounding of the Triton kernel's
            eps = torch.finfo(q.dtype).eps
            d = (x.float() - tr_out[n].float()).abs()
            assert (d <= eps * tr_out[n].float().abs() + 1e-6).all(), f"{n}: max diff {float(d.max()):.3e}"


@pytest.mark.parametrize("variant", ["pwt", "pisa"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(1, 4, 32760, 128), (2, 3, 4999, 128), (1, 2, 64, 128), (1, 1, 100, 128)],
                         ids=lambda s: "B{}_H{}_T{}_D{}".format(*s))
def test_raster_matches_reference_and_triton(variant, dtype, shape, monkeypatch):
    q, k, v = (rnd(shape, dtype=dtype, seed=s) for s in range(3))
    _check(q, k, v, variant, monkeypatch)


@pytest.mark.parametrize("T", [4608, 32760, 4097])
def test_node_layout_and_head_chunk(T, monkeypatch):
    """ComfyUI's [B, L, H * D] memory seen as [B, H, L, D], whole and as a chunk of heads 3 .. 6 (the operator's
    head chunking hands the kernel such slices)."""
    B, H, D = 2, 8, 128
    x = [rnd((B, T, H * D), seed=s) for s in range(3)]
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in x)
    _check(q, k, v, "pwt", monkeypatch)
    _check(q[:, 3:7], k[:, 3:7], v[:, 3:7], "pwt", monkeypatch)


def test_key_offset(monkeypatch):
    """Keys with a common offset of 4 (H-bar's raw K^T V minus its correction cancels; sigma^2 is centred)."""
    q, k, v = (rnd((1, 2, 8192 + 17, 128), seed=s) for s in range(3))
    _check(q, k + 4.0, v, "pwt", monkeypatch, tol=5e-5)


@pytest.mark.parametrize("where", ["k_inf", "v_nan", "q_inf", "q_nan_last_block"])
def test_nonfinite_inputs_as_triton(where, monkeypatch):
    """A program whose sums come out non-finite is flagged and redone by stats_h (FIX): the non-finite entries sit
    where the Triton kernel puts them (an inf in its own column, the block's H_j dropped) with the same values, and
    every finite entry is within float32 rounding of the Triton kernel's."""
    T = 64 * 300 + 5
    q, k, v = (rnd((1, 3, T, 128), seed=s) for s in range(3))
    t = {"k_inf": k, "v_nan": v, "q_inf": q, "q_nan_last_block": q}[where]
    row = T - 2 if where == "q_nan_last_block" else 777
    t[0, 1, row, 5] = float("nan") if "nan" in where else float("inf")
    gl_out = _stats(q, k, v, "pwt", True, monkeypatch)
    tr_out = _stats(q, k, v, "pwt", False, monkeypatch)
    for n in gl_out:
        a, b = gl_out[n].float(), tr_out[n].float()
        fa, fb = torch.isfinite(a), torch.isfinite(b)
        assert torch.equal(fa, fb), f"{n}: non-finite entries at other places ({int((fa != fb).sum())})"
        bad = ~fb
        assert torch.equal(torch.isnan(a[bad]), torch.isnan(b[bad])) and torch.equal(
            a[bad & ~torch.isnan(b)], b[bad & ~torch.isnan(b)]), f"{n}: non-finite values differ"
        lp = n in ("kbar_lp", "vmean_lp")
        # (float32 statistics: the Triton kernel's own sigma^2 is 2.5e-6 from float64 in rel L2, ~2e-5 per entry)
        tol = torch.finfo(q.dtype).eps * b[fb].abs() + 1e-6 if lp else 1e-4 * b[fb].abs().clamp_min(1.0)
        assert ((a[fb] - b[fb]).abs() <= tol).all(), f"{n}: max diff {float((a[fb] - b[fb]).abs().max()):.3e}"


def test_large_call_one_launch_per_sm(monkeypatch):
    """Wan2.1-14B 480p's 40 heads: the persistent grid covers every (head, partial) item; H-bar as the reference's."""
    q, k, v = (rnd((1, 40, 32760, 128), seed=s) for s in range(3))
    ref = _ref(q[:, :2], k[:, :2], v[:, :2])
    out = _stats(q, k, v, "pwt", True, monkeypatch)
    assert _rel(out["hbar"][:, :2], ref["hbar"]) < 2e-5
    assert math.isfinite(float(out["hbar"].float().abs().sum()))


@pytest.mark.parametrize("copy_q", [True, False], ids=["qkv_copies", "kv_copies"])
@pytest.mark.parametrize("grid,prefix", [((21, 30, 52), 0), ((8, 16, 16), 0), ((64, 64), 512), ((5, 7, 9), 3)])
def test_morton_gather_matches_triton(grid, prefix, copy_q, monkeypatch):
    """The Morton path: q, k, v in ComfyUI's layout read through the permutation (text prefix first), the
    block-order copies written from the staged tiles (equal to the Triton kernel's, bit for bit: both are the
    gathered rows), the statistics as the raster tests require."""
    from kernels.reorder import full_order, orders_on
    from kernels.triton import stats as kts
    from kernels.triton import stats_gl
    B, H, D = 1, 4, 128
    T = prefix + math.prod(grid)
    x = [rnd((B, T, H * D), seed=s) for s in range(3)]
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in x)
    perm = full_order(orders_on(grid, "cuda")[0], prefix)
    cfg = cfg_of(D, 0.125, "pwt")
    outs = {}
    for gluon in (True, False):
        monkeypatch.setenv("PSA_STATS_GLUON", "1" if gluon else "0")
        copies = torch.full((3, B, H, T, D), float("nan"), device="cuda", dtype=torch.bfloat16)
        gathered = (copies[0] if copy_q else None, copies[1], copies[2])
        assert stats_gl.usable(q, k, v, perm, gathered) == gluon
        st = kts.block_stats(q, k, v, cfg, perm=perm, gathered=gathered)
        kts.finalize_hbar(st, st.kbar.shape[-2], q.dtype)
        outs[gluon] = ({n: getattr(st, n) for n in NAMES}, copies)
    (a, ca), (b, cb) = outs[True], outs[False]
    assert torch.equal(ca[1:], cb[1:]) and (not copy_q or torch.equal(ca[0], cb[0]))
    ref = _ref(*(t.index_select(2, perm.long()) for t in (q, k, v)))
    for n in NAMES:
        if n in ref:
            e_gl, e_tr = _rel(a[n], ref[n]), _rel(b[n], ref[n])
            assert e_gl <= max(2e-5, 4 * e_tr), f"{n}: rel {e_gl:.2e} (Triton {e_tr:.2e})"
        else:
            d = (a[n].float() - b[n].float()).abs()
            assert (d <= torch.finfo(q.dtype).eps * b[n].float().abs() + 1e-6).all(), n


@pytest.mark.parametrize("copy_q", [True, False], ids=["qkv_copies", "kv_copies"])
@pytest.mark.parametrize("grid,prefix", [((21, 30, 52), 0), ((5, 7, 9), 3)])
def test_gather_from_copies_only_the_tail(grid, prefix, copy_q, monkeypatch):
    """block_stats(gather_from=...) (the cube order: interior cubes read in place): only stats_h's per-thread stores
    take it (the Gluon kernel and the TMA copies decline it), so under every switch it copies only the block-order
    rows from gather_from on, into copies that short, and gives, bit for bit, the statistics of the same kernel's full
    gather; a full gather through the Gluon kernel or the TMA copies within bf16 rounding of them, hpart within its
    float32 sums' rounding at its own scale (session 35, an H100: the Gluon arm's kbar is not stats_h's bit for
    bit)."""
    from kernels.reorder import full_order, orders_on
    from kernels.triton import stats as kts
    B, H, D = 1, 4, 128
    T = prefix + math.prod(grid)
    goff = (T // 2) // 64 * 64
    x = [rnd((B, T, H * D), seed=s) for s in range(3)]
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in x)
    perm = full_order(orders_on(grid, "cuda")[0], prefix)
    want = [t.index_select(2, perm.long())[:, :, goff:] for t in (q, k, v)]
    cfg = cfg_of(D, 0.125, "pwt")

    def full_gather(gluon, tma):
        monkeypatch.setenv("PSA_STATS_GLUON", "1" if gluon else "0")
        monkeypatch.setenv("PSA_STATS_TMA_COPY", "1" if tma else "0")
        full = torch.empty((3, B, H, T, D), device="cuda", dtype=torch.bfloat16)
        return kts.block_stats(q, k, v, cfg, perm=perm, gathered=(full[0] if copy_q else None, full[1], full[2]))

    same = full_gather(False, False)  # stats_h's per-thread stores, the kernel every gather_from call takes
    for gluon, tma in ((True, False), (False, False), (False, True)):
        a = full_gather(gluon, tma)
        tail = torch.full((3, B, H, T - goff, D), float("nan"), device="cuda", dtype=torch.bfloat16)
        b = kts.block_stats(q, k, v, cfg, perm=perm, gathered=(tail[0] if copy_q else None, tail[1], tail[2]),
                            gather_from=goff)
        for i in range(0 if copy_q else 1, 3):
            assert torch.equal(tail[i], want[i]), (gluon, tma, i)
        for n in NAMES + ("hpart",):
            x, y, z = getattr(same, n), getattr(b, n), getattr(a, n)
            if x is not None:
                assert torch.equal(x, y), (gluon, tma, n)
                # hpart's float32 sums over a block may cancel to near zero: their rounding is relative to the
                # tensor's scale (64 float32 roundings of its largest term), not the element's (session 37, an H100:
                # the Gluon arm 7.6e-6 off where |hpart| is ~1e-3, its largest ~35)
                d, mag = (z.float() - y.float()).abs(), y.float().abs()
                tol = torch.finfo(q.dtype).eps * mag + 2.0 ** -18 * mag.max() + 1e-6
                assert (d <= tol).all(), (gluon, tma, n, (d - tol).max().item())
