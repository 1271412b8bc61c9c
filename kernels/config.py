"""Knobs of the operator, frozen so they can key caches and cross process boundaries."""
from __future__ import annotations

import math
from dataclasses import dataclass

VARIANTS = ("pwt", "pisa", "drop")
REORDERS = ("none", "morton")
BACKENDS = ("auto", "torch", "triton", "cute")


@dataclass(frozen=True)
class SparseConfig:
    """What `piecewise_sparse_attention` computes (see the docstring there and ../shared/MATH.md).

    `scale` is resolved (never None) by the time a backend sees the config.
    """

    density: float = 0.125
    variant: str = "pwt"
    band: int = 1
    n_sink_blocks: int = 0
    cov_bias: bool = False
    block_size: int = 64
    scale: float | None = None

    def num_blocks(self, T: int) -> int:
        return -(-T // self.block_size)

    def budget(self, n_kv_blocks: int) -> int:
        """k = ceil(density * N), robust to float noise (0.1 * 30 must give 3, not 4)."""
        return max(1, min(n_kv_blocks, math.ceil(round(self.density * n_kv_blocks, 6))))

    @property
    def ln_block(self) -> float:
        return math.log(self.block_size)
