"""Helpers shared by the GPU test modules (test_triton_gpu.py, test_cute_gpu.py, test_backward_gpu.py): seeded
inputs on the current CUDA device, relative L2 error, a SparseConfig shorthand, the float64 reference with its
routing (and its gradients, also used by the interpreter's backward driver), and the torch.compile check of a
small module that calls a backend's forward; a lock that runs the memory-heavy tests one at a time across
pytest-xdist workers (on an 80 GB H100 four workers' float64 references at T 32760 ran out of memory, session 31)."""
import contextlib
import fcntl
import os
import tempfile

import torch


def rnd(shape, dtype=torch.bfloat16, seed=0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(*shape, device=device, generator=g, dtype=torch.float32).to(dtype)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# two computations of the same terms in float32 rounded differently: some low-precision outputs move by one unit,
# up to half an ulp in rel L2 (bf16 2^-9, fp16 2^-12)
ROUNDING = {torch.bfloat16: torch.finfo(torch.bfloat16).eps / 2, torch.float16: torch.finfo(torch.float16).eps / 2}


def node_layout_qkv(B, T, H, D, seed=0):
    """q, k, v as the node hands them to the operator: [B, L, H*D] memory (Wan's layout) seen as [B, H, L, D]."""
    return tuple(rnd((B, T, H * D), seed=seed + s).view(B, T, H, D).transpose(1, 2) for s in range(3))


# a Wan-like odd Morton grid with a 7-token prefix, B = 2 (the reorder tests of both backends)
MORTON_GRID, MORTON_PREFIX, MORTON_BHD = (5, 30, 52), 7, (2, 3, 128)


def cfg_of(D, density, variant, band=1, sinks=0, cov=False):
    from kernels.config import SparseConfig
    return SparseConfig(density=density, variant=variant, band=band, n_sink_blocks=sinks, cov_bias=cov,
                        scale=D ** -0.5)


def float64_reference(q, k, v, cfg):
    """(routing, output) of the float64 PyTorch reference on q, k, v: the routing a backend is then run under
    (forward_with_routing) and the oracle its output is compared with."""
    from kernels import reference
    from kernels.routing import block_stats, route
    q64, k64, v64 = q.double(), k.double(), v.double()
    st = block_stats(q64, k64, v64, cfg.block_size, need_hnorm=cfg.cov_bias)
    r = route(st, cfg)
    return r, reference.forward(q64, k64, v64, cfg, routing=r, stats=st)


def reference_grads(q, k, v, do, cfg):
    """(routing with w detached, output, (dq, dk, dv)) of the float64 reference, differentiated through its
    statistics and w."""
    from kernels import reference
    from kernels.routing import block_stats, route
    q64, k64, v64 = (x.double().requires_grad_(True) for x in (q, k, v))
    st = block_stats(q64, k64, v64, cfg.block_size, need_hnorm=cfg.cov_bias)
    r = route(st, cfg)
    out = reference.forward(q64, k64, v64, cfg, routing=r, stats=st)
    g = torch.autograd.grad(out, (q64, k64, v64), do.double())
    return type(r)(idx=r.idx, exact=r.exact, w=r.w.detach()), out.detach(), g


def compiled_block(forward, D, density=0.25, variant="pwt", T=700, device="cuda"):
    """(graph breaks, compiled output, eager output) of Linear -> forward(...) + 1 under torch.compile(fullgraph)."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(D, D, device=device, dtype=torch.bfloat16)

        def forward(self, x):
            return forward(self.proj(x), x, x, cfg_of(D, density, variant)) + 1

    m = Block()
    x = rnd((1, 2, T, D), device=device)
    breaks = torch._dynamo.explain(m)(x).graph_break_count
    return breaks, torch.compile(m, fullgraph=True)(x), m(x)


def cute_skip_reason():
    """Why the CuTe GPU tests cannot run here (no CUDA, not SM90, nvidia-cutlass-dsl missing), or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"needs an SM90 (Hopper) GPU, got sm_{major}{minor}"
    import kernels.cute as kc
    if kc._IMPORT_ERROR is not None:
        return f"cute backend unavailable: {kc._IMPORT_ERROR}"
    return None


@contextlib.contextmanager
def heavy_gpu_section(name="float64"):
    """One memory-heavy section at a time on this machine's GPU (a file lock shared by the pytest-xdist workers):
    the float64 references at T 32760 hold tens of GB each. Frees the cache on the way out."""
    path = os.path.join(tempfile.gettempdir(), f"psa_gpu_heavy_{os.getuid()}.lock")
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            torch.cuda.empty_cache()
            fcntl.flock(f, fcntl.LOCK_UN)


def sdpa_grads(q, k, v, do, dtype):
    """(dq, dk, dv) of SDPA in `dtype`, one (batch, head) slice at a time: float64 SDPA runs the math backend, whose
    [T, T] matrices for all heads at once (T 32760: 8.6 GB per head and matrix) do not fit an 80 GB card. Each slice
    stays 4-D ([1, 1, T, D]), so bf16 / fp16 SDPA keeps the fused backend it takes on the whole tensor: as [T, D]
    matrices it took another one, about 10x more accurate on DiT-like inputs (dq 1.66e-3), and the backward tests'
    "within 2x PyTorch's own error" failed against that (session 32, H100)."""
    out = [torch.empty(t.shape, dtype=dtype, device=t.device) for t in (q, k, v)]
    B, H = q.shape[:2]
    for b in range(B):
        for h in range(H):
            x = [t[b:b + 1, h:h + 1].to(dtype).requires_grad_(True) for t in (q, k, v)]
            g = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(*x), x,
                                    do[b:b + 1, h:h + 1].to(dtype))
            for o, gi in zip(out, g):
                o[b:b + 1, h:h + 1] = gi
    return tuple(out)
