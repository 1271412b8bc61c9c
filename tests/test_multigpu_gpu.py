"""Two GPUs of one process and of one host (skipped with fewer than 2 CUDA devices; run on a two-GPU machine with
`pytest -m gpu tests/test_multigpu_gpu.py`):
- the operator called from two threads at once, one per GPU, with the current device left at cuda:0 (as
  ComfyUI's MultiGPU worker threads may), from a fresh process so both threads autotune and compile at the
  same time: every result equals the same call made alone, and cuda:1 agrees with cuda:0;
- ComfyUI's core MultiGPU CFG split with the node on a tiny bf16 Wan (bench/multigpu.py cfg --res tiny):
  sparse calls on both GPUs, the latent within bf16 noise of the one-GPU run;
- Ulysses over two GPUs (bench/multigpu.py ulysses, NCCL) at the Wan2.1-14B 480p shape: the gathered output
  equals the one-GPU output (same routing per head)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]

ROOT = Path(__file__).resolve().parent.parent

THREADS_CASE = r"""
import json, sys, threading, torch
sys.path.insert(0, sys.argv[1])
from kernels import piecewise_sparse_attention
backend = sys.argv[2]
T, grid = 21 * 30 * 52, (21, 30, 52)
g = torch.Generator(device="cuda:0").manual_seed(0)
base = [torch.randn(1, 8, T, 128, generator=g, device="cuda:0").bfloat16() for _ in range(3)]
inputs = {d: [t.to(d) for t in base] for d in ("cuda:0", "cuda:1")}
kw = dict(density=0.125, variant="pwt", reorder="morton", grid=grid, backend=backend, on_failure="raise")
torch.cuda.set_device(0)
got, errors, barrier = {}, [], threading.Barrier(2)
def run(d):
    try:
        barrier.wait()  # both first calls (autotune, compile) at once
        got[d] = [piecewise_sparse_attention(*inputs[d], **kw) for _ in range(3)]
        torch.cuda.synchronize(d)
    except BaseException as e:
        errors.append(f"{d}: {type(e).__name__}: {e}")
ts = [threading.Thread(target=run, args=(d,)) for d in inputs]
[t.start() for t in ts]; [t.join() for t in ts]
res = {"errors": errors, "current_device": torch.cuda.current_device()}
if not errors:
    alone = {d: piecewise_sparse_attention(*inputs[d], **kw) for d in inputs}
    res["same_as_alone"] = all(torch.equal(o, alone[d]) for d in inputs for o in got[d])
    res["devices"] = sorted({str(o.device) for d in inputs for o in got[d]})
    a, b = alone["cuda:0"].double(), alone["cuda:1"].to("cuda:0").double()
    res["rel_1_vs_0"] = float((a - b).norm() / a.norm())
print("RESULT " + json.dumps(res))
"""


def _run(cmd, timeout=600):
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    return p.returncode, p.stdout + p.stderr


def _backends():
    sys.path.insert(0, str(ROOT))
    from kernels import select_backend
    from kernels.config import SparseConfig
    q = torch.zeros(1, 8, 64, 128, device="cuda:1", dtype=torch.bfloat16)
    out = ["triton"]
    if select_backend(q, SparseConfig(scale=1.0), "cute")[0] == "cute":
        out.append("cute")
    return out


@pytest.mark.parametrize("backend", ["triton", "cute"])
def test_two_gpus_from_two_threads_equal_each_alone(backend):
    if backend not in _backends():
        pytest.skip(f"{backend} backend not available on these GPUs")
    rc, out = _run([sys.executable, "-c", THREADS_CASE, str(ROOT), backend])
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert rc == 0 and line, out[-3000:]
    res = json.loads(line[0][len("RESULT "):])
    assert res["errors"] == [] and res["current_device"] == 0
    assert res["same_as_alone"] and res["devices"] == ["cuda:0", "cuda:1"]
    assert res["rel_1_vs_0"] < 1e-3, res


def _comfy033():
    sys.path.insert(0, str(ROOT / "tests"))
    from comfy_server import comfy_installs
    for inst in comfy_installs():
        if (inst.path / "comfy" / "multigpu.py").is_file():
            return inst.path
    return None


def test_comfy_multigpu_cfg_split_sparse_on_both_gpus(tmp_path):
    comfy = _comfy033()
    if comfy is None:
        pytest.skip("no ComfyUI with comfy/multigpu.py (0.33+) found (COMFYUI_PATH)")
    rc, out = _run([sys.executable, "bench/multigpu.py", "cfg", "--comfy", str(comfy), "--res", "tiny",
                    "--backend", "triton", "--steps", "3", "--out", str(tmp_path)])
    assert rc == 0, out[-4000:]
    res = json.loads((tmp_path / "multigpu_cfg.json").read_text())
    by_dev = res["runs"]["sparse_2gpu"]["sparse_calls_by_device"]
    assert set(by_dev) == {"cuda:0", "cuda:1"} and by_dev["cuda:0"] == by_dev["cuda:1"] > 0
    assert res["sparse_split_vs_one_gpu_rel"] < 3e-2 and res["dense_split_vs_one_gpu_rel"] < 3e-2


def test_ulysses_two_gpus_equal_one_gpu(tmp_path):
    rc, out = _run([sys.executable, "bench/multigpu.py", "ulysses", "--world", "2", "--shape", "wan14b_480p",
                    "--repeats", "2", "--out", str(tmp_path)])
    assert rc == 0, out[-4000:]
    res = json.loads((tmp_path / "multigpu_ulysses.json").read_text())
    assert res["rel_vs_one_gpu"]["sparse"] < 1e-3 and res["rel_vs_one_gpu"]["dense"] < 1e-3
