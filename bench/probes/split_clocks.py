"""H200 probe (session 25): the pair kernel's timing builds (bench/probes/pair_split.py's parts removed one at a time)
with the SM clock, power and throttle reasons sampled while each runs back to back. A38's clocks probe found the
node's 480p call power-capped alone (median 1665 MHz, clock-event reason 0x4, SW power cap, at ~690 W); the tile
stream alone (the consumers only wait for and release their tiles: no GEMMs, no softmax) may run at a higher clock,
so session 18's "stream floor" (4.75 ms at 480p) may be a floor at a clock the full kernel cannot hold. Per build:
its time (CUDA events, median), the median SM clock, power, and time x clock (the build's cycles: if the stream's
cycles match the exact part's, the exact part is stream-bound at its own clock and the gap above the stream's time
is the power cap's).

Random bf16 [1, 40, T, 128], pwt d 0.125, one precomputed routing; PROBE_T (default 32760), PROBE_SECONDS per build
(default 3), builds in PROBE_BUILDS (default pwt, novt, novt+stream, stream; a "share:" prefix runs the build with
the pair kernel's shared exact pipeline, fwd_pair.py share=True; a build listed again is timed again, as
"build#2"). PROBE_INPUTS=ditlike: kernels/synthetic.py's DiT-like q, k, v on Wan2.1-14B 480p's grid (21, 30, 52),
Morton-ordered as the node orders them (adjacent query blocks' lists share ~61% of their blocks; T is then 32760).
Prints one line `RESULT {...}`.

    python bench/probes/split_clocks.py"""
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, ".")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clocks import sampler, samples  # noqa: E402
from kernels.config import SparseConfig  # noqa: E402
from kernels.cute import fwd as kcf  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402

SECONDS = float(os.environ.get("PROBE_SECONDS", "3"))
BUILDS = os.environ.get("PROBE_BUILDS", "pwt,novt,novt+stream,stream").split(",")


def main():
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "seconds": SECONDS}
    path = tempfile.NamedTemporaryFile(suffix=".csv", delete=False).name
    proc = sampler(path)
    if proc is not None:  # the idle GPU first: the static share of every build's power
        time.sleep(0.5)
        t0 = time.time()
        time.sleep(SECONDS)
        rows = samples(path, t0, time.time())
        if rows:
            res["idle"] = {"sm_clock_mhz_median": statistics.median(r[0] for r in rows),
                           "power_w_median": statistics.median(r[1] for r in rows), "samples": len(rows)}
            print("idle", json.dumps(res["idle"]), flush=True)
    ditlike = os.environ.get("PROBE_INPUTS", "") == "ditlike"
    res["inputs"] = "ditlike-morton" if ditlike else "random"
    for T in [int(t) for t in os.environ.get("PROBE_T", "32760").split(",")]:
        torch.manual_seed(0)
        if ditlike:
            from kernels.reorder import apply_reorder, orders_on
            from kernels.synthetic import dit_like_qkv
            grid = (21, 30, 52)
            perm, _ = orders_on(grid, torch.device("cuda"))
            q, k, v = (apply_reorder(x.cuda(), perm, 0).contiguous()
                       for x in dit_like_qkv(grid, heads=40, head_dim=128, dtype=torch.bfloat16))
            T = q.shape[2]
        else:
            q, k, v = (torch.randn(1, 40, T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cfg = SparseConfig(density=0.125, variant="pwt", band=1, n_sink_blocks=0, scale=128 ** -0.5)
        st = kts.block_stats(q, k, v, cfg)
        idx, vbias = kts.route(st, cfg, q.dtype)
        out = torch.empty_like(q)
        def call(b):
            share = b.startswith("share:")
            p = b.split(":")[-1]
            p = "" if p == "pwt" else p
            return kcf.attention(q, k, v, out, st, idx, vbias, cfg, probe=p, **({"share": True} if share else {}))

        for b in dict.fromkeys(BUILDS):
            call(b)  # compile
        torch.cuda.synchronize()
        time.sleep(1.0)
        dT = res[str(T)] = {}
        for i_b, b in enumerate(BUILDS):
            ev = []
            t0 = time.time()
            while time.time() - t0 < SECONDS:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                call(b)
                e1.record()
                ev.append((e0, e1))
                if len(ev) % 8 == 0:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            t1 = time.time()
            ms = sorted(e0.elapsed_time(e1) for e0, e1 in ev)
            key = b if b not in dT else f"{b}#{BUILDS[:i_b + 1].count(b)}"  # a build listed again: a second round
            d = dT[key] = {"iterations": len(ms), "ms_median": statistics.median(ms),
                           "ms_p10_p90": [ms[len(ms) // 10], ms[(9 * len(ms)) // 10]]}
            time.sleep(0.2)
            if proc is not None:
                rows = samples(path, t0 + 0.5, t1)
                if rows:
                    d["sm_clock_mhz_median"] = statistics.median(r[0] for r in rows)
                    d["power_w_median"] = statistics.median(r[1] for r in rows)
                    d["throttle_reasons"] = sorted({r[3] for r in rows})
                    d["samples"] = len(rows)
                    d["mcycles"] = round(d["ms_median"] * d["sm_clock_mhz_median"] / 1000.0, 3)  # ms x MHz / 1e3
            print(T, key, json.dumps(d), flush=True)
        del q, k, v, st, idx, vbias, out
        torch.cuda.empty_cache()
    if proc is not None:
        proc.terminate()
    print("RESULT " + json.dumps(res), flush=True)


main()
