"""The Gluon routing scores (kernels/triton/route_gl.py, PSA_ROUTE_GLUON=1) on an SM90 GPU, against the Triton scores
kernel they replace: the float32 scores within 1e-5 of each row's spread (the same bfloat16 x3 products, ~1e-5 from
float64 themselves; only the float32 summation order differs, ~1e-7 of the terms' magnitude over 128 of them), the bias
rows within one rounding, forced blocks (band, sinks) at +inf, H-bar bit for bit (the same reduction), and route()'s
lists equal but where two blocks' scores tie within 3e-5 of the row's spread. Partial last tiles, one block, batch 2,
pisa and pwt, band 0 with sinks, several score sub-chunks, keys offset by a constant, Wan2.1-14B 720p's block count;
route() takes it from route_gl.MIN_BLOCKS KV blocks on. Skipped without an SM90 GPU (CI compiles the kernel:
tests/test_triton_compile.py); run on the H200 with `pytest -m gpu tests/test_route_gl_gpu.py`."""
import math

import pytest
import torch

from gpu_common import cfg_of, rnd

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs an SM90 GPU")]


def _stats(shape, variant, seed, offset=0.0, band=1, sinks=0, density=0.125):
    from kernels.triton import stats as kts
    q, k, v = (rnd(shape, seed=seed + s) for s in range(3))
    k = (k.float() + offset).to(k.dtype)
    cfg = cfg_of(shape[-1], density, variant, band=band, sinks=sinks)
    return kts.block_stats(q, k, v, cfg), cfg, q.dtype


def _raw_scores(st, cfg, gluon):
    """(score [B * HC, N, N], vbias [B, HC, N, N]) of one launch of either scores kernel over every head."""
    from kernels.triton import route, route_gl
    B, HC, n, D = st.kbar.shape
    score = torch.full((B * HC, n, n), float("nan"), device="cuda")
    vbias = torch.full((B, HC, n, n), float("nan"), device="cuda", dtype=route.bias_dtype(torch.bfloat16))
    pwt = cfg.variant == "pwt"
    kw = dict(scale=float(cfg.scale), half_s2=0.5 * float(cfg.scale) ** 2, ln_b=math.log(cfg.block_size))
    if gluon:
        assert route_gl.scores(st, score, vbias, n=n, hc=HC, h0=0, hs=HC, band=cfg.band, n_sink=cfg.n_sink_blocks,
                               pwt=pwt, **kw)
    else:
        d = st.kbar
        route._scores_kernel[(-(-n // 64), -(-n // 64), B * HC)](
            st.qbar, st.kbar, st.q2 if pwt else d, st.ksig2 if pwt else d, d, score, vbias, d, d, d, n, 0, HC, 0, HC,
            cfg.band, cfg.n_sink_blocks, kw["scale"], kw["half_s2"], kw["ln_b"], 1.0 / n, D=D, BM=64, BN=64, DK=D,
            PWT=pwt, COV=False, FINAL_H=False, PREC="tf32x3", SPLIT=1, OFF64=0, num_warps=4, num_stages=1)
    return score, vbias


def _compare_scores(st, cfg):
    a, va = _raw_scores(st, cfg, True)
    b, vb = _raw_scores(st, cfg, False)
    assert not torch.isnan(a).any() and not torch.isnan(va.float()).any(), "the Gluon kernel left entries unwritten"
    inf = torch.isinf(b)
    assert torch.equal(torch.isinf(a), inf) and torch.equal(a[inf], b[inf]), "forced blocks differ"
    fin = b.masked_fill(inf, float("nan"))
    spread = (fin.nan_to_num(float("-inf")).amax(-1) - fin.nan_to_num(float("inf")).amin(-1)).clamp_min(1e-30)
    err = ((a - b).abs().masked_fill(inf, 0.0).amax(-1) / spread).max()
    assert err <= 1e-5, f"scores: {float(err):.2e} of the row's spread"
    eps = torch.finfo(va.dtype).eps
    assert ((va.float() - vb.float()).abs() <= eps * vb.float().abs() + 1e-6).all(), "bias rows differ"


@pytest.mark.parametrize("variant", ["pwt", "pisa"])
@pytest.mark.parametrize("shape", [(1, 2, 32760, 128), (2, 3, 4999, 128), (1, 2, 64, 128), (1, 1, 100, 128),
                                   (1, 2, 75600, 128)], ids=lambda s: "B{}_H{}_T{}".format(*s[:3]))
def test_scores_match_the_triton_kernel(variant, shape, monkeypatch):
    monkeypatch.setenv("PSA_ROUTE_GLUON", "1")
    st, cfg, _ = _stats(shape, variant, seed=300)
    _compare_scores(st, cfg)


def test_scores_band_zero_sinks_and_key_offset(monkeypatch):
    monkeypatch.setenv("PSA_ROUTE_GLUON", "1")
    st, cfg, _ = _stats((1, 2, 9000, 128), "pwt", seed=310, offset=4.0, band=0, sinks=3)
    _compare_scores(st, cfg)


def _route(st, cfg, dtype, gluon, monkeypatch, **kw):
    from kernels.triton import route
    monkeypatch.setenv("PSA_ROUTE_GLUON", "1" if gluon else "0")
    st.hbar_ready = False
    idx, vbias = route.route(st, cfg, dtype, **kw)
    return idx, vbias, st.hbar.clone(), st.hbar_lp.clone()


@pytest.mark.parametrize("variant, shape, band, sinks, score_bytes", [
    ("pwt", (1, 4, 32760, 128), 1, 0, 256 * 2**20), ("pisa", (2, 3, 20000, 128), 0, 2, 256 * 2**20),
    ("pwt", (1, 6, 17000, 128), 1, 0, 2 * 4 * 266 * 266)], ids=["wan480", "pisa_band0_sinks", "sub_chunks"])
def test_route_lists_equal_up_to_ties_and_hbar_bitwise(variant, shape, band, sinks, score_bytes, monkeypatch):
    from kernels.triton import route_gl
    st, cfg, dtype = _stats(shape, variant, seed=320, band=band, sinks=sinks)
    assert route_gl.usable(st, cfg, "bf16x3") is False  # (PSA_ROUTE_GLUON unset)
    i1, v1, h1, hl1 = _route(st, cfg, dtype, True, monkeypatch, score_bytes=score_bytes)
    assert route_gl.usable(st, cfg, "bf16x3")
    i0, v0, h0, hl0 = _route(st, cfg, dtype, False, monkeypatch, score_bytes=score_bytes)
    assert torch.equal(h1, h0) and torch.equal(hl1, hl0), "H-bar differs"
    rows = (i1 != i0).any(-1)
    if rows.any():  # a swap only between blocks whose float64 scores tie to 3e-5 of the row's spread
        s64 = torch.einsum("bhid,bhjd->bhij", st.qbar.double(), st.kbar.double()) * float(cfg.scale)
        if variant == "pwt":
            w = torch.einsum("bhid,bhjd->bhij", st.q2.double(), st.ksig2.double()) * 0.5 * float(cfg.scale) ** 2
            s64 = s64 + w.clamp(max=math.log(cfg.block_size))
        for b, h, i in rows.nonzero().tolist():
            a, c = set(i1[b, h, i].tolist()) - {-1}, set(i0[b, h, i].tolist()) - {-1}
            row = s64[b, h, i]
            gap = (row[sorted(a - c)].min() - row[sorted(c - a)].max()).abs() if a - c else 0.0
            assert len(a) == len(c) and gap <= 3e-5 * float(row.max() - row.min()), (b, h, i, sorted(a ^ c))
        assert int(rows.sum()) <= max(2, rows.numel() // 200), f"{int(rows.sum())} of {rows.numel()} rows differ"
    same = ~rows[..., None].expand_as(v1)
    assert torch.equal(torch.isinf(v1)[same], torch.isinf(v0)[same]), "exact marks differ where the lists agree"


def test_small_block_counts_keep_the_triton_kernel(monkeypatch):
    from kernels.triton import route_gl
    monkeypatch.setenv("PSA_ROUTE_GLUON", "1")
    st, cfg, _ = _stats((1, 2, 64 * (route_gl.MIN_BLOCKS - 1), 128), "pwt", seed=330)
    assert not route_gl.usable(st, cfg, "bf16x3")
    st, cfg, _ = _stats((1, 2, 64 * route_gl.MIN_BLOCKS, 128), "pwt", seed=330)
    assert route_gl.usable(st, cfg, "bf16x3") and not route_gl.usable(st, cfg, "tf32x3")
