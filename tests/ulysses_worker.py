"""One rank of tests/test_ulysses.py's torch.distributed run (gloo, CPU): its sequence shard of each case through
kernels.ulysses.ulysses_attention (all-to-all, the operator on the head shard called the way yunchang calls
its local attention, all-to-all back), saved for the parent to compare with one process."""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def inputs(case: dict):
    """The same [B, S, H, D] float64 q, k, v in every process."""
    g = torch.Generator().manual_seed(case["seed"])
    T = case["n_prefix"] + case["grid"][0] * case["grid"][1] * (case["grid"][2] if len(case["grid"]) > 2 else 1) \
        + case["n_suffix"]
    return [torch.randn(1, T, case["heads"], 32, generator=g, dtype=torch.float64) for _ in range(3)]


def run(rank: int, world: int, init_file: str, out_dir: str, cases: list) -> None:
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    torch.set_num_threads(1)
    from kernels import ulysses

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for i, case in enumerate(cases):
            q, k, v = inputs(case)
            s = q.shape[1] // world
            shard = [t[:, rank * s:(rank + 1) * s] for t in (q, k, v)]
            local = ulysses.flash_attn_style(grid=case["grid"], n_prefix=case["n_prefix"], n_suffix=case["n_suffix"],
                                             density=case["density"], variant="pwt", backend="torch")
            out = ulysses.ulysses_attention(*shard, attention=lambda a, b, c: local(
                a, b, c, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                alibi_slopes=None, deterministic=False, return_attn_probs=False))
            torch.save(out, os.path.join(out_dir, f"case{i}_rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
