"""Trace and compile the CuTe-DSL kernel for sm_90a on a machine without a GPU (run by test_cute_compile.py in
a subprocess: CUTE_DSL_ARCH must be set before cutlass initialises, and nothing here may leak into other tests).

cutlass-dsl compiles without a driver once the target arch is given; the launch's occupancy hint
(min_blocks_per_mp=2) asks the driver for the shared memory per SM, which this machine cannot answer, so that
one query returns the Hopper value (228 KiB). Prints one line `RESULTS_JSON {...}`: per variant family the
compile seconds and, when ptxas is found (PATH, else the one triton bundles), its register / spill report of the
generated PTX; and, when nvdisasm >= 12.9 is found (CUDA_HOME, else triton's bundled one), where the waits for a P V
GEMM sit among the softmax's exponentials in the SASS of the DSL's own cubin (the code that runs on the GPU).
"""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
dump = tempfile.mkdtemp(prefix="psa_cute_")


def _triton_bin(tool):
    """triton's bundled CUDA tool (ptxas, nvdisasm 12.9 with triton 3.6-3.8), or None."""
    spec = importlib.util.find_spec("triton")
    path = os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin", tool) if spec else ""
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


PTXAS = shutil.which("ptxas") or _triton_bin("ptxas")
# the DSL disassembles with nvdisasm from PATH or CUDA_HOME/bin; without either, point CUDA_HOME at triton's
if not os.environ.get("CUDA_HOME") and not shutil.which("nvdisasm") and _triton_bin("nvdisasm"):
    os.environ["CUDA_HOME"] = os.path.dirname(os.path.dirname(_triton_bin("nvdisasm")))
SASS = bool(shutil.which("nvdisasm")
            or os.path.isfile(os.path.join(os.environ.get("CUDA_HOME", ""), "bin", "nvdisasm")))
os.environ["CUTE_DSL_KEEP"] = "ptx,cubin,sass" if SASS else "ptx"
os.environ["CUTE_DSL_DUMP_DIR"] = dump
os.environ["CUTE_DSL_DISABLE_FILE_CACHING"] = "1"
sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

import cutlass  # noqa: E402
import cutlass.base_dsl.runtime.cuda as _cuda_rt  # noqa: E402
import cuda.bindings.driver as cuda  # noqa: E402

_cuda_rt.get_device_attribute = lambda *a, **k: 228 * 1024  # no driver here: H100/H200 shared memory per SM

from kernels.cute import fwd as F  # noqa: E402

from cute_case_args import D, kernel_args  # noqa: E402

out = {}
n = -(-1000 // F.BS)
vb = torch.zeros(1, 2, n, n, dtype=torch.float16)


def _fenced_waits(sass):
    """Per wait for all wgmma groups (WARPGROUP.DEPBAR.LE gsb0, 0x0) with a MEMBAR since the wait before it
    (tile_ops._pv_wait's fence, pinned or not; not one right before FENCE.VIEW.ASYNC): [exponentials (MUFU.EX2)
    between the wait before it and it, in program order; exponentials before the first GEMM instruction (HGMMA)
    issued in that span, -1 where none is]. A
    tile's softmax has 34 per thread (32 of P, 2 rescales); fewer means ptxas moved the wait, and the fence with it,
    above part of the softmax, so that P V no longer runs under it. In the S-ahead loops the next tile's S GEMM is
    issued in that span too (ptxas spreads its instructions through the softmax): it overlaps the softmax only when
    its first instruction comes before the exponentials."""
    counts, ex2, first, fenced, prev = [], 0, -1, False, ""
    for line in sass.splitlines():
        if "FENCE.VIEW.ASYNC" in line and "MEMBAR" in prev:
            fenced = False  # shared-memory stores made visible to the GEMMs (q_perm's query stage), not _pv_wait's
        if ";" in line:
            prev = line
        if "WARPGROUP.DEPBAR" in line:
            if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in line and fenced:
                counts.append([ex2, first])
            ex2, first, fenced = 0, -1, False
        elif "HGMMA" in line:
            first = ex2 if first < 0 else first
        elif "MUFU.EX2" in line:
            ex2 += 1
        elif "MEMBAR" in line:
            fenced = True
    return counts


builds = []  # (family, kernel factory, bias rows, register bound: 65536 / threads per SM)
for approx, q_rs, l2, pf, op in ((False, False, False, False, False), (True, False, False, False, False),
                                 (False, True, False, False, False), (True, True, False, False, False),
                                 (True, True, True, False, False), (True, True, False, True, False),
                                 (True, True, True, True, False), (True, True, False, False, True),
                                 (False, True, False, False, True), (True, True, False, False, "qp"),
                                 (False, True, False, False, "qp")):
    qp = op == "qp"  # the query rows through the permutation (q_perm implies out_perm)
    name = (("pisa/pwt" if approx else "drop") + (" q_rs" if q_rs else "") + (" bias_l2" if l2 else "")
            + (" bias_pf" if pf else "") + (" out_perm" if op else "") + (" q_perm" if qp else ""))
    builds.append((name, lambda a=(approx, 5, D, q_rs, l2, pf, bool(op), qp): F.PiecewiseSparseFwdSm90(*a), vb, 128))
# the pairwise row max and row sum (fwd.TREE_MAX / TREE_SUM) in the one-block builds
for approx in (False, True):
    name = ("pisa/pwt" if approx else "drop") + " q_rs tree"
    builds.append((name, lambda a=(approx, 5, D, True): F.PiecewiseSparseFwdSm90(*a, tree_max=True, tree_sum=True),
                   vb, 128))
from kernels.cute import fwd_pair as FP  # noqa: E402

for recip, share, qp, peel, pp in ((False, False, False, False, False), (True, False, False, False, False),
                                   (True, True, False, False, False), (True, False, True, False, False),
                                   (True, True, True, False, False), (True, False, False, True, False),
                                   (True, False, True, True, False), (True, False, False, False, True),
                                   (True, False, True, False, True), (True, False, False, True, True)):
    # two query blocks per CTA: 384 threads -> 168 registers
    name = ("pisa/pwt pair" + (" recip" if recip else "") + (" share" if share else "") + (" q_perm" if qp else "")
            + (" vt_peel" if peel else "") + (" pingpong" if pp else ""))
    builds.append((name, lambda a=(4, 3, D, "", recip, share, qp, peel, pp): FP.PairFwdSm90(*a), vb, 168))
builds.append(("pisa/pwt pair recip tree", lambda: FP.PairFwdSm90(4, 3, D, "", True, tree_max=True, tree_sum=True),
               vb, 168))
# the P V fence (fwd.PV_FENCE / PV_FENCE_VT) and the S GEMM one tile ahead (fwd.S_AHEAD)
builds.append(("pisa/pwt pair recip pv_fence s_ahead", lambda: FP.PairFwdSm90(4, 3, D, "", True, s_ahead=True,
                                                                               pv_fence=True, pv_fence_vt=True),
               vb, 168))
builds.append(("pisa/pwt pair recip q_perm s_ahead", lambda: FP.PairFwdSm90(4, 3, D, "", True, q_perm=True,
                                                                             s_ahead=True), vb, 168))
builds.append(("drop q_rs pv_fence", lambda: F.PiecewiseSparseFwdSm90(False, 5, D, True, pv_fence=True), vb, 128))
# the shipped builds since session 19 (PV_FENCE on): the pair kernel and the one-block pisa/pwt kernel with the fence
builds.append(("pisa/pwt pair recip pv_fence", lambda: FP.PairFwdSm90(4, 3, D, "", True, pv_fence=True), vb, 168))
builds.append(("pisa/pwt q_rs pv_fence", lambda: F.PiecewiseSparseFwdSm90(True, 5, D, True, pv_fence=True), vb, 128))
# the fences pinned to the row sums (fwd.PV_PIN, session 19)
builds.append(("pisa/pwt pair recip pv_pin", lambda: FP.PairFwdSm90(4, 3, D, "", True, pv_fence=True, pv_pin=True),
               vb, 168))
builds.append(("drop q_rs pv_pin", lambda: F.PiecewiseSparseFwdSm90(False, 5, D, True, pv_fence=True, pv_pin=True),
               vb, 128))
# the pair build's virtual loop one tile ahead (fwd.S_AHEAD_VT, session 20): four shared stages
builds.append(("pisa/pwt pair recip pv_fence s_ahead_vt", lambda: FP.PairFwdSm90(4, 4, D, "", True, pv_fence=True,
                                                                                  s_ahead_vt=True), vb, 168))
builds.append(("pisa/pwt pair recip q_perm pv_fence s_ahead_vt",
               lambda: FP.PairFwdSm90(4, 4, D, "", True, q_perm=True, pv_fence=True, s_ahead_vt=True), vb, 168))
builds.append(("pisa/pwt pair recip pv_pin s_ahead_vt",
               lambda: FP.PairFwdSm90(4, 4, D, "", True, pv_fence=True, pv_pin=True, s_ahead_vt=True), vb, 168))
# the shipped pair build writing its output rows through the Morton permutation, q from its block-order copy
# (fwd.OUT_PERM on the pair kernel, session 22)
# the shipped pair build's epilogue through shared memory and one TMA store (fwd.TMA_STORE, session 22)
builds.append(("pisa/pwt pair recip tma_store pv_fence s_ahead_vt",
               lambda: FP.PairFwdSm90(4, 4, D, "", True, pv_fence=True, s_ahead_vt=True, tma_store=True), vb, 168))
# the one-block builds with the same epilogue (fwd.TMA_STORE_ONE, session 22)
builds.append(("pisa/pwt q_rs pv_fence tma_store",
               lambda: F.PiecewiseSparseFwdSm90(True, 5, D, True, pv_fence=True, tma_store=True), vb, 128))
builds.append(("drop q_rs pv_fence tma_store",
               lambda: F.PiecewiseSparseFwdSm90(False, 5, D, True, pv_fence=True, tma_store=True), vb, 128))
builds.append(("pisa/pwt pair recip out_perm pv_fence s_ahead_vt",
               lambda: FP.PairFwdSm90(4, 4, D, "", True, pv_fence=True, s_ahead_vt=True, out_perm=True), vb, 168))
# the shipped pair build with the virtual tiles' bias loaded unclamped (fwd.BIAS_SLACK, session 26)
builds.append(("pisa/pwt pair recip tma_store pv_fence s_ahead_vt bias_slack",
               lambda: FP.PairFwdSm90(4, 4, D, "", True, pv_fence=True, s_ahead_vt=True, tma_store=True,
                                      bias_slack=True), vb, 168))
# the shipped pair build with the blocks both lists hold loaded once, the split rings (share, session 32)
builds.append(("pisa/pwt pair recip share tma_store pv_fence s_ahead_vt",
               lambda: FP.PairFwdSm90(4, 4, D, "", True, share=True, pv_fence=True, s_ahead_vt=True, tma_store=True),
               vb, 168))
# the shipped pair build with the cube order's interior read and written in the caller's layout (fwd_cube.py, session
# 34): q, k, v (the copied blocks) and the caller's [B, L, H * D] as qc, kc, vc, out
from kernels.cute import fwd_cube as FC  # noqa: E402

CUBE = "pisa/pwt pair recip tma_store pv_fence s_ahead_vt cube"
builds.append((CUBE, lambda: FC.CubePairFwdSm90(4, 4, D, "", True, pv_fence=True, s_ahead_vt=True, tma_store=True,
                                                cube=True), vb, 168))
# the same with the view for the query tile and the output only, k and v from copies of every block (session 36)
CUBE_QO = CUBE + " qo"
builds.append((CUBE_QO, lambda: FC.CubePairFwdSm90(4, 4, D, "", True, pv_fence=True, s_ahead_vt=True,
                                                   tma_store=True, cube=True, cube_kv=False), vb, 168))
ONLY = os.environ.get("PSA_COMPILE_ONLY")  # (by hand: the builds whose name holds this string)
for name, make, vbias, reg_bound in builds:
    if ONLY and ONLY not in name:
        continue
    for f in os.listdir(dump):
        os.remove(os.path.join(dump, f))
    args, scal = kernel_args(F, vbias, cube=name in (CUBE, CUBE_QO))
    t0 = time.perf_counter()
    kern = make()
    fn = F.cute.compile(kern, *args, *scal, cuda.CUstream(0))
    rec = {"compiled": fn is not None, "seconds": round(time.perf_counter() - t0, 2), "register_bound": reg_bound}
    if hasattr(getattr(kern, "smem", None), "size_in_bytes"):  # the CTA's shared memory (traced struct)
        rec["smem_bytes"] = int(kern.smem.size_in_bytes())
    ptx = [f for f in os.listdir(dump) if f.endswith(".ptx")]
    ptxas = PTXAS
    if ptx and ptxas:
        p = subprocess.run([ptxas, "-arch=sm_90a", "-v", os.path.join(dump, ptx[0]), "-o", os.devnull],
                           capture_output=True, text=True, timeout=600)
        txt = p.stdout + p.stderr
        m = re.search(r"Used (\d+) registers", txt)
        s = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", txt)
        f = re.search(r"(\d+) bytes stack frame", txt)
        rec["ptxas_rc"] = p.returncode
        rec["registers"] = int(m.group(1)) if m else None
        rec["spill_bytes"] = (int(s.group(1)) + int(s.group(2))) if s else None
        rec["stack_bytes"] = int(f.group(1)) if f else None
        # ptxas's own warning when it cannot keep wgmma asynchronous (accumulators touched in flight, a wgmma
        # behind a branch it cannot follow): every GEMM then waits for the previous one
        rec["wgmma_serialized"] = "serialized" in txt
    if ptx:
        # mbarrier waits on a constant slot parity (a pipeline's first slot, or a state the trace lost track of)
        src = open(os.path.join(dump, ptx[0])).read()
        rec["const_parity_waits"] = len(re.findall(r"try_wait\.parity\.shared\.b64 P1, \[%r\d+\], \d+,", src))
    sass = [f for f in os.listdir(dump) if f.endswith(".sass")]
    if sass:
        rec["fenced_waits"] = _fenced_waits(open(os.path.join(dump, sass[0])).read())
    out[name] = rec
shutil.rmtree(dump, ignore_errors=True)


# tile_ops._load_q_rows loads the query fragment one 32-bit register (two bf16) at a time: elements 2e and 2e + 1 of
# the S GEMM's A fragment must be adjacent columns (even first) of one row, for every thread of the warpgroup
@cutlass.cute.jit
def _fragment_pairs():
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import warpgroup
    mma = sm90_utils.make_trivial_tiled_mma(
        cutlass.BFloat16, cutlass.BFloat16, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
        cutlass.Float32, (1, 1, 1), (F.BS, F.BS), warpgroup.OperandSource.RMEM)
    # (comprehensions: evaluated in Python at trace time, on the static coordinates of each thread's slice)
    frags = [mma.get_slice(tid).partition_A(cutlass.cute.make_identity_tensor((F.BS, D))) for tid in range(128)]
    bad = [(tid, e) for tid, c in enumerate(frags) for e in range(cutlass.cute.size(c) // 2)
           if not (c[2 * e][0] == c[2 * e + 1][0] and c[2 * e + 1][1] == c[2 * e][1] + 1 and c[2 * e][1] % 2 == 0)]
    out["q_fragment_pairs"] = {"checked": len(frags), "bad": bad[:5]}


try:
    _fragment_pairs()
except Exception:  # with SASS kept, the DSL fails after the trace on this host-only function (no cubin to
    # disassemble); the check's result is written during the trace
    if not (SASS and "q_fragment_pairs" in out):
        raise
print("RESULTS_JSON " + json.dumps(out), flush=True)
