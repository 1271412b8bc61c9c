"""GPU check: the "pieces" select kernel (kernels/triton/select.py) against the "bits" one on the same scores
(idx lists and bias marks), per n / batch / rows configuration. Prints one line per case."""
import sys
import torch
sys.path.insert(0, ".")
from kernels.config import SparseConfig
from kernels.triton import route as kr, select as ks, stats as kts

torch.manual_seed(0)
for (B, H, T) in ((2, 2, 4999), (1, 2, 4999), (2, 2, 4096), (1, 4, 32760), (2, 3, 1000), (1, 2, 75600), (2, 2, 4480)):
    q, k, v = (torch.randn(B, H, T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for var in ("pwt", "drop"):
        cfg = SparseConfig(density=0.125, variant=var, band=1, n_sink_blocks=0, cov_bias=False, scale=128 ** -0.5)
        res = {}
        for impl, split in (("bits", True), ("pieces", True), ("pieces", False)):
            kr.SELECT_IMPL, ks.SELECT_SPLIT = impl, split
            st = kts.block_stats(q, k, v, cfg)
            res[impl, split] = kr.route(st, cfg, q.dtype)
        kr.SELECT_IMPL, ks.SELECT_SPLIT = "pieces", True
        i0, b0 = res["bits", True]
        n = i0.shape[-2]
        for key in (("pieces", True), ("pieces", False)):
            i1, b1 = res[key]
            bad = (i0 != i1).any(-1)
            mark0, mark1 = torch.isneginf(b0), torch.isneginf(b1)
            mb = (mark0 != mark1).any(-1)
            line = f"B{B} H{H} T{T} n{n} {var} {key}: shape {ks.pieces_shape(n)} idx rows differ {int(bad.sum())}/{bad.numel()} mark rows differ {int(mb.sum())}"
            if bad.any():
                w = bad.nonzero()[0].tolist()
                line += f" first {w} bits {i0[tuple(w)].tolist()[:12]} pieces {i1[tuple(w)].tolist()[:12]}"
            elif mb.any():
                w = mb.nonzero()[0].tolist()
                line += f" first {w} marks bits {mark0[tuple(w)].nonzero().flatten().tolist()[:12]} pieces {mark1[tuple(w)].nonzero().flatten().tolist()[:12]}"
            print(line, flush=True)
        del res
    del q, k, v
    torch.cuda.empty_cache()
