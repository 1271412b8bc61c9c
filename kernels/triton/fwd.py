"""The fused piecewise sparse attention forward kernel (one online softmax, docs/MATH.md).

One program = one 64-token query block i of one (batch, head):
  1. exact part: the routed KV blocks S_i, BLOCK_N // 64 blocks per step, gathered through the index list
     (FlashAttention-2 style loop, exp2 with the scale folded in);
  2. virtual tokens (pisa / pwt): a [64, N] mini-attention against the block-mean keys k-bar in tiles of
     BLOCK_V blocks; the exact blocks are masked by the -inf entries of the bias row, which also carries
     the gated PWT bonus w_ij; values are the block value means times the real counts n_j;
  3. the first-order term s (q H-bar) sum_U e(s-hat), folded in at the end: it shares the running max.
Every rescale multiplies all accumulated mass (exact and virtual, numerator, denominator and the
first-order weight). fp32 accumulation; bf16/fp16 operands on the tensor cores.

Measured and not kept (H200, session 15, bench/results/switch_triton_vt_fold_s15_h200.txt, commit 09b34fd): log2 of
the block size folded into the virtual logits and the count multiplies only in the tile with a short last block
(an scf.if in the virtual loop): Wan2.1-14B 480p 8.36 -> 9.80 ms (raster), 720p 43.7 -> 44.3. Session 16 (CPU only):
the same arithmetic with the tiles of whole blocks in a loop of their own (VT_PEEL, PSA_TRITON_VT_PEEL, off until timed):
no masks, no counts, one row sum; sm_90a with Triton 3.6, the Morton TMA config: that loop's body 436 instructions
against the general loop's 667, 255 registers, no spills.
"""
from __future__ import annotations

import logging
import os
import threading

import torch
import triton
import triton.language as tl

from ..config import env_switch

log = logging.getLogger("piecewise_sparse_attention")

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


try:  # host-side TMA descriptors (Hopper+): no device-side allocator, so no triton.set_allocator needed
    from triton.tools.tensor_descriptor import TensorDescriptor
except Exception:  # older Triton
    TensorDescriptor = None


def _configs(tma: bool = False, arch=None):
    if _INTERPRET:
        return [triton.Config({"BLOCK_N": 128, "BLOCK_V": 64, "USE_TMA": False}, num_warps=4, num_stages=1)]
    # BLOCK_M is fixed at one 64-row query block (routing is per query block). H200 sweep at
    # B1_H40_T32760_D128, pwt, density 0.125 (bench/results/h200.md): pointer gathers best 9.40 ms
    # (BLOCK_N 64, 4 warps, 2 stages; 8 warps lost 40-70%, BLOCK_N 128 lost 10-20%); TMA loads, one 64-row
    # block per step, 2 stages: 7.67 ms; 3-4 stages 9.3-9.7 ms. Autotuning runs on the first shape seen,
    # so only the configs that won are offered.
    cfgs = [triton.Config({"BLOCK_N": 64, "BLOCK_V": 64, "USE_TMA": False}, num_warps=4, num_stages=2),
            triton.Config({"BLOCK_N": 64, "BLOCK_V": 64, "USE_TMA": False}, num_warps=4, num_stages=3)]
    if tma:
        cfgs = [triton.Config({"BLOCK_N": 64, "BLOCK_V": bv, "USE_TMA": True}, num_warps=4, num_stages=2)
                for bv in (64, 128)] + cfgs[:1]
    elif isinstance(arch, tuple) and arch[0] < 9:
        # before Hopper every 4-warp config of pisa / pwt spills (ptxas for sm_80 / sm_89, Triton 3.8: 144-336
        # bytes at head_dim 128); 8 warps do not (167-179 registers). Not timed on such a GPU: offered to the
        # autotuner, which times it there on the first call
        cfgs.append(triton.Config({"BLOCK_N": 64, "BLOCK_V": 64, "USE_TMA": False}, num_warps=8, num_stages=2))
    return cfgs


@triton.jit
def _psa_fwd_kernel(
    Q, K, V, O, KBAR, VMEAN, HBAR, HSCALE, VBIAS, IDX, PERM, KD, VD, LSE,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, so_b, so_h, so_t,
    svb_bh, svb_i,
    HC, T, N, NSEL, N_VIRT, qk_scale, scale, out_max,
    D: tl.constexpr, BS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
    APPROX: tl.constexpr, HAS_PERM: tl.constexpr, USE_TMA: tl.constexpr, HAS_HSCALE: tl.constexpr,
    STORE_LSE: tl.constexpr = False, KV_PERM: tl.constexpr = True, VT_PEEL: tl.constexpr = False,
):
    LOG2E: tl.constexpr = 1.4426950408889634
    LOG2_BS: tl.constexpr = 6.0  # log2(BS): the host sets VT_PEEL only for BS = 64
    i_m, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh = i_b * HC + i_h
    o_m = tl.arange(0, BS)
    o_d = tl.arange(0, D)
    o_n = tl.arange(0, BLOCK_N)

    # [BS, D] query block
    o_tq = i_m * BS + o_m
    m_tq = o_tq < T
    if HAS_PERM:
        o_rq = tl.load(PERM + o_tq, mask=m_tq, other=0).to(tl.int64)
    else:
        o_rq = o_tq.to(tl.int64)
    b_q = tl.load(Q + i_b * sq_b + i_h * sq_h + o_rq[:, None] * sq_t + o_d[None, :], mask=m_tq[:, None], other=0.0)

    b_m = tl.full([BS], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BS], dtype=tl.float32)
    b_acc = tl.zeros([BS, D], dtype=tl.float32)

    p_k = K + i_b * sk_b + i_h * sk_h
    p_v = V + i_b * sv_b + i_h * sv_h
    p_idx = IDX + (i_bh * N + i_m) * NSEL
    if USE_TMA:
        # exact blocks through TMA: one [BS, D] tile per step at a runtime row; rows past T come back zero
        o_nb = tl.arange(0, BS)
        for kk in range(0, NSEL):
            b_jj = tl.load(p_idx + kk)
            b_j = tl.maximum(b_jj, 0)
            m_k = (b_jj >= 0) & (b_j * BS + o_nb < T)
            b_k = KD.load([i_b, i_h, b_j * BS, 0]).reshape(BS, D)
            b_s = tl.dot(b_q, tl.trans(b_k)) * qk_scale  # [BS, BS], log2 units
            b_s = tl.where(m_k[None, :], b_s, float("-inf"))
            b_mn = tl.maximum(b_m, tl.max(b_s, axis=1))
            b_mu = tl.where(b_mn == float("-inf"), 0.0, b_mn)
            b_alpha = tl.math.exp2(b_m - b_mu)
            b_p = tl.math.exp2(b_s - b_mu[:, None])
            b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
            b_v = VD.load([i_b, i_h, b_j * BS, 0]).reshape(BS, D)
            b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v)
            b_m = b_mn
    else:
        # exact blocks, BLOCK_N // BS of them per step
        for kk in range(0, NSEL, BLOCK_N // BS):
            o_sel = kk + o_n // BS
            b_j = tl.load(p_idx + o_sel, mask=o_sel < NSEL, other=-1)  # [BLOCK_N] block id of each key row
            o_tk = b_j * BS + o_n % BS
            m_k = (b_j >= 0) & (o_tk < T)
            if HAS_PERM and KV_PERM:
                o_rk = tl.load(PERM + o_tk, mask=m_k, other=0).to(tl.int64)
            else:
                o_rk = o_tk.to(tl.int64)
            b_k = tl.load(p_k + o_rk[:, None] * sk_t + o_d[None, :], mask=m_k[:, None], other=0.0)  # [BLOCK_N, D]
            b_s = tl.dot(b_q, tl.trans(b_k)) * qk_scale  # [BS, BLOCK_N], log2 units
            b_s = tl.where(m_k[None, :], b_s, float("-inf"))
            b_mn = tl.maximum(b_m, tl.max(b_s, axis=1))
            b_mu = tl.where(b_mn == float("-inf"), 0.0, b_mn)
            b_alpha = tl.math.exp2(b_m - b_mu)
            b_p = tl.math.exp2(b_s - b_mu[:, None])
            b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
            b_v = tl.load(p_v + o_rk[:, None] * sv_t + o_d[None, :], mask=m_k[:, None], other=0.0)  # [BLOCK_N, D]
            b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v)
            b_m = b_mn

    if APPROX:
        o_v = tl.arange(0, BLOCK_V)
        b_g = tl.zeros([BS], dtype=tl.float32)  # sum over U_i of e(s-hat), for the first-order term
        p_vb = VBIAS + i_bh * svb_bh + i_m * svb_i
        p_kbar = KBAR + i_bh * N * D
        p_vmean = VMEAN + i_bh * N * D
        n_last = (T - (N - 1) * BS) * 1.0
        v_tail = 0
        if VT_PEEL:
            # the tiles of whole blocks below the last one in a loop of their own (no masks, no counts: log2(BS) in
            # the logits makes P a whole block's mass, and sum_U e(s-hat) is its row sum / BS, exactly); the rest,
            # the tile with the last block, in the general loop below
            v_tail = tl.maximum(N_VIRT - 1, 0) // BLOCK_V * BLOCK_V
            for v0 in range(0, v_tail, BLOCK_V):
                o_j = v0 + o_v
                b_kb = tl.load(p_kbar + o_j[:, None] * D + o_d[None, :])  # [BV, D]
                b_bias = tl.load(p_vb + o_j).to(tl.float32)
                b_s = tl.dot(b_q, tl.trans(b_kb)) * qk_scale + (b_bias * LOG2E + LOG2_BS)[None, :]  # [BS, BV]
                b_mn = tl.maximum(b_m, tl.max(b_s, axis=1))
                b_mu = tl.where(b_mn == float("-inf"), 0.0, b_mn)
                b_alpha = tl.math.exp2(b_m - b_mu)
                b_p = tl.math.exp2(b_s - b_mu[:, None])
                b_ps = tl.sum(b_p, axis=1)
                b_l = b_l * b_alpha + b_ps
                b_g = b_g * b_alpha + b_ps * (1.0 / BS)
                b_vm = tl.load(p_vmean + o_j[:, None] * D + o_d[None, :])  # [BV, D]
                b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_vm.dtype), b_vm)
                b_m = b_mn
        for v0 in range(v_tail, N_VIRT, BLOCK_V):
            o_j = v0 + o_v
            m_j = o_j < N
            b_kb = tl.load(p_kbar + o_j[:, None] * D + o_d[None, :], mask=m_j[:, None], other=0.0)  # [BV, D]
            # -inf = exact block (or past the end); else the gated PWT bonus (0 for PISA)
            b_bias = tl.load(p_vb + o_j, mask=m_j, other=float("-inf")).to(tl.float32)
            b_s = tl.dot(b_q, tl.trans(b_kb)) * qk_scale + (b_bias * LOG2E)[None, :]  # [BS, BV]
            b_mn = tl.maximum(b_m, tl.max(b_s, axis=1))
            b_mu = tl.where(b_mn == float("-inf"), 0.0, b_mn)
            b_alpha = tl.math.exp2(b_m - b_mu)
            b_p = tl.math.exp2(b_s - b_mu[:, None])
            b_cnt = tl.where(o_j == N - 1, n_last, BS * 1.0)
            b_pn = b_p * b_cnt[None, :]
            b_l = b_l * b_alpha + tl.sum(b_pn, axis=1)
            b_g = b_g * b_alpha + tl.sum(b_p, axis=1)
            b_vm = tl.load(p_vmean + o_j[:, None] * D + o_d[None, :], mask=m_j[:, None], other=0.0)  # [BV, D]
            # sum_U e(s-hat) V-hat_j = sum_U n_j e(s-hat) vmean_j
            b_acc = b_acc * b_alpha[:, None] + tl.dot(b_pn.to(b_vm.dtype), b_vm)
            b_m = b_mn
        b_hb = tl.load(HBAR + i_bh * D * D + o_d[:, None] * D + o_d[None, :])  # [D, D]  H-bar / HSCALE
        b_qh = tl.dot(b_q, b_hb)  # [BS, D]  q H-bar (/ HSCALE for float16)
        if HAS_HSCALE:
            b_qh = b_qh * tl.load(HSCALE + i_bh)
        b_acc += b_qh * (scale * b_g)[:, None]

    b_o = b_acc / b_l[:, None]
    if STORE_LSE:
        # log2 of the softmax denominator (in the running max's log2 units) per row, for the backward
        tl.store(LSE + i_bh * T + o_tq, b_m + tl.log2(b_l), mask=m_tq)
    # non-finite contract: a finite result beyond the output dtype's range saturates instead of becoming inf
    b_o = tl.where((b_o > out_max) & (b_o < float("inf")), out_max, b_o)
    b_o = tl.where((b_o < -out_max) & (b_o > float("-inf")), -out_max, b_o)
    if HAS_PERM:
        # the output rows through the permutation again: read anew (volatile: not merged with the first read,
        # whose 64 row offsets would otherwise stay live in registers through the whole loop, and spill)
        o_ro = tl.load(PERM + o_tq, mask=m_tq, other=0, volatile=True).to(tl.int64)
    else:
        o_ro = o_tq.to(tl.int64)
    tl.store(O + i_b * so_b + i_h * so_h + o_ro[:, None] * so_t + o_d[None, :],
             b_o.to(O.dtype.element_ty), mask=m_tq[:, None])


_KEY = ["D", "APPROX", "HAS_PERM", "HAS_HSCALE", "KV_PERM"]  # + the dtypes of the tensor arguments (Triton adds them)
# One autotuner per (GPU architecture, TMA or not): a tuner's cache has no device in its key, and a config tuned
# on one architecture need not fit another's shared memory (several GPUs of one process, e.g. ComfyUI's
# MultiGPU CFG split). A tuner keeps the arguments of the launch in flight on itself (triton's Autotuner.nargs,
# cleared after every launch), so two threads must never be inside one at once: `_tune_lock` serialises the
# autotuned launches (a launch is asynchronous, so only its few microseconds of host work wait).
_tuners: dict = {}
_tune_lock = threading.Lock()
_seen: set = set()
_tma_state: dict = {}
_tma_lock = threading.Lock()


_arch: dict = {}


# the virtual tiles of whole blocks below the last one in a loop of their own, without masks or counts (VT_PEEL in the
# kernel; session 15's fold put the same arithmetic behind an scf.if inside the one loop and measured slower). Built in
# session 16 on the CPU; session 17 on the H200 (bench/results/vt_peel_kernel_s17_h200.txt, switch_triton_vt_peel_s17):
# the kernel alone 7.789 -> 7.773 ms at 480p, 42.02 -> 41.72 at 720p (medians of 5), but the whole operator slower
# in every row (480p 8.83 -> 8.96, 720p 43.8 -> 45.4, FLUX.1's graph replay 0.2875 -> 0.2906 in all 3 rounds): off.
# PSA_TRITON_VT_PEEL=1/0 overrides
VT_PEEL = False


def vt_peel() -> bool:
    return env_switch("PSA_TRITON_VT_PEEL", VT_PEEL)


def _tuner(device, tma: bool):
    arch = _arch.get(str(device))
    if arch is None:  # one driver query per device, not per launch
        arch = _arch.setdefault(str(device), torch.cuda.get_device_capability(device) if device.type == "cuda"
                                else device.type)
    key = (arch, bool(tma))
    t = _tuners.get(key)
    if t is None:
        with _tune_lock:
            t = _tuners.setdefault(key, triton.autotune(configs=_configs(tma, arch), key=_KEY)(_psa_fwd_kernel))
    return t


def _descs(q, k, v, bs):
    return _descs_4d((k, v), bs)


def _descs_4d(xs, bs):
    """Host TMA descriptors of [B, H, T, D] tensors, boxes of one head's bs rows (also the statistics kernel's
    block-order copies, kernels/triton/stats_h.py)."""
    return tuple(TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, bs, x.shape[-1]]) for x in xs)


def tma_aligned(x: torch.Tensor) -> bool:
    """TMA descriptors need a 16-byte aligned base and 16-byte multiples for every stride but the last
    (a view that is not would fail at launch, and each call would fall back to the reference)."""
    es = x.element_size()
    return x.data_ptr() % 16 == 0 and all((st * es) % 16 == 0 for st in x.stride()[:-1])


def _tma_ok(device) -> bool:
    """TMA needs SM90+ and host descriptors; probed once per device on a tiny problem (falls back loudly)."""
    if _INTERPRET or TensorDescriptor is None or device.type != "cuda":
        return False
    key = str(device)
    if key in _tma_state:
        return _tma_state[key]
    with _tma_lock:  # one probe per device, even when several threads arrive at once
        if key in _tma_state:
            return _tma_state[key]
        ok = torch.cuda.get_device_capability(device)[0] >= 9 and os.environ.get("PSA_TRITON_TMA", "1") != "0"
        if ok:
            try:
                from types import SimpleNamespace
                q = torch.randn(1, 1, 100, 64, device=device, dtype=torch.bfloat16)
                idx = torch.tensor([[[[0, -1]], [[0, 1]]]], device=device, dtype=torch.int32)
                st = SimpleNamespace(kbar_lp=None, vmean_lp=None, hbar_lp=None, hbar_scale=None)
                cfg = SimpleNamespace(block_size=64, variant="drop", scale=0.125, budget=lambda n: n)
                o1 = attention(q, q, q, torch.empty_like(q), st, idx, None, cfg,
                               config=dict(BLOCK_N=64, BLOCK_V=64, USE_TMA=True, num_warps=4, num_stages=2))
                o2 = attention(q, q, q, torch.empty_like(q), st, idx, None, cfg,
                               config=dict(BLOCK_N=64, BLOCK_V=64, USE_TMA=False, num_warps=4, num_stages=2))
                ok = bool(torch.allclose(o1.float(), o2.float(), atol=1e-2, rtol=1e-2))
                if not ok:
                    log.warning("piecewise_sparse_attention: triton TMA path disagrees with the pointer path; "
                                "using pointer loads")
            except Exception as e:  # compile or driver failure: keep the portable path
                log.warning("piecewise_sparse_attention: triton TMA path unavailable (%s: %s); using pointer "
                            "loads", type(e).__name__, str(e)[:200])
                ok = False
        _tma_state[key] = ok
    return _tma_state[key]


def attention(q, k, v, out, st, idx, vbias, cfg, *, perm=None, config: dict | None = None, lse=None,
              kv_perm: bool = True):
    """Launch the fused kernel on [B, HC, T, D] views (unit last stride). `config` pins a tile config
    (BLOCK_N, BLOCK_V, USE_TMA, num_warps, num_stages) instead of the autotuned one (tests, the tile sweep).
    `perm` (block-order position -> row): the query rows are read and the output rows written through it, and
    (kv_perm, default) the key / value rows too; kv_perm=False is for k, v already in block order (the Morton
    path's copies), which keeps their TMA loads.
    `lse`: optional contiguous float32 [B, HC, T] that receives log2 of each row's softmax denominator (the
    backward's row statistics; rows in token order, so not with `perm`)."""
    B, HC, T, D = q.shape
    bs = cfg.block_size
    n = -(-T // bs)
    K = idx.shape[-1]
    approx = cfg.variant in ("pisa", "pwt")
    # density 1 (budget k = N: every block exact in every row) needs no virtual-token scan at all; K == N
    # alone is not enough (K is the widest row: a row with many forced blocks can widen it)
    n_virt = n if (approx and cfg.budget(n) < n) else 0
    if approx:
        assert vbias.stride(0) == HC * vbias.stride(1) and vbias.stride(-1) == 1
    kv_perm = perm is not None and bool(kv_perm)
    want_tma = config["USE_TMA"] if config is not None else (
        not kv_perm and tma_aligned(k) and tma_aligned(v) and _tma_ok(q.device))
    kd, vd = _descs(q, k, v, bs) if want_tma else (k, v)
    dummy = idx
    hscale = getattr(st, "hbar_scale", None) if approx else None
    args = (
        q, k, v, out,
        st.kbar_lp if approx else dummy, st.vmean_lp if approx else dummy,
        st.hbar_lp if approx else dummy, hscale if hscale is not None else dummy, vbias if approx else dummy, idx,
        perm if perm is not None else dummy, kd, vd, lse if lse is not None else dummy,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        vbias.stride(1) if approx else 0, vbias.stride(2) if approx else 0,
        HC, T, n, K, n_virt, float(cfg.scale) * 1.4426950408889634, float(cfg.scale),
        float(torch.finfo(out.dtype).max),
    )
    grid = (n, HC, B)
    meta = dict(D=D, BS=bs, APPROX=approx, HAS_PERM=perm is not None, HAS_HSCALE=hscale is not None,
                KV_PERM=kv_perm)
    if approx and bs == 64 and vt_peel():
        meta["VT_PEEL"] = True
    if lse is not None:
        assert perm is None and lse.is_contiguous() and lse.shape == (B, HC, T) and lse.dtype == torch.float32
        meta["STORE_LSE"] = True
    if config is not None:
        c = dict(config)
        _psa_fwd_kernel[grid](*args, **meta, BLOCK_N=c.pop("BLOCK_N"), BLOCK_V=c.pop("BLOCK_V"),
                              USE_TMA=c.pop("USE_TMA", False), **c)
        return out
    tuner = _tuner(q.device, want_tma)
    key = (str(q.dtype), D, approx, perm is not None, kv_perm, want_tma, id(tuner))
    with _tune_lock:
        first = key not in _seen and not _INTERPRET
        if first:
            _seen.add(key)
            log.info("piecewise_sparse_attention: triton autotune for %s head_dim %d (%s) on %s, once per process "
                     "and GPU architecture (a few seconds)", q.dtype, D, "pisa/pwt" if approx else "drop", q.device)
        tuner[grid](*args, **meta)
        if first and getattr(tuner, "best_config", None) is not None:
            log.info("piecewise_sparse_attention: triton autotune picked %s", tuner.best_config)
    return out
