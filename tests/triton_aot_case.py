"""Compile the Triton backward kernels (and the forward with its row-statistics output) for sm_90a on a machine
without a GPU: Triton's NVIDIA backend lowers to PTX and its bundled ptxas assembles it, no driver needed. Run by
tests/test_triton_compile.py in a subprocess; prints one line `RESULTS_JSON {...}`: per kernel and config whether
it compiled, and ptxas' register count and spill-store bytes."""
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback

sys.path.insert(0, os.getcwd())

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels.triton import bwd, fwd, route, select, stats, stats2, stats_h  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
BF, F32, I32 = "*bf16", "*fp32", "*i32"
RES = {}


def compile_one(name, fn, types, constexprs, warps, stages, cc=90, src=ASTSource, hints=False):
    params = inspect.signature(fn.fn if hasattr(fn, "fn") else fn).parameters
    sig = {p: ("constexpr" if p in constexprs else types.get(p, "i32")) for p in params}
    rec = RES[name] = {"warps": warps, "stages": stages}
    # hints: what the launcher specializes at run time (16-byte aligned pointers)
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params) if sig[p].startswith("*")} if hints else None
    try:
        k = triton.compile(src(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                           target=TARGET if cc == 90 else GPUTarget("cuda", cc, 32),
                           options={"num_warps": warps, "num_stages": stages})
        rec["compiled"] = True
        rec["shared_bytes"] = k.metadata.shared
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(k.asm["ptx"])
        if os.path.exists(PTXAS):
            p = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a" if cc == 90 else f"sm_{cc}", f.name, "-o",
                                os.devnull], capture_output=True, text=True)
            rec["ptxas_rc"] = p.returncode
            regs = re.findall(r"Used (\d+) registers", p.stderr)
            spills = re.findall(r"(\d+) bytes spill stores", p.stderr)
            rec["registers"] = int(regs[0]) if regs else None
            rec["spill_bytes"] = int(spills[0]) if spills else None
        os.unlink(f.name)
    except Exception:
        rec["compiled"] = False
        rec["error"] = traceback.format_exc()[-2000:]


common = dict(D=128, BS=64)
scal = {"qk_scale": "fp32", "scale": "fp32"}
dq_types = {**{n: BF for n in ("Q", "K", "V", "DO", "DQ", "KBAR", "VMEAN", "HBAR")},
            **{n: F32 for n in ("LSE", "DELTA", "DQ2", "GSUM", "CZ", "HSCALE")}, "ROW_OFF": I32, "ROW_J": I32,
            "VBIAS": "*fp16", **scal}
for var, (ap, pw) in {"pwt": (True, True), "pisa": (True, False), "drop": (False, False)}.items():
    compile_one(f"dq_{var}", bwd._dq_kernel, dq_types, dict(common, BLOCK_V=64, APPROX=ap, PWT=pw), 8, 2)
dkdv_types = {**{n: BF for n in ("Q", "K", "V", "DO", "DK", "DV")},
              **{n: F32 for n in ("LSE", "DELTA", "DKBAR", "DVHAT", "DSIG2", "DH")}, "COL_OFF": I32, "COL_I": I32,
              **scal}
for var, (ap, pw) in {"pwt": (True, True), "drop": (False, False)}.items():
    compile_one(f"dkdv_{var}", bwd._dkdv_kernel, dkdv_types, dict(common, APPROX=ap, PWT=pw), 8, 2)
virt_types = {**{n: BF for n in ("Q", "DO", "KBAR", "VMEAN")},
              **{n: F32 for n in ("LSE", "DELTA", "CZ", "DKBAR", "DVHAT", "DW")}, "VBIAS": "*fp16", **scal}
for bv in (32, 64):
    compile_one(f"virt_pwt_bv{bv}", bwd._virt_kernel, virt_types, dict(common, BLOCK_V=bv, ATOMIC=True, PWT=True), 8, 2)
compile_one("dh", bwd._dh_kernel, {"Q": BF, "DO": BF, "GSUM": F32, "DH": F32, "scale": "fp32"}, dict(common), 8, 2)
compile_one("rows", bwd._rows_kernel, {"Q": BF, "O": BF, "DO": BF, "HBAR": BF, "HSCALE": F32, "DELTA": F32, "CZ": F32,
                                       "scale": "fp32"}, dict(common, APPROX=True), 8, 1)
fwd_types = {**{n: BF for n in ("Q", "K", "V", "O", "KBAR", "VMEAN", "HBAR", "KD", "VD")}, "VBIAS": "*fp16",
             "IDX": I32, "PERM": I32, "LSE": F32, "HSCALE": F32, "out_max": "fp32", **scal}
compile_one("fwd_pwt_store_lse", fwd._psa_fwd_kernel, fwd_types,
            dict(common, BLOCK_N=64, BLOCK_V=64, APPROX=True, HAS_PERM=False, USE_TMA=False, HAS_HSCALE=False,
                 STORE_LSE=True), 4, 2)
# the Morton path as the node runs it on SM90: q rows read and output rows written through the permutation, k and v
# block-order copies through TMA descriptors (KV_PERM=False)
tma_types = {**fwd_types, "KD": "tensordesc<bf16[1,1,64,128]>", "VD": "tensordesc<bf16[1,1,64,128]>"}
compile_one("fwd_pwt_morton_qo_perm_tma", fwd._psa_fwd_kernel, tma_types,
            dict(common, BLOCK_N=64, BLOCK_V=64, APPROX=True, HAS_PERM=True, USE_TMA=True, HAS_HSCALE=False,
                 KV_PERM=False), 4, 2)
# ... the same with the virtual tiles of whole blocks in a loop of their own (PSA_TRITON_VT_PEEL), also with pointer loads
compile_one("fwd_pwt_morton_qo_perm_tma_vt_peel", fwd._psa_fwd_kernel, tma_types,
            dict(common, BLOCK_N=64, BLOCK_V=64, APPROX=True, HAS_PERM=True, USE_TMA=True, HAS_HSCALE=False,
                 KV_PERM=False, VT_PEEL=True), 4, 2)
compile_one("fwd_pwt_vt_peel", fwd._psa_fwd_kernel, fwd_types,
            dict(common, BLOCK_N=64, BLOCK_V=64, APPROX=True, HAS_PERM=False, USE_TMA=False, HAS_HSCALE=False,
                 VT_PEEL=True), 4, 2)
# before Hopper (RTX 4090: sm_89) the 8-warp pointer config the autotuner is offered there (4 warps spill)
compile_one("fwd_pwt_sm89_w8", fwd._psa_fwd_kernel, fwd_types,
            dict(common, BLOCK_N=64, BLOCK_V=64, APPROX=True, HAS_PERM=False, USE_TMA=False, HAS_HSCALE=False), 8, 2,
            cc=89)
# ... and the statistics kernel that writes those k, v copies (no q copy)
compile_one("stats_pwt_gather_kv", stats._block_stats_kernel,
            {**{n: BF for n in ("Q", "K", "V", "KBAR_LP", "VMEAN_LP", "QG", "KG", "VG")},
             **{n: F32 for n in ("KBAR", "KSIG2", "QBAR", "Q2")}, "FIN": I32, "PERM": I32},
            dict(D=128, DB=64, BS=64, NEED_PWT=True, NEED_V=True, NEED_FIN=True, HAS_PERM=True, PREFETCH=False,
                 GATHER=True, GATHER_Q=False), 4, 1)
# the one-pass statistics (statistics + H partials, stats_h.py) as the Morton path runs them on the H200: all three
# block-order copies written per thread, and through host TMA descriptors (PSA_STATS_TMA_COPY, session 23)
sh_types = {**{n: BF for n in ("Q", "K", "V", "LP", "QG", "KG", "VG", "QGD", "KGD", "VGD")},
            **{n: F32 for n in ("ST32", "HPART")}, "PERM": I32, "FLAG": I32}
sh_const = dict(D=128, BS=64, NEED_PWT=True, HAS_PERM=True, GATHER=True, GATHER_Q=True, LOWP=True, PREC=1, STAGES=3,
                FIX=0)
compile_one("stats_h_pwt_gather_qkv", stats_h._stats_h_kernel, sh_types, dict(sh_const, TMA_G=0), 8, 3)
desc = "tensordesc<bf16[1,1,64,128]>"
compile_one("stats_h_pwt_gather_qkv_tma", stats_h._stats_h_kernel, {**sh_types, "QGD": desc, "KGD": desc, "VGD": desc},
            dict(sh_const, TMA_G=1), 8, 3)
# ... and its loop two stages deeper (PSA_STATS_PERM_DEEP, session 24: the tiles' second shared-memory buffer)
compile_one("stats_h_pwt_gather_qkv_deep", stats_h._stats_h_kernel, sh_types,
            dict(sh_const, TMA_G=0, STAGES=3 + stats_h.STATS_H_PERM_EXTRA), 8, 3 + stats_h.STATS_H_PERM_EXTRA)
# the routing select kernel at Wan2.1-14B 720p (a row in two pieces) and 480p (one piece), one warp
sel_types = {"SCORE": F32, "IDX": I32, "VBIAS": "*fp16"}
compile_one("select_pieces_1024_256", select._select_pieces_kernel, sel_types,
            dict(NA=1024, NB=256, ROWS=1, KP2=256, BITS=1), 1, 1)
compile_one("select_pieces_512", select._select_pieces_kernel, sel_types,
            dict(NA=512, NB=0, ROWS=1, KP2=128, BITS=1),
            1, 1)
# the routing scores kernel as the GPU runs it (pwt, D 128, the bfloat16 x3 dots over the whole D, 4 warps)
compile_one("scores_pwt_bf16x3", route._scores_kernel,
            {**{n: F32 for n in ("QBAR", "KBAR", "Q2", "KSIG2", "HNORM", "SCORE", "HPART", "HBAR")},
             "VBIAS": "*fp16", "HBAR_LP": BF, "scale": "fp32", "half_s2": "fp32", "ln_b": "fp32", "inv_n": "fp32"},
            dict(D=128, BM=64, BN=64, DK=128, PWT=True, COV=False, FINAL_H=True, PREC="tf32x3", SPLIT=1, OFF64=0), 4, 1)
# drop's statistics with the column sums on tensor cores (stats.STATS_TC, 64 columns, pipelined block loop)
compile_one("stats_tc_drop", stats2._qk_sums_tc_kernel,
            {"Q": BF, "K": BF, "PERM": I32, "QBAR": F32, "KBAR": F32},
            dict(D=128, DB=64, BS=64, HAS_PERM=False, LOWP=True, STAGES=3), 4, 3)
# the Gluon statistics kernels (stats_gl.py, PSA_STATS_GLUON): the raster one (TMA loads) and the Morton gather
# writing all three copies (cp.async loader warps, TMA stores), on the Gluon API of the Triton installed here
try:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from kernels.triton import stats_gl
    lay = gl.NVMMASharedLayout.get_default_for([1, 1, 64, 128], gl.bfloat16)
    gdesc = f"tensordesc<bf16[1, 1, 64, 128],{lay!r}>"
    gl_types = {"q_desc": gdesc, "k_desc": gdesc, "v_desc": gdesc, "qg_desc": gdesc, "kg_desc": gdesc,
                "vg_desc": gdesc, "Q": BF, "K": BF, "V": BF, "PERM": I32, "ST32": F32, "LP": BF, "HPART": F32,
                "FLAG": I32}
    compile_one("stats_gl_pwt", stats_gl._stats_gl_kernel, gl_types,
                dict(D=128, BS=64, NEED_PWT=True, STAGES=stats_gl.STAGES), 8, 1, src=GluonASTSource, hints=True)
    compile_one("stats_gl_gather_qkv", stats_gl._stats_gl_gather_kernel, gl_types,
                dict(D=128, BS=64, NEED_PWT=True, STAGES=stats_gl.STAGES, COPY=2,
                     LOADER_WARPS=stats_gl.LOADER_WARPS), 8, 1, src=GluonASTSource, hints=True)
    # the Gluon routing scores (route_gl.py, PSA_ROUTE_GLUON): pwt and pisa, 4 warps
    from kernels.triton import route_gl
    for name, pwt in (("scores_gl_pwt", True), ("scores_gl_pisa", False)):
        compile_one(name, route_gl._scores_gl_kernel,
                    {**{n: F32 for n in ("QBAR", "KBAR", "Q2", "KSIG2", "SCORE")}, "VBIAS": "*fp16", "scale": "fp32",
                     "half_s2": "fp32", "ln_b": "fp32"},
                    dict(D=128, BM=route_gl.BM, PWT=pwt), route_gl.WARPS, 1, src=GluonASTSource, hints=True)
except ImportError as e:  # a Triton without Gluon: recorded, the test names it
    for name in ("stats_gl_pwt", "stats_gl_gather_qkv", "scores_gl_pwt", "scores_gl_pisa"):
        RES[name] = {"compiled": False, "error": f"no Gluon in this Triton: {e}"}
print("RESULTS_JSON " + json.dumps(RES))
