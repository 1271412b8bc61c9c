"""The cube token views of bench/probes/cube_exact.py and cube_tma.py compile for sm_90a without a GPU: a Morton-like
4 x 4 x 4 cube of the caller's [B, L, H * D] as one 5-D TMA box (session 33's copy-free Morton experiment). The pair
kernel must keep compiling under a hierarchical token mode (fwd_pair.py sizes it with cute.size): with k and v
through the view its K / V loads are 5-D and its output store stays 4-D; with q, k, v and out through it the store is
5-D too. Subprocesses (CUTE_DSL_ARCH is set before cutlass loads); skipped with one line without nvidia-cutlass-dsl."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("cutlass") is None:
    pytest.skip("cube view compile test skipped: nvidia-cutlass-dsl is not installed (pip install .[cute])",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]


def _result(probe, **env):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "probes" / probe)], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, PROBE_COMPILE_ONLY="1", CUTE_DSL_ARCH="sm_90a",
                                                        **env))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads([x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT "):])


def test_pair_kernel_compiles_with_cube_views():
    res = _result("cube_exact.py", PROBE_GRID="4,16,16")
    load5, store5 = "cp.async.bulk.tensor.5d.shared::cta.global", "cp.async.bulk.tensor.5d.global.shared::cta"
    store4 = "cp.async.bulk.tensor.4d.global.shared::cta"
    assert load5 in res["B"] and store4 in res["B"] and store5 not in res["B"], res["B"]
    assert load5 in res["C"] and store5 in res["C"] and store4 not in res["C"], res["C"]


def test_tma_copy_probe_compiles_every_view():
    res = _result("cube_tma.py")
    cases = {k: v for k, v in res.items() if k not in ("gpu", "torch")}
    assert len(cases) == 8 and all(v == {"compiled": True} for v in cases.values()), cases
