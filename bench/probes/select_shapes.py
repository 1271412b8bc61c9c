"""ptxas -v (sm_90a, no GPU) of the routing select kernels at the Wan2.1-14B shapes: registers, spills, SASS size,
barriers, shuffles, and the SASS of the search loop. PYTHONPATH=/tmp/tri36site python bench/probes/select_shapes.py"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from select_compile import comp  # noqa: E402
from kernels.triton import route as kr, select as ks  # noqa: E402

F = "*fp32"
TYPES = {"SCORE": F, "IDX": "*i32", "VBIAS": "*fp16"}
out_dir = os.environ.get("SASS_DIR")
for np2, rows, w in ((2048, 1, 4), (512, 4, 4)):
    print("bits", np2, rows, w, comp(kr._select_kernel, TYPES, dict(NP2=np2, ROWS=rows, KP2=256), w))
for na, nb, rows, w, bits in ((1024, 256, 1, 1, 1), (1024, 256, 1, 1, 2), (1024, 256, 1, 2, 1), (2048, 0, 1, 1, 1),
                              (512, 0, 1, 1, 1), (512, 0, 1, 1, 2), (512, 0, 2, 1, 1), (512, 0, 4, 4, 1),
                              (256, 0, 2, 1, 1), (16384, 0, 1, 8, 1), (8192, 4096, 1, 8, 1)):
    name = f"{out_dir}/pieces_{na}_{nb}_{rows}_{w}_{bits}.sass" if out_dir else False
    print("pieces", na, nb, rows, w, f"bits{bits}",
          comp(ks._select_pieces_kernel, TYPES, dict(NA=na, NB=nb, ROWS=rows, KP2=256, BITS=bits), w, sass=name))
