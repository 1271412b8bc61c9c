"""backend="cute": the Triton backend's block statistics and routing, then a CuTe-DSL attention kernel (SM90).

Only the attention kernel (`fwd.attention`, WGMMA / TMA, written with nvidia-cutlass-dsl) is new here: the
statistics, routing, head chunking and batch split are `kernels.triton._forward_impl` with the attention
swapped, so both backends route identically and only the attention differs (what the GPU tests compare).
Layers: `fwd.attention` -> `_forward_impl(..., attention=_attention)` -> torch.library custom op
``psa::cute_fwd`` with a fake implementation (no graph break under torch.compile) -> `forward(q, k, v, cfg)`
for kernels.dispatch.

nvidia-cutlass-dsl is an optional extra (`pip install .[cute]`): without it this module still imports and
`unavailable_reason` says so, and "auto" takes the Triton backend with one log line. A kernel failure at run
time is re-raised (the caller falls back loudly) and remembered, so later calls of that variant family skip
this backend instead of failing again. The Morton reorder is Triton's: `forward(..., perm=)` gathers inside the
statistics kernel (kernels.triton._forward_gathered), gather_tokens / scatter_tokens are its standalone kernels.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import threading

import torch

from .. import triton as _kt
from ..config import SparseConfig

log = logging.getLogger("piecewise_sparse_attention")

NAME = "cute"
INSTALL_HINT = "optional extra: pip install .[cute]"


def _dsl_installed() -> bool:
    try:
        return importlib.util.find_spec("cutlass") is not None
    except (ImportError, ValueError) as e:  # a broken half-install: report it as not importable
        log.debug("find_spec('cutlass') raised %s", e)
        return False


try:
    from . import fwd as _cute

    _err = getattr(_cute, "IMPORT_ERROR", None)  # the DSL's own import, caught inside fwd.py
    _what = "nvidia-cutlass-dsl"
    _missing_file = False
except Exception as e:  # kept and reported as the reason, never raised at import
    _cute = None
    _err = f"{type(e).__name__}: {e}"
    _what = "its kernel module kernels/cute/fwd.py"
    # `from . import fwd` on a missing file raises a plain ImportError naming the package, so look at the file
    _missing_file = not os.path.isfile(os.path.join(os.path.dirname(__file__), "fwd.py"))

if _err is None:
    _IMPORT_ERROR = None
elif not _dsl_installed():
    _IMPORT_ERROR = f"nvidia-cutlass-dsl is not installed ({INSTALL_HINT})"
elif _missing_file:
    _IMPORT_ERROR = "its kernel module kernels/cute/fwd.py is missing from this install"
else:
    _IMPORT_ERROR = f"{_what} failed to import ({_err})"
if _IMPORT_ERROR is not None:
    _cute = None
del _err, _what, _missing_file
_fwd_cube = None  # the cube order's copy-free Morton path (PSA_MORTON_CUBES)
if _cute is not None:
    from . import fwd_cube as _fwd_cube

# the Morton reorder kernels (None when Triton is unusable: kernels.api then reorders with torch)
gather_tokens = getattr(_kt, "gather_tokens", None)
scatter_tokens = getattr(_kt, "scatter_tokens", None)
prepare = _kt.prepare

__all__ = ["available", "unavailable_reason", "auto_skip_reason", "forward", "forward_with_routing", "prepare", "gather_tokens",
           "scatter_tokens", "compile_stats", "NAME"]

# variant family ("pisa/pwt" or "drop") -> why the kernel failed earlier in this process
_FAILED: dict[str, str] = {}
_failed_lock = threading.Lock()


def _family(cfg) -> str:
    return "pisa/pwt" if cfg.variant in ("pisa", "pwt") else "drop"


def available() -> bool:
    return _IMPORT_ERROR is None and torch.cuda.is_available()


def _sm(device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def unavailable_reason(q, cfg) -> str | None:
    """None when these inputs can run here, else a short reason naming this backend (kernels.dispatch logs it
    once): the optional package, the GPU (SM90 only), dtype, head_dim, variant, block size, the Triton backend
    (statistics and routing run there), an earlier failure, then the kernel's own check (strides...)."""
    if _IMPORT_ERROR is not None:
        return f"cute backend: {_IMPORT_ERROR}"
    if not torch.cuda.is_available():
        return "cute backend: needs a CUDA GPU (SM90, Hopper)"
    if cfg is not None:
        if cfg.variant not in ("pisa", "pwt", "drop"):
            return f"cute backend: variant {cfg.variant!r} unsupported (pisa, pwt, drop)"
        if cfg.block_size != 64:
            return f"cute backend: block_size {cfg.block_size} unsupported (64 only)"
    if q is None:
        major, minor = _sm(torch.cuda.current_device())
        if (major, minor) != (9, 0):
            return f"cute backend: SM90 only (Hopper); got sm_{major}{minor}"
        return None
    if q.device.type != "cuda":
        return f"cute backend: runs on CUDA tensors only, got {q.device.type} tensors"
    major, minor = _sm(q.device)
    if (major, minor) != (9, 0):
        return f"cute backend: SM90 only (Hopper); got sm_{major}{minor}"
    if q.dtype != torch.bfloat16:
        return f"cute backend: dtype {str(q.dtype).replace('torch.', '')} unsupported (bfloat16 only)"
    if q.shape[-1] != 128:
        return f"cute backend: head_dim {q.shape[-1]} unsupported (128 only)"
    why = _kt.unavailable_reason(q, cfg)
    if why is not None:
        return f"cute backend: needs the triton backend for statistics and routing ({why})"
    if not aligned16(q):
        return "cute backend: q's base or strides are not 16-byte aligned (TMA)"
    if cfg is not None and _family(cfg) in _FAILED:
        return f"cute backend: its kernel failed earlier in this process ({_FAILED[_family(cfg)]})"
    try:
        why = _cute.check(q, cfg)
    except Exception as e:  # a broken check must not break dispatch: decline, with the reason
        return f"cute backend: its input check raised {type(e).__name__}: {e}"
    return None if why is None else f"cute backend: {why}"


def _min_tiles(graphed: bool = False) -> int:
    name, default = ("PSA_CUTE_MIN_TILES_GRAPHED", "0") if graphed else ("PSA_CUTE_MIN_TILES", "100000")
    try:
        return int(float(os.environ.get(name, default)))
    except ValueError:
        return int(default)


def auto_skip_reason(q, cfg, graphed: bool = False) -> str | None:
    """Under backend="auto", small problems called eagerly stay on Triton: each cute call pays ~0.13 ms of host-side
    argument conversion, which Triton's launcher does not (H200, FLUX.1 1024^2, 24 heads, T=4608, d=0.125,
    about 15.5K query-block x KV-block tiles: cute 0.92 ms vs Triton 0.72 ms for the whole operator; from
    Wan2.1-1.3B 480p, 393K tiles, on, cute is ahead; bench/results/cute_h200.md). PSA_CUTE_MIN_TILES moves
    that threshold (0: always cute). `graphed`: the call goes through the CUDA-graph cache (kernels/graphs.py),
    whose replays pay no host work, so only the GPU's time counts: there cute is ahead at every size the
    break-even table measures (H200 session 23, bench/results/graphed_backend_s23_h200.txt: the node's call at
    T 2816-9728, d 0.125-0.3, e.g. FLUX.1 at d 0.2 0.290 -> 0.271 ms), and PSA_CUTE_MIN_TILES_GRAPHED (default
    0) is the threshold."""
    if cfg is None or q is None or q.dim() != 4:
        return None
    B, H, T, _ = q.shape
    n = -(-T // cfg.block_size)
    tiles = B * H * n * cfg.budget(n)
    floor = _min_tiles(graphed)
    if tiles < floor:
        var = "PSA_CUTE_MIN_TILES_GRAPHED" if graphed else "PSA_CUTE_MIN_TILES"
        return (f"cute backend: {tiles} routed tiles is below {var}={floor} (its host "
                "launch cost loses to Triton on problems this small)")
    return None


def _attention(q, k, v, out, st, idx, vbias, cfg, perm=None, kv_perm=True, cube=None):
    """One head chunk through the CuTe kernel (`perm`: the output rows written through it, see
    writes_out_perm; with kv_perm=False, the Triton attention's convention, q is the caller's and its rows are
    read through `perm` too, see reads_q_perm; with `cube`, fwd_cube.forward_cubes's call). A failure other than
    running out of memory is remembered for
    the variant family (so dispatch takes Triton from the next call on, with its log line) and re-raised."""
    if cfg.variant == "drop":
        vbias = None  # the contract: no bias rows for drop (Triton's own routing builds them anyway)
    kw = {} if perm is None else {"perm": perm, "q_perm": not kv_perm}
    if cube is not None:
        kw = {"perm": perm, "cube": cube}
    try:
        return _cute.attention(q, k, v, out, st, idx, vbias, cfg, **kw)
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as e:
        with _failed_lock:
            first = _family(cfg) not in _FAILED
            _FAILED.setdefault(_family(cfg), f"{type(e).__name__}: {str(e)[:200]}")
        if first:
            log.error("piecewise_sparse_attention: the cute kernel failed for %s (%s); later calls of this "
                      "variant family skip the cute backend (auto takes triton)", _family(cfg), _FAILED[_family(cfg)])
        raise


def _writes_out_perm(T: int, cfg: SparseConfig) -> bool:
    """kernels.triton._forward_gathered asks: True when _attention writes the output rows through the Morton
    permutation itself for this problem (kernels/cute/fwd.py out_perm_enabled: PSA_CUTE_PAIR_OUT_PERM where the
    pair kernel runs, else PSA_CUTE_OUT_PERM), so no scatter pass follows."""
    return _cute is not None and _cute.out_perm_enabled(T, cfg.variant)


_attention.writes_out_perm = _writes_out_perm


def _reads_q_perm(T: int, cfg: SparseConfig) -> bool:
    """kernels.triton._forward_gathered asks: True when _attention reads the caller's query rows through the
    Morton permutation for this problem (kernels/cute/fwd.py Q_PERM, PSA_CUTE_Q_PERM; the one-block kernel), so
    only k and v are copied into block order (and the output rows go through the permutation as well)."""
    return _cute is not None and _cute.q_perm_enabled(T, cfg.variant)


_attention.reads_q_perm = _reads_q_perm
# asked with kv_perm=False (and perm) it reads the caller's query rows through perm whatever the defaults above say
# (kernels.triton._forward_rolled's last head chunk)
_attention.can_read_q_perm = True


def aligned16(x) -> bool:
    """TMA needs a unit last stride, a 16-byte aligned base and 16-byte multiples for every other stride (the
    Triton backend's tma_aligned; kernels.cute.fwd.aligned16 is the same check)."""
    return x.stride(-1) == 1 and _kt._fwd.tma_aligned(x)


def _forward_impl(q, k, v, cfg: SparseConfig, *, routing=None, perm=None, n_prefix=0, out_bthd=False):
    # dispatch declines a misaligned q (the Triton backend takes it); k and v views arrive from callers that
    # only checked q: a copy is cheaper than failing, and a kernel failure would disable this backend
    q, k, v = (x if aligned16(x) else x.clone(memory_format=torch.contiguous_format) for x in (q, k, v))
    if perm is not None and routing is None and _fwd_cube is not None:  # the cube order's interior read in place
        lay = _fwd_cube.usable(q, cfg, perm, n_prefix)
        if lay is not None and _fwd_cube.fold_exact(k) and _fwd_cube.fold_exact(v):
            with _kt.on_device(q):
                fperm = _kt._full_perm(perm, 0, q.shape[2], q.device)
                return _fwd_cube.forward_cubes(q, k, v, cfg, fperm, *lay, _attention, out_bthd)
    if perm is not None:  # the kernel reads block-order copies the statistics kernel writes (never `perm`)
        return _kt._forward_impl(q, k, v, cfg, perm=perm, n_prefix=n_prefix, attention=_attention,
                                 reorder_in="stats", out_bthd=out_bthd)
    return _kt._forward_impl(q, k, v, cfg, routing=routing, attention=_attention, out_bthd=out_bthd)


if _IMPORT_ERROR is None and _kt._IMPORT_ERROR is None and hasattr(torch, "library") \
        and hasattr(torch.library, "custom_op"):
    @torch.library.custom_op("psa::cute_fwd", mutates_args=())
    def _cute_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, density: float, variant: str,
                     band: int, n_sink_blocks: int, cov_bias: bool, block_size: int,
                     scale: float, perm: torch.Tensor | None, n_prefix: int, out_bthd: bool) -> torch.Tensor:
        cfg = _kt._cfg(density, variant, band, n_sink_blocks, cov_bias, block_size, scale)
        return _forward_impl(q, k, v, cfg, perm=perm, n_prefix=n_prefix, out_bthd=out_bthd)

    @_cute_fwd_op.register_fake
    def _(q, k, v, density, variant, band, n_sink_blocks, cov_bias, block_size, scale, perm, n_prefix, out_bthd):
        return _kt._output_like(q, out_bthd)

    _OP = torch.ops.psa.cute_fwd
else:
    _OP = None


def _require():
    if _IMPORT_ERROR is not None:
        raise RuntimeError(f"cute backend unavailable: {_IMPORT_ERROR}")
    if _kt._IMPORT_ERROR is not None:
        raise RuntimeError(f"cute backend unavailable: the triton backend failed to import ({_kt._IMPORT_ERROR})")
    if not available():  # the DSL imports but there is no GPU: say so instead of failing deep in a launch
        raise RuntimeError(f"cute backend unavailable: {unavailable_reason(None, None)}")


# kernels.api hands `perm` (Morton) to forward() instead of gathering the tokens itself
FUSED_REORDER = True
# forward(out_bthd=True) writes the output with its memory in [B, T, H, D] order (kernels/layout.py)
OUT_BTHD = True


def forward(q, k, v, cfg: SparseConfig, *, perm: torch.Tensor | None = None, n_prefix: int = 0,
            out_bthd: bool = False):
    """Piecewise sparse attention on [B, H, T, D] (kernels.dispatch contract): Triton statistics and routing
    (detached), CuTe attention. With `perm` (kernels.reorder.orders_on(...)[0], the tokens after `n_prefix`)
    q/k/v and the output stay in the caller's order: the statistics kernel gathers, one pass scatters back.
    out_bthd: the op writes the output with its memory in [B, T, H, D] order (kernels.triton._output_like;
    kernels.api copies a split batch's output into it)."""
    _require()
    split = _kt.split_large_batch(lambda qb, kb, vb: forward(qb, kb, vb, cfg, perm=perm, n_prefix=n_prefix),
                                  q, k, v)
    if split is not None:
        return split
    with torch.no_grad():
        if _OP is not None:
            return _OP(q, k, v, float(cfg.density), cfg.variant, int(cfg.band), int(cfg.n_sink_blocks),
                       bool(cfg.cov_bias), int(cfg.block_size), float(cfg.scale), perm, int(n_prefix),
                       bool(out_bthd))
        return _forward_impl(q, k, v, cfg, perm=perm, n_prefix=n_prefix, out_bthd=out_bthd)


def forward_with_routing(q, k, v, cfg: SparseConfig, routing):
    """The CuTe attention under a given kernels.routing.Routing (to compare backends under identical routing)."""
    _require()
    with torch.no_grad():
        return _forward_impl(q, k, v, cfg, routing=routing)


def compile_stats() -> dict:
    """Seconds the CuTe kernel spent compiling per shape class ({} when it is not loaded), for the bench."""
    return dict(_cute.compile_stats()) if _cute is not None else {}
