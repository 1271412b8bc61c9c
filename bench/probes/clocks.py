"""H200 probe (issue 11, built in session 24 for the next device time): is the pair kernel slower inside a DiT step
because the GPU runs it at lower clocks? Session 23's DiT step (480p, torch.profiler) had the pair kernel at 6.43 ms
per call against 5.45-5.53 alone, and the statistics at 0.865 against 0.761: ~15% slower inside the model, where
GEMMs at full power run between the calls.

Three phases, each ~PROBE_SECONDS (default 4) of back-to-back work, while `nvidia-smi` samples the SM clock, power,
temperature and the active clock-event (throttle) reasons every 20 ms:

* `attention`: the node's Wan2.1-14B 480p call (pwt d 0.125, Morton, CuTe, ComfyUI's layout), back to back;
* `gemm`: the model's two largest GEMMs per block (the FFN: [T, 5120] x [5120, 13824] and back), back to back;
* `mixed`: per iteration the FFN GEMMs, then the attention call, as a DiT block runs them (no host gaps).

Per phase: the attention call's GPU time from CUDA events (phases `attention` and `mixed`), the median SM clock,
power and the throttle reasons seen. Prediction: if clocks explain the 15%, `mixed` runs the attention call ~15%
slower than `attention` at an SM clock ~15% lower. Prints one line `RESULT {...}`.

    python bench/probes/clocks.py
"""
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, ".")
from kernels import piecewise_sparse_attention as psa  # noqa: E402

SECONDS = float(os.environ.get("PROBE_SECONDS", "4"))
GRID, H, D, DIM, FFN = (21, 30, 52), 40, 128, 5120, 13824
T = math.prod(GRID)
FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,{reasons}"


def sampler(path):
    """nvidia-smi writing one CSV line per 20 ms to `path` (None where nvidia-smi is missing). The throttle reasons'
    field is clocks_event_reasons.active on newer drivers, clocks_throttle_reasons.active on older ones."""
    for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        fields = FIELDS.format(reasons=reasons)
        try:
            ok = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                                capture_output=True, text=True).returncode == 0
        except FileNotFoundError:
            return None
        if ok:
            return subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms",
                                     "20", "-f", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return None


def samples(path, t0, t1):
    """(SM clock MHz, power W, temperature C, throttle reasons) of the samples taken between wall times t0 and t1."""
    out = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        try:
            ts = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            ts += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            row = (float(parts[1]), float(parts[2]), float(parts[3]), parts[4])
        except (ValueError, IndexError):
            continue
        if t0 <= ts <= t1:
            out.append(row)
    return out


def main():
    torch.manual_seed(0)
    x = [torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3)]
    q, k, v = x
    kw = dict(density=0.125, variant="pwt", reorder="morton", grid=GRID, n_prefix=0, backend="cute",
              on_failure="raise", out_layout="bthd")
    a = torch.randn(T, DIM, device="cuda", dtype=torch.bfloat16)
    w1 = torch.randn(DIM, FFN, device="cuda", dtype=torch.bfloat16) / DIM ** 0.5
    w2 = torch.randn(FFN, DIM, device="cuda", dtype=torch.bfloat16) / FFN ** 0.5

    def attention():
        return psa(q, k, v, **kw)

    def ffn():
        return (a @ w1) @ w2

    for _ in range(3):  # compile, autotune
        attention()
        ffn()
    torch.cuda.synchronize()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "seconds": SECONDS, "T": T}
    path = tempfile.NamedTemporaryFile(suffix=".csv", delete=False).name
    proc = sampler(path)
    time.sleep(0.5)
    for phase in ("attention", "gemm", "mixed", "attention_again"):
        ev = []
        t0 = time.time()
        while time.time() - t0 < SECONDS:
            if phase in ("gemm", "mixed"):
                ffn()
            if phase != "gemm":
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                attention()
                e1.record()
                ev.append((e0, e1))
            if len(ev) % 8 == 0:
                torch.cuda.synchronize()  # keep the host at most a few calls ahead, the clock samples in phase
        torch.cuda.synchronize()
        t1 = time.time()
        d = res[phase] = {"iterations": len(ev)}
        if ev:
            ms = [e0.elapsed_time(e1) for e0, e1 in ev]
            d["attention_ms_median"] = statistics.median(ms)
            d["attention_ms_p10_p90"] = [sorted(ms)[len(ms) // 10], sorted(ms)[(9 * len(ms)) // 10]]
        time.sleep(0.2)
        if proc is not None:
            rows = samples(path, t0 + 0.5, t1)  # the phase's first half second is the previous phase's tail
            if rows:
                d["sm_clock_mhz_median"] = statistics.median(r[0] for r in rows)
                d["sm_clock_mhz_min_max"] = [min(r[0] for r in rows), max(r[0] for r in rows)]
                d["power_w_median"] = statistics.median(r[1] for r in rows)
                d["temperature_c_max"] = max(r[2] for r in rows)
                d["throttle_reasons"] = sorted({r[3] for r in rows})
                d["samples"] = len(rows)
        print(phase, json.dumps(d), flush=True)
    if proc is not None:
        proc.terminate()
    if "attention" in res and "mixed" in res and res["attention"].get("attention_ms_median"):
        res["mixed_over_alone"] = res["mixed"]["attention_ms_median"] / res["attention"]["attention_ms_median"]
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
