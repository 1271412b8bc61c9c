"""sm_90a compile report of the Gluon statistics kernel (kernels/triton/stats_gl.py), no GPU needed: registers,
spills, shared memory, and the SASS instruction count of its block loop. Run with the device's Triton:
PYTHONPATH=/tmp/tri36site python bench/probes/stats_gl_compile.py [sass]"""
import inspect, os, re, subprocess, sys, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from kernels.triton import stats_gl
from sass_tools import loop_report  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def build(fn, sig, cx, attrs):
    """Compile for sm_90a at 8 warps; (ptxas' registers / spills and the shared memory, the SASS, the kernel)."""
    k = triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=cx, attrs=attrs), target=TARGET,
                       options={"num_warps": 8})
    with tempfile.TemporaryDirectory() as td:
        ptx = os.path.join(td, "k.ptx")
        cub = os.path.join(td, "k.cubin")
        open(ptx, "w").write(k.asm["ptx"])
        p = subprocess.run([os.path.join(BIN, "ptxas"), "-v", "--gpu-name", "sm_90a", ptx, "-o", cub],
                           capture_output=True, text=True)
        sass = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", cub], capture_output=True, text=True).stdout
    regs = re.findall(r"Used (\d+) registers", p.stderr)
    spills = re.findall(r"(\d+) bytes spill stores", p.stderr)
    return dict(regs=regs, spills=spills, shared=k.metadata.shared), sass, k


def comp(need_pwt=True, stages=stats_gl.STAGES, d=128, dtype="bf16"):
    fn = stats_gl._stats_gl_kernel
    params = list(inspect.signature(fn.fn).parameters)
    gdt = gl.bfloat16 if dtype == "bf16" else gl.float16
    lay = gl.NVMMASharedLayout.get_default_for([1, 1, 64, d], gdt)
    desc = f"tensordesc<{dtype}[1, 1, 64, {d}],{lay!r}>"
    cx = dict(D=d, BS=64, NEED_PWT=need_pwt, STAGES=stages)
    types = {"q_desc": desc, "k_desc": desc, "v_desc": desc, "ST32": "*fp32", "LP": f"*{dtype}", "HPART": "*fp32",
             "FLAG": "*i32"}
    sig = {p: ("constexpr" if p in cx else types.get(p, "i32")) for p in params}
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params) if sig[p].startswith("*")}
    return build(fn, sig, cx, attrs)


def comp_gather(copy=2, stages=stats_gl.STAGES, loader_warps=4):
    fn = stats_gl._stats_gl_gather_kernel
    params = list(inspect.signature(fn.fn).parameters)
    lay = gl.NVMMASharedLayout.get_default_for([1, 1, 64, 128], gl.bfloat16)
    desc = f"tensordesc<bf16[1, 1, 64, 128],{lay!r}>"
    cx = dict(D=128, BS=64, NEED_PWT=True, STAGES=stages, COPY=copy, LOADER_WARPS=loader_warps)
    types = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "PERM": "*i32", "qg_desc": desc, "kg_desc": desc,
             "vg_desc": desc, "ST32": "*fp32", "LP": "*bf16", "HPART": "*fp32", "FLAG": "*i32"}
    sig = {p: ("constexpr" if p in cx else types.get(p, "i32")) for p in params}
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params)
             if sig[p].startswith("*") or p.startswith(("sq_", "sk_", "sv_"))}
    return build(fn, sig, cx, attrs)


if __name__ == "__main__":
    for pwt in (True, False):
        rep, sass, _ = comp(need_pwt=pwt)
        print("pwt" if pwt else "pisa", rep)
        for n, ops in loop_report(sass):
            print("  loop", n, "instructions:", ops)
        if "sass" in sys.argv[1:] and pwt:
            open("/tmp/s26/stats_gl.sass", "w").write(sass)
    for copy in (1, 2):
        rep, sass, k = comp_gather(copy=copy)
        print("gather copy", copy, rep)
        for n, ops in loop_report(sass):
            if n > 40:
                print("  loop", n, "instructions:", ops)
        if "sass" in sys.argv[1:]:
            open(f"/tmp/s26/stats_gl_gather{copy}.sass", "w").write(sass)
            open(f"/tmp/s26/stats_gl_gather{copy}.ptx", "w").write(k.asm["ptx"])
    # the fix-up launch of stats_h._stats_h_kernel (FIX=1: flagged programs only)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import stats2_compile as s2
    from kernels.triton import stats_h
    SH = dict(s2.ST, ST32="*fp32", LP="*bf16", QGD="*bf16", KGD="*bf16", VGD="*bf16")
    c = dict(D=128, BS=64, NEED_PWT=True, HAS_PERM=False, GATHER=False, GATHER_Q=False, LOWP=True, PREC=1,
             STAGES=3, TMA_G=0, FIX=1)
    print("stats_h FIX=1", s2.comp(stats_h._stats_h_kernel, SH, c, 8, 3))
