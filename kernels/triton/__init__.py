"""backend="triton": block statistics, routing and the fused forward kernel for pisa / pwt / drop.

Layers: @triton.jit kernels (stats.py, fwd.py, reorder.py) -> host launcher `_forward_impl` (per head
chunk: statistics, routing, attention) -> torch.library custom op ``psa::triton_fwd`` with a fake
implementation (no graph break under torch.compile) -> `forward(q, k, v, cfg)` for kernels.dispatch.

Nothing here recompiles per shape: T, N, K (so density) are runtime arguments; the compile/autotune key is
(dtype, head_dim, variant family, fused reorder or not). Scratch (statistics, routing, bias rows) is kept
under `PSA_TRITON_SCRATCH` x the bytes of q (default 0.5) by processing the heads in chunks; the routing's
float32 scores take at most score_budget() more. With a Morton permutation the statistics kernel also writes
block-order copies of k and v (and q for an attention that takes no permutation: CuTe's), kept under
`PSA_MORTON_SCRATCH` x q (default 1, 0.5 from 512 MiB of q; 1.5x that for three copies) the same way
(_forward_gathered).
"""
from __future__ import annotations

import math
import os

import torch

from ..config import SparseConfig, env_switch
from ..dispatch import on_device
from ..layout import bthd_empty

try:
    import triton  # noqa: F401

    from . import fwd as _fwd
    from . import stats as _stats
    from . import train as _train
    from .reorder import gather_tokens as _gather_plain, scatter_tokens as _scatter_plain

    _IMPORT_ERROR = None
except Exception as e:  # kept and reported as the reason, never raised at import
    _IMPORT_ERROR = f"{type(e).__name__}: {e}"

NAME = "triton"
HEAD_DIMS = (64, 128)
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

__all__ = ["available", "unavailable_reason", "forward", "forward_with_routing", "gather_tokens",
           "scatter_tokens", "NAME"]


def available() -> bool:
    return _IMPORT_ERROR is None and (_INTERPRET or torch.cuda.is_available())


def unavailable_reason(q, cfg) -> str | None:
    """None when these inputs can run here, else a short reason (logged once by kernels.dispatch)."""
    if _IMPORT_ERROR is not None:
        return f"triton import failed ({_IMPORT_ERROR})"
    if not (_INTERPRET or torch.cuda.is_available()):
        return "triton backend needs a CUDA GPU (or TRITON_INTERPRET=1)"
    if cfg is not None:
        if cfg.variant not in ("pisa", "pwt", "drop"):
            return f"variant {cfg.variant!r} unsupported by triton"
        if cfg.block_size != 64:
            return f"block_size {cfg.block_size} unsupported by triton (64 only)"
    if q is None:
        return None
    if q.device.type == "cuda":
        if _INTERPRET:
            return "TRITON_INTERPRET=1 runs on CPU tensors only"
        major, minor = torch.cuda.get_device_capability(q.device)
        if major < 8:
            return f"compute capability {major}.{minor} unsupported by triton (needs 8.0+)"
        ok = (torch.bfloat16, torch.float16)
    elif q.device.type == "cpu" and _INTERPRET:
        if q.dtype == torch.bfloat16:
            # the interpreter's tl.dot on bfloat16 operands returns garbage (|error| ~1e10 on randn)
            return "bfloat16 is wrong under TRITON_INTERPRET=1 (its tl.dot); use float16 or float32 there"
        ok = (torch.float16, torch.float32)
    else:
        return f"triton backend cannot run on {q.device.type} tensors"
    if q.dtype not in ok:
        return f"dtype {str(q.dtype).replace('torch.', '')} unsupported by triton (bfloat16 or float16)"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head_dim {q.shape[-1]} unsupported by triton (64 or 128)"
    if q[:1].numel() >= 2**31:
        # kernel offsets are 32-bit within one batch element (forward() splits larger batches)
        return f"one batch element of {q[:1].numel()} elements exceeds the triton kernels' 2^31 offsets"
    return None


def _env_fraction(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "").strip() or default)
    except ValueError:
        return default


def _scratch_fraction() -> float:
    return _env_fraction("PSA_TRITON_SCRATCH", 0.5)


def score_budget(q_bytes: int) -> int:
    """Bytes the routing's float32 scores may take at once (route() works through the heads in sub-chunks
    that fit): a tenth of q's bytes, between 64 MiB (Wan2.1-14B 480p: all 40 heads' 42 MB in one launch)
    and 256 MiB."""
    return int(max(64 * 2**20, min(256 * 2**20, 0.1 * q_bytes)))


def _heads_per_chunk(B, H, T, D, cfg, elem_bytes, K, frac, device=None) -> int:
    """Heads per chunk so that the statistics + routing outputs (and the routing's score sub-chunk) stay
    under max(frac x bytes(q), 64 MiB); the floor keeps small problems in one chunk, where launch overhead,
    not memory, is what a chunk costs. The bytes are what block_stats and route allocate
    (scratch_bytes_per_head); the heads are then spread evenly over the fewest chunks (each chunk is one
    launch of every kernel)."""
    q_bytes = B * H * T * D * elem_bytes
    budget = max(frac * q_bytes, 64 * 2**20) - min(score_budget(q_bytes), B * H * _stats_route_score(T, cfg))
    hc = H
    while hc > 1 and B * hc * scratch_bytes_per_head(T, D, cfg, elem_bytes, K, B * hc, device) > budget:
        hc = max(1, min(hc - 1, int(hc * budget // max(1, B * hc * scratch_bytes_per_head(
            T, D, cfg, elem_bytes, K, B * hc, device)))))
    n_chunks = -(-H // hc)
    return -(-H // n_chunks)


def _stats_route_score(T, cfg) -> int:
    n = -(-T // cfg.block_size)
    return _stats.kernel_scratch_bytes(n) if _stats.route_in_kernel(n) else 0


def scratch_bytes_per_head(T, D, cfg, elem_bytes, K, bh=1, device=None) -> int:
    """Bytes of statistics and routing outputs one (batch, head) holds through the attention: float32
    k-bar / q-bar (+ q^2, k-sigma^2 for pwt), the low-precision k-bar / value means (pisa / pwt), the
    statistics' H partials (float32 [P, D, D], P programs per head for `bh` (batch, head) pairs in the
    launch) and H-bar (float32 + low precision, + its float16 scale), the cov_bias norms; the routing's [N, K] int32 list and
    [N, N] bias rows. On the torch path (N above the kernels' limit) also its float32 score (+ w and the
    gate for pwt) and the top-k / sort temporaries. The routing kernels' own float32 scores are counted
    apart (_heads_per_chunk: at most score_budget)."""
    n = -(-T // cfg.block_size)
    pwt = cfg.variant == "pwt"
    need_h = cfg.variant in ("pisa", "pwt") or cfg.cov_bias
    need_v = cfg.variant in ("pisa", "pwt") or need_h
    fused = need_h and _stats.stats_h_enabled() and elem_bytes == 2
    if fused:  # one pass (stats_h.py): its partials
        npart = _stats.stats_h_parts(n, bh, device, D)
    else:
        npart = -(-n // _stats.blocks_per_program(n, bh, device)) if need_h else 0
    stats = (n * D * (8 + (8 if pwt else 0) + (2 * elem_bytes if need_v else 0))
             + (D * D * (4 * npart + 4 + elem_bytes) + 4 if need_h else 0) + (4 * n if cfg.cov_bias else 0))
    bias_bytes = 2 if elem_bytes == 2 else 4
    routing = n * n * bias_bytes + n * K * 4
    if not _stats.route_in_kernel(n):
        routing = n * n * (4 + bias_bytes + (5 if pwt else 0)) + n * K * 36
    return stats + routing


def _contig_last(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def _full_perm(perm, n_prefix, T, device):
    from ..reorder import full_order
    if perm.numel() != T - n_prefix:
        raise ValueError(f"perm has {perm.numel()} entries, expected T - n_prefix = {T} - {n_prefix}")
    return full_order(perm.to(device=device), n_prefix)


def _forward_impl(q, k, v, cfg: SparseConfig, **kw):
    """_forward_heads on q's device (every launch below goes to the current CUDA device)."""
    with on_device(q):
        return _forward_heads(q, k, v, cfg, **kw)


# how a `perm` reaches the kernels: "stats" (the statistics kernel reads q, k, v through it and writes block-order
# copies of k and v that routing and attention read; the attention reads q and writes the output through it) or
# "attention" (every kernel reads and writes rows through it: no copies, but no TMA and gathered K/V tile loads;
# measured 26% slower than the separate gather at Wan2.1-14B 480p, bench/results/h200.md)
REORDER_IN = "stats"


def _forward_heads(q, k, v, cfg: SparseConfig, *, routing=None, perm=None, n_prefix=0, config=None,
                   scratch=None, attention=None, reorder_in=None, out_bthd=False):
    """q, k, v [B, H, T, D] (any strides with unit last stride). With `perm` (Morton order of the tokens
    after `n_prefix`) the inputs and the output are in the caller's order; `reorder_in` (default REORDER_IN)
    says how the kernels see the permuted order. out_bthd: the output's memory in [B, T, H, D] order (a
    [B, H, T, D] view; _output_like), else q's layout.

    `attention(q, k, v, out, st, idx, vbias, cfg)` runs the attention of one head chunk (default this
    backend's fused kernel); the CuTe backend passes its own, so statistics, routing and the head chunking
    stay one code path. `config` reaches it only when given (the CuTe kernel takes none), `perm` only when it
    reads or writes rows through it (_forward_gathered)."""
    own_attention = attention is None
    attention = _fwd.attention if attention is None else attention
    q, k, v = _contig_last(q), _contig_last(k), _contig_last(v)
    B, H, T, D = q.shape
    n = -(-T // cfg.block_size)
    fperm = _full_perm(perm, n_prefix, T, q.device) if perm is not None else None
    if fperm is not None and routing is None and (reorder_in or REORDER_IN) == "stats":
        return _forward_gathered(q, k, v, cfg, perm, fperm, n_prefix, config, scratch, attention, own_attention,
                                 out_bthd)
    out = _output_like(q, out_bthd)
    hc, score_bytes = _chunking(q, cfg, routing.idx.shape[-1] if routing is not None else None, scratch)
    for h0 in range(0, H, hc):
        h1 = min(H, h0 + hc)
        qc, kc, vc, oc = q[:, h0:h1], k[:, h0:h1], v[:, h0:h1], out[:, h0:h1]
        if routing is None:
            st = _stats.block_stats(qc, kc, vc, cfg, perm=fperm)
            idx, vbias = _stats.route(st, cfg, q.dtype, score_bytes=score_bytes)
        else:
            approx = cfg.variant in ("pisa", "pwt")
            st = _stats.block_stats(qc, kc, vc, cfg, perm=fperm, need_pwt=False, need_h=approx,
                                    need_hnorm=False)
            _stats.finalize_hbar(st, n, q.dtype)
            idx = routing.idx[:, h0:h1].to(device=q.device, dtype=torch.int32).contiguous()
            vbias = None
            if approx:
                sub = type(routing)(idx=routing.idx[:, h0:h1], exact=routing.exact[:, h0:h1],
                                    w=routing.w[:, h0:h1])
                vbias = _stats.vbias_from_routing(sub, q.dtype).contiguous()
        kw = {}
        if fperm is not None:
            kw["perm"] = fperm
        if config is not None:
            kw["config"] = config
        attention(qc, kc, vc, oc, st, idx, vbias, cfg, **kw)
    return out


def _chunking(q, cfg, k_lists, scratch):
    """(heads per chunk, the routing scores' byte budget) for q [B, H, T, D]; k_lists: the routing's list length
    when it is given, else the estimate from the budget, band and sinks."""
    B, H, T, D = q.shape
    n = -(-T // cfg.block_size)
    k_est = k_lists if k_lists is not None else cfg.budget(n) + 2 * cfg.band + 1 + cfg.n_sink_blocks
    frac = _scratch_fraction() if scratch is None else scratch
    hc = H if frac <= 0 else _heads_per_chunk(B, H, T, D, cfg, q.element_size(), min(n, k_est), frac, q.device)
    return hc, score_budget(q.numel() * q.element_size())


def _output_like(q, bthd: bool = False):
    """The output buffer: q's layout (a [B, L, H, D] caller's view comes back with the same strides), or with
    bthd its memory in [B, T, H, D] order whatever q's is (kernels/layout.py)."""
    if bthd:
        return bthd_empty(q.shape, q.device, q.dtype)
    out = torch.empty_like(q)
    return out if out.stride(-1) == 1 else torch.empty(q.shape, device=q.device, dtype=q.dtype)


# the Morton copies' budget in q's bytes (PSA_MORTON_SCRATCH overrides): 1 (2 head chunks of 20 at Wan2.1-14B), and
# MORTON_LARGE_FRAC from MORTON_LARGE_BYTES of q on. H200, session 10 (cute_out_perm.py PSA_MORTON_SCRATCH 1 0.75
# 0.5, medians of 3 rounds, ms; bench/results/morton_budget_s10_h200.txt): 480p (q 320 MiB) cute 7.89 / 8.01 /
# 8.31, Triton 8.90 / 9.06 / 9.24 (raster 7.55 / 8.53): more chunks cost 1.5-5%; 720p (q 738 MiB) cute 38.02 /
# 38.52 / 38.38, Triton 44.18 / 44.46 / 44.15 (raster 37.12 / 43.59): 4 chunks cost <1%, and the peak above
# inputs and output falls from 1.79x / 1.29x q (cute / Triton) to 0.95x / 0.71x
MORTON_LARGE_BYTES = 512 * 2**20
MORTON_LARGE_FRAC = 0.5


def _morton_fraction(q_bytes: int = 0) -> float:
    return _env_fraction("PSA_MORTON_SCRATCH", MORTON_LARGE_FRAC if q_bytes >= MORTON_LARGE_BYTES else 1.0)


MORTON_FLOOR = 256 * 2**20  # copies this small never split the heads: there launches, not memory, cost


def _copy_heads(q, n_copies: int, frac: float | None = None, floor: int | None = None) -> int:
    """Heads per chunk so that `n_copies` block-order [B, hc, T, D] copies stay under frac x bytes(q) (frac:
    PSA_MORTON_SCRATCH, default _morton_fraction's; 0 or less: never split), or all heads when all the copies fit
    `floor` (MORTON_FLOOR). At frac 1 this splits where max(frac x bytes(q), floor) did (two copies above the floor
    mean q above half of it: either budget gives 2 chunks); below 1 the floor no longer caps the split."""
    H = q.shape[1]
    floor = MORTON_FLOOR if floor is None else floor
    q_bytes = q.numel() * q.element_size()
    frac = _morton_fraction(q_bytes) if frac is None else frac
    per_head = n_copies * q_bytes // H
    if frac <= 0 or per_head * H <= floor:
        return H
    return max(1, min(H, int(frac * q_bytes // per_head)))


def _even_chunks(H: int, hc: int) -> int:
    n_chunks = -(-H // max(1, hc))
    return -(-H // n_chunks)


def _forward_gathered(q, k, v, cfg, perm, fperm, n_prefix, config, scratch, attention, own_attention,
                      out_bthd=False):
    """_forward_heads with the Morton gather inside the statistics kernel: per head chunk it reads q, k, v
    through `fperm` once and writes block-order copies of k and v; routing and attention run in block order.

    This backend's attention (`own_attention`) reads the query rows and writes the output rows through `fperm`
    itself (its query tile is one load per program, never TMA), so q is not copied and the output lands in
    the caller's layout (a [B, L, H, D] caller's view needs no further copy) without a scatter pass; the k, v
    copies keep their TMA loads. Scratch: 2 x hc / H x q's bytes for the copies, the heads chunked so that
    stays under PSA_MORTON_SCRATCH x q (default 1, 0.5 from MORTON_LARGE_BYTES of q on; copies up to MORTON_FLOOR in
    one chunk) + the statistics.

    An attention that takes no permutation (CuTe's) gets q copied too and writes its block-order output over
    that copy (each program reads its own query rows before it writes the same rows, and no other program reads
    them); a scatter then puts it into the caller's layout (or, when it says `writes_out_perm(T, cfg)`, it writes
    the output rows through `fperm` straight into the caller's layout). Its three copies are budgeted like the
    two above, both limits scaled by 1.5, so the heads split exactly where this backend's do: in one chunk
    3x q's bytes + the statistics and one scatter at the end; in several (Wan2.1-14B 480p: 2 of 20 heads, 720p: 4 of
    10) 3 x hc / H
    x q and one scatter per chunk into the caller's output. Such an attention must never run twice on the same
    arguments (the second run would read the first one's output as its queries): the CuTe kernel runs once per
    call; Triton's autotuner re-runs a kernel, which is why this backend's own attention takes the permutation."""
    B, H, T, D = q.shape
    hc, score_bytes = _chunking(q, cfg, None, scratch)
    # the two copies' budget; three copies under 1.5x both limits split at the same heads
    hc = _even_chunks(H, min(hc, _copy_heads(q, 2)))
    kw = {} if config is None else {"config": config}
    reads_q = getattr(attention, "reads_q_perm", None)
    if own_attention or (reads_q is not None and reads_q(T, cfg)):  # an attention that reads q through fperm itself
        out = _output_like(q, out_bthd)
        kvg = torch.empty((2, B, hc, T, D), device=q.device, dtype=q.dtype)
        for h0 in range(0, H, hc):
            h1 = min(H, h0 + hc)
            kg, vg = kvg[0, :, :h1 - h0], kvg[1, :, :h1 - h0]
            st = _stats.block_stats(q[:, h0:h1], k[:, h0:h1], v[:, h0:h1], cfg, perm=fperm,
                                    gathered=(None, kg, vg))
            idx, vbias = _stats.route(st, cfg, q.dtype, score_bytes=score_bytes)
            attention(q[:, h0:h1], kg, vg, out[:, h0:h1], st, idx, vbias, cfg, perm=fperm, kv_perm=False, **kw)
            del st, idx, vbias, kg, vg
        return out
    # an attention that writes the output rows through the permutation itself fills the caller's layout
    # directly (no scatter pass); else its block-order output goes over the q copy
    writes = getattr(attention, "writes_out_perm", None)
    direct = writes is not None and writes(T, cfg)
    if not direct and getattr(attention, "can_read_q_perm", False) and _morton_roll():
        hr = _roll_heads(q, hc)
        if hr < H:
            return _forward_rolled(q, k, v, cfg, perm, fperm, n_prefix, hr, score_bytes, attention, kw, out_bthd)
    # in one chunk the output is allocated only after the statistics are freed (the peak is the head loop's,
    # copies + scratch, or the copies + the output at the scatter, never both); chunks scatter as they go
    out = _output_like(q, out_bthd) if direct or hc < H else None
    g = torch.empty((3, B, hc, T, D), device=q.device, dtype=q.dtype)
    for h0 in range(0, H, hc):
        h1 = min(H, h0 + hc)
        qg, kg, vg = g[0, :, :h1 - h0], g[1, :, :h1 - h0], g[2, :, :h1 - h0]
        st = _stats.block_stats(q[:, h0:h1], k[:, h0:h1], v[:, h0:h1], cfg, perm=fperm, gathered=(qg, kg, vg))
        idx, vbias = _stats.route(st, cfg, q.dtype, score_bytes=score_bytes)
        if direct:
            attention(qg, kg, vg, out[:, h0:h1], st, idx, vbias, cfg, perm=fperm, **kw)
        else:
            attention(qg, kg, vg, qg, st, idx, vbias, cfg, **kw)  # the output over the q copy
        del st, idx, vbias
        if not direct and out is not None:
            _scatter_into(qg, perm, n_prefix, out[:, h0:h1])
        del qg, kg, vg
    if out is not None:
        return out
    return _scatter_into(g[0], perm, n_prefix, _output_like(q, out_bthd))


# PSA_MORTON_ROLL (default off until measured on the H200): an attention that takes no permutation (CuTe's) but can
# be asked to read q through it, in head chunks, gets its q copies in the caller's output instead of a buffer of
# their own (_forward_rolled): the Morton copies' peak falls from 3 to 2 chunk copies + the statistics (Wan2.1-14B
# 480p at 2 chunks: 1.74x -> ~1.24x q by arithmetic; in the 3 chunks _roll_heads gives it: ~0.9x). Session 17 on the
# H200 (switch_morton_roll_s17_h200.txt, as the node calls it, medians of 3): 480p peak 1.74x -> 0.86x q but 7.89 ->
# 8.28 ms (+4.9%), 720p 0.92x -> 0.67x q at 38.67 -> 38.40 ms. The rule asked <= 3%: off. (Its 480p output moved by up
# to 3.8e-3 in 1-2 query rows of 14 of 40 heads: copies and block means bit-identical, but the one-pass statistics' H
# partials per head follow the chunk's head count, 13 at 20 heads, 11 at 12, 9 at 14, so near-tied lists flip;
# roll_diff_stages_s17_h200.txt). Session 29, with the Gluon statistics under both arms (switch_morton_roll_gluon_s29_
# h200.txt, CuTe, 5 rounds): 480p 7.127 -> 7.483 ms (+5.0%), 720p 36.09 -> 35.71 (-1.1%), peaks 0.86x / 0.67x q: off
MORTON_ROLL = False
# the rolled chunks' k, v copies stay under this x q at most (below the default budget, unless PSA_MORTON_SCRATCH is
# set): Wan2.1-14B 480p in 3 chunks of 14/14/12 heads, 0.7x q of copies (2 chunks: 1.0x), 720p in 4 as before
MORTON_ROLL_FRAC = 0.75


def _morton_roll() -> bool:
    return env_switch("PSA_MORTON_ROLL", MORTON_ROLL)


def _roll_heads(q, hc: int) -> int:
    """Heads per rolled chunk: at most `hc` (the unrolled chunks'), and the two k, v copies under MORTON_ROLL_FRAC x
    q when PSA_MORTON_SCRATCH is not set (set, its budget alone, as for the other paths)."""
    frac = None
    if not os.environ.get("PSA_MORTON_SCRATCH", "").strip():
        frac = min(_morton_fraction(q.numel() * q.element_size()), MORTON_ROLL_FRAC)
    return _even_chunks(q.shape[1], min(hc, _copy_heads(q, 2, frac)))


def _forward_rolled(q, k, v, cfg, perm, fperm, n_prefix, hc, score_bytes, attention, kw, out_bthd):
    """_forward_gathered's head chunks for an attention without a permutation that can read q through one
    (`attention.can_read_q_perm`), with no buffer for q's block-order copies: chunk c's copy is written into the
    caller's output where chunk c + 1's heads will go (not written yet), the attention writes its block-order
    output over that copy (each program reads its own query rows before it writes them), and one scatter puts it
    into chunk c's heads (whose own region held chunk c - 1's copy, scattered already). The last chunk has no
    region ahead: its attention reads the caller's query rows and writes its output rows through `fperm`. The
    smallest chunk goes first, so every copy fits the region after it."""
    B, H, T, D = q.shape
    n_chunks = -(-H // hc)
    sizes = [hc] * (n_chunks - 1) + [H - hc * (n_chunks - 1)]
    sizes = sizes[-1:] + sizes[:-1]  # the smallest first
    starts = [sum(sizes[:i]) for i in range(n_chunks)]
    out = _output_like(q, out_bthd)
    kvg = torch.empty((2, B, hc, T, D), device=q.device, dtype=q.dtype)
    for c in range(n_chunks):
        h0, h1 = starts[c], starts[c] + sizes[c]
        kg, vg = kvg[0, :, :h1 - h0], kvg[1, :, :h1 - h0]
        last = c == n_chunks - 1
        qg = None if last else out[:, starts[c + 1]:starts[c + 1] + h1 - h0]
        st = _stats.block_stats(q[:, h0:h1], k[:, h0:h1], v[:, h0:h1], cfg, perm=fperm, gathered=(qg, kg, vg))
        idx, vbias = _stats.route(st, cfg, q.dtype, score_bytes=score_bytes)
        if last:
            attention(q[:, h0:h1], kg, vg, out[:, h0:h1], st, idx, vbias, cfg, perm=fperm, kv_perm=False, **kw)
        else:
            attention(qg, kg, vg, qg, st, idx, vbias, cfg, **kw)  # the output over the q copy
        del st, idx, vbias
        if not last:
            _scatter_into(qg, perm, n_prefix, out[:, h0:h1])
        del qg, kg, vg
    return out


def _scatter_into(x, perm, n_prefix, out):
    from .reorder import _permute
    with on_device(x):
        return _permute(x, perm, n_prefix, scatter=True, out=out)


def split_large_batch(fn, q, k, v):
    """fn(q, k, v) once per batch element when q has 2^31 elements or more and B > 1 (the kernels use 32-bit
    offsets within one batch element; each slice starts at its own base pointer), else None."""
    if q.numel() >= 2**31 and q.shape[0] > 1:
        return torch.cat([fn(q[b:b + 1], k[b:b + 1], v[b:b + 1]) for b in range(q.shape[0])])
    return None


def _cfg(density, variant, band, n_sink_blocks, cov_bias, block_size, scale) -> SparseConfig:
    return SparseConfig(density=density, variant=variant, band=band, n_sink_blocks=n_sink_blocks,
                        cov_bias=cov_bias, block_size=block_size, scale=scale)


if _IMPORT_ERROR is None and hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
    @torch.library.custom_op("psa::triton_fwd", mutates_args=())
    def _triton_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, density: float, variant: str,
                       band: int, n_sink_blocks: int, cov_bias: bool, block_size: int, scale: float,
                       perm: torch.Tensor | None, n_prefix: int, out_bthd: bool) -> torch.Tensor:
        cfg = _cfg(density, variant, band, n_sink_blocks, cov_bias, block_size, scale)
        return _forward_impl(q, k, v, cfg, perm=perm, n_prefix=n_prefix, out_bthd=out_bthd)

    @_triton_fwd_op.register_fake
    def _(q, k, v, density, variant, band, n_sink_blocks, cov_bias, block_size, scale, perm, n_prefix, out_bthd):
        return _output_like(q, out_bthd)

    _OP = torch.ops.psa.triton_fwd
else:
    _OP = None


def gather_tokens(x: torch.Tensor, perm: torch.Tensor, n_prefix: int = 0) -> torch.Tensor:
    """out[..., n_prefix + p, :] = x[..., n_prefix + perm[p], :] (reorder.py's kernel; differentiable when x
    needs a gradient)."""
    if _train.needs_grad(x):
        return _train.gather_tokens(x, perm, n_prefix)
    return _gather_plain(x, perm, n_prefix)


def scatter_tokens(x: torch.Tensor, perm: torch.Tensor, n_prefix: int = 0) -> torch.Tensor:
    """The inverse of gather_tokens(., perm, n_prefix) (differentiable when x needs a gradient)."""
    if _train.needs_grad(x):
        return _train.scatter_tokens(x, perm, n_prefix)
    return _scatter_plain(x, perm, n_prefix)


# kernels.api hands `perm` (Morton) to forward() instead of gathering the tokens itself
FUSED_REORDER = True
# forward(out_bthd=True) writes the output with its memory in [B, T, H, D] order (kernels/layout.py)
OUT_BTHD = True


def forward(q, k, v, cfg: SparseConfig, *, perm: torch.Tensor | None = None, n_prefix: int = 0,
            out_bthd: bool = False):
    """Piecewise sparse attention on [B, H, T, D] (kernels.dispatch contract). Routing is detached. When q, k
    or v needs a gradient (and grad mode is on) the differentiable op of train.py runs (backward: bwd.py).
    out_bthd: the no-grad op writes the output with its memory in [B, T, H, D] order (_output_like), else in q's
    layout (kernels.api copies the other paths' outputs into the layout asked for).

    perm: optional Morton permutation of the tokens after `n_prefix` (kernels.reorder.orders_on(...)[0]);
    when given, q/k/v/out stay in the caller's order: the statistics kernel gathers (REORDER_IN), one pass
    scatters the output back; with autograd, differentiable gather / scatter ops around the op (train.py).
    """
    if _IMPORT_ERROR is not None:
        raise RuntimeError(f"triton backend unavailable: {_IMPORT_ERROR}")
    split = split_large_batch(lambda qb, kb, vb: forward(qb, kb, vb, cfg, perm=perm, n_prefix=n_prefix), q, k, v)
    if split is not None:
        return split
    if _train.needs_grad(q, k, v):
        # autograd: the op that saves row statistics and has a backward (train.py)
        return _train.forward(q, k, v, cfg, perm=perm, n_prefix=n_prefix)
    args = (q, k, v, float(cfg.density), cfg.variant, int(cfg.band), int(cfg.n_sink_blocks),
            bool(cfg.cov_bias), int(cfg.block_size), float(cfg.scale), perm, int(n_prefix), bool(out_bthd))
    with torch.no_grad():
        if _OP is not None:
            return _OP(*args)
        return _forward_impl(q, k, v, cfg, perm=perm, n_prefix=n_prefix, out_bthd=out_bthd)


def forward_with_routing(q, k, v, cfg: SparseConfig, routing, *, config: dict | None = None):
    """Same kernel under a given kernels.routing.Routing (to compare backends under identical routing)."""
    with torch.no_grad():
        return _forward_impl(q, k, v, cfg, routing=routing, config=config)


def prepare(q, k, v, cfg: SparseConfig):
    """(TritonStats, idx, vbias) for all heads at once: the routing this backend would use (tests, bench)."""
    with on_device(q):
        st = _stats.block_stats(_contig_last(q), _contig_last(k), _contig_last(v), cfg)
        idx, vbias = _stats.route(st, cfg, q.dtype)
    return st, idx, vbias


del math
