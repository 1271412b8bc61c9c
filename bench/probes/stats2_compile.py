"""sm_90a compile report (ptxas -v registers / spills, shared memory, pipelined loads in the TTGIR) of the
statistics kernels, no GPU needed. Run with the device's Triton: PYTHONPATH=/tmp/tri36site python this.py"""
import inspect, os, re, subprocess, sys, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.triton import stats, stats2
TARGET = GPUTarget("cuda", 90, 32)
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def comp(fn, types, constexprs, warps, stages=1):
    params = inspect.signature(fn.fn).parameters
    sig = {p: ("constexpr" if p in constexprs else types.get(p, "i32")) for p in params}
    # what the launcher specializes at run time: 16-byte aligned tensors, strides that are multiples of 16
    # (token strides H * D; without these hints every load is scalar and nothing can be cp.async-staged)
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params)
             if p not in constexprs and (sig[p].startswith("*") or (p.startswith("s") and p[1:2] in "qkvg"))}
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs), target=TARGET,
                       options={"num_warps": warps, "num_stages": stages})
    ttg = k.asm["ttgir"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    p = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True)
    regs = re.findall(r"Used (\d+) registers", p.stderr)
    sp = re.findall(r"(\d+) bytes spill stores", p.stderr)
    return dict(regs=regs, spill=sp, shared=k.metadata.shared,
                async_copies=ttg.count("async_copy_global_to_local"), tma=ttg.count("async_tma_copy"),
                wgmma=ttg.count("warp_group_dot"),
                tile_buffers=re.findall(r"local_alloc : \(\) -> !ttg.memdesc<(\d+)x\d+x\d+x", ttg), tma_store_ptx=k.asm["ptx"].count("cp.async.bulk.tensor"), cp_async_ptx=k.asm["ptx"].count("cp.async.cg")
                + k.asm["ptx"].count("cp.async.ca"))


BF, F = "*bf16", "*fp32"
ST = {"Q": BF, "K": BF, "V": BF, "PERM": "*i32", "KBAR": F, "KBAR_LP": BF, "VMEAN_LP": BF, "KSIG2": F, "QBAR": F,
      "Q2": F, "FIN": "*i32", "QG": BF, "KG": BF, "VG": BF, "HPART": F, "FLAG": "*i32"}
if __name__ == "__main__":
    which = sys.argv[1:] or ["old", "hsum", "tc"]
    if "old" in which:
        for perm in (False, True):
            c = dict(D=128, DB=64, BS=64, NEED_PWT=True, NEED_V=True, NEED_FIN=True, HAS_PERM=perm, PREFETCH=False,
                     GATHER=perm)
            print("stats pwt perm", perm, comp(stats._block_stats_kernel, ST, c, 4))
        for db in (64, 128):
            c = dict(D=128, DB=db, BS=64, NEED_PWT=False, NEED_V=False, NEED_FIN=False, HAS_PERM=False,
                     PREFETCH=False, GATHER=False)
            print("stats drop (q,k) db", db, comp(stats._block_stats_kernel, ST, c, 4))
    if "hsum" in which:
        c = dict(D=128, BS=64, NSPLIT=2, HAS_PERM=False, H_DOT=0)
        print("hsum w 8 stages 3", comp(stats._hsum_kernel, ST, c, 8, 3))
    if "tc" in which:
        for db, w, ns in ((64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 3)):
            c = dict(D=128, DB=db, BS=64, HAS_PERM=False, LOWP=True, STAGES=ns)
            print("tc drop q,k db", db, "w", w, "stages", ns, comp(stats2._qk_sums_tc_kernel, ST, c, w, ns))
    if "fused" in which:  # stats_h._stats_h_kernel: statistics + H partials in one pass
        from kernels.triton import stats_h
        SH = dict(ST, ST32=F, LP=BF, QGD=BF, KGD=BF, VGD=BF)
        DESC = "tensordesc<bf16[1,1,64,128]>"
        SHT = dict(SH, QGD=DESC, KGD=DESC, VGD=DESC)  # TMA_G: the copies through host TMA descriptors (session 23)
        for pwt, perm, gq, stages, tma in ((True, False, False, 3, 0), (True, False, False, 2, 0),
                                           (False, False, False, 3, 0), (True, True, True, 3, 0),
                                           (True, True, False, 3, 0), (True, True, True, 3, 1)):
            c = dict(D=128, BS=64, NEED_PWT=pwt, HAS_PERM=perm, GATHER=perm, GATHER_Q=gq, LOWP=True, PREC=1,
                     STAGES=stages, TMA_G=tma, FIX=0)
            print("fused pwt", pwt, "perm+gather", perm, "q copy", gq, "stages", stages, "tma copies", tma,
                  comp(stats_h._stats_h_kernel, SHT if tma else SH, c, 8, stages))
    if "perm" in which:  # the permuted loop's depth (PSA_STATS_PERM_DEEP, session 24): tile buffers per num_stages
        from kernels.triton import stats_h
        SH = dict(ST, ST32=F, LP=BF, QGD=BF, KGD=BF, VGD=BF)
        for perm, stages in ((False, 3), (True, 3), (True, 4), (True, 5), (True, 7)):
            c = dict(D=128, BS=64, NEED_PWT=True, HAS_PERM=perm, GATHER=perm, GATHER_Q=perm, LOWP=True, PREC=1,
                     STAGES=stages, TMA_G=0, FIX=0)
            print("fused pwt perm+gather (q copy)", perm, "stages", stages,
                  comp(stats_h._stats_h_kernel, SH, c, 8, stages))
