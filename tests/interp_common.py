"""Helpers shared by the TRITON_INTERPRET driver scripts (triton_interp_cases.py, triton_bwd_interp_cases.py):
seeded float64-drawn inputs, relative L2 error, the test configs, and the `case` recorder that keeps a failing
case's traceback as its result instead of stopping the driver."""
import os
import traceback

import torch

from kernels.config import SparseConfig


def rnd(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def cfg_of(D, density, variant, band=1, sinks=0, cov=False):
    return SparseConfig(density=density, variant=variant, band=band, n_sink_blocks=sinks, cov_bias=cov,
                        scale=D ** -0.5)


def case_recorder(results: dict):
    """@case(name): run the function now and store its result (or its traceback) under `name`; with
    PSA_TEST_CASES (comma-separated names) set, only those cases run (a developer's shortcut)."""
    only = {c for c in os.environ.get("PSA_TEST_CASES", "").split(",") if c}

    def case(name):
        def deco(fn):
            if only and name not in only:
                return fn
            try:
                results[name] = fn()
            except Exception:
                results[name] = {"error": traceback.format_exc()}
            return fn
        return deco
    return case
