"""sm_90a SASS of the shipped CuTe pair build (or one with extra PairFwdSm90 keywords), compiled without a GPU as
tests/cute_compile_case.py does: registers, spills, and the instruction count and opcode mix of each loop (a
backward branch and its target). Run with the repository's venv (cutlass-dsl) and the image's Triton for nvdisasm:

    PYTHONPATH=/tmp/tri36site python bench/probes/cute_sass_loops.py [name=value ...]   (e.g. bias_slack=1; cube=1:
        fwd_cube.CubePairFwdSm90 with its arguments)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
dump = tempfile.mkdtemp(prefix="psa_cute_sass_")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_tools import loop_report  # noqa: E402

import triton  # noqa: E402  (the image's Triton: its ptxas and nvdisasm)

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
PTXAS = os.path.join(BIN, "ptxas")
os.environ.setdefault("CUDA_HOME", os.path.dirname(BIN))  # the DSL's nvdisasm: CUDA_HOME/bin
os.environ["CUTE_DSL_KEEP"] = "ptx,cubin,sass"
os.environ["CUTE_DSL_DUMP_DIR"] = dump
os.environ["CUTE_DSL_DISABLE_FILE_CACHING"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import cutlass  # noqa: E402
import cutlass.base_dsl.runtime.cuda as _cuda_rt  # noqa: E402
import cuda.bindings.driver as cuda  # noqa: E402

_cuda_rt.get_device_attribute = lambda *a, **k: 228 * 1024
from kernels.cute import fwd as F  # noqa: E402
from kernels.cute import fwd_pair as FP  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from cute_case_args import kernel_args  # noqa: E402

kw = dict(recip_store=True, pv_fence=True, s_ahead_vt=True, tma_store=True)  # the shipped pair build
for a in sys.argv[1:]:
    k, v = a.split("=")
    kw[k] = bool(int(v))
args, scal = kernel_args(F, cube=kw.get("cube", False))
if kw.get("cube"):  # the cube build (fwd_cube.py) with its own arguments: the caller's q, k, v and the grid
    from kernels.cute import fwd_cube as FC
    kern = FC.CubePairFwdSm90(4, 4, 128, **kw)
else:
    kern = FP.PairFwdSm90(4, 4, 128, **kw)
F.cute.compile(kern, *args, *scal, cuda.CUstream(0))
ptx = [f for f in os.listdir(dump) if f.endswith(".ptx")][0]
p = subprocess.run([PTXAS, "-arch=sm_90a", "-v", os.path.join(dump, ptx), "-o", os.devnull], capture_output=True,
                   text=True)
print("build", kw, re.findall(r"Used \d+ registers|\d+ bytes spill stores", p.stdout + p.stderr))
sass = [f for f in os.listdir(dump) if f.endswith(".sass")]
text = open(os.path.join(dump, sass[0])).read() if sass else ""
if os.environ.get("PROBE_SAVE"):
    open(os.environ["PROBE_SAVE"], "w").write(text)
for n_ins, ops in loop_report(text):
    if n_ins > 100:
        print("  loop", n_ins, ops)
shutil.rmtree(dump, ignore_errors=True)
