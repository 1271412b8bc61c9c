"""Compile the routing scores kernel for sm_90a without a GPU (ptxas -v: registers, spills, stack; SASS size; the
wgmma count): each dot precision (route.SCORE_PREC) at each D slice and warp count, pwt at D 128.

PYTHONPATH=/tmp/tri36site python bench/probes/score_compile.py   (Triton 3.6 as on the H200)"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from select_compile import comp  # noqa: E402
from kernels.triton import route as kr  # noqa: E402

F = "*fp32"
TYPES = {n: F for n in ("QBAR", "KBAR", "Q2", "KSIG2", "HNORM", "SCORE", "HPART", "HBAR")}
TYPES.update({"VBIAS": "*fp16", "HBAR_LP": "*bf16", "scale": "fp32", "half_s2": "fp32", "ln_b": "fp32",
              "inv_n": "fp32"})
for prec, split in (("tf32x3", 0), ("bf16x3", 1), ("tf32", 0)):
    for dk in (128, 64, 32):
        for w in (4, 8):
            for stg in (1, 3):
                if stg > 1 and dk == 128:
                    continue
                c = dict(D=128, BM=64, BN=64, DK=dk, PWT=True, COV=False, FINAL_H=True, PREC=prec, SPLIT=split, OFF64=0)
                try:
                    r = comp(kr._scores_kernel, TYPES, c, w, stages=stg)
                except Exception as e:  # noqa: BLE001
                    r = f"failed: {type(e).__name__}: {str(e)[:200]}"
                print(prec, f"DK{dk}", f"warps{w}", f"stages{stg}", r, flush=True)
