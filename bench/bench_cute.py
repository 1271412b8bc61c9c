"""CuTe-DSL backend vs the Triton backend on the H200 (issue 6), at the shapes of ../shared/ANCHORS.md.

    python bench/bench_cute.py --out DIR [--shapes wan14,flux,wan13,wan14_720] [--rep 100] [--budget-s 200]

For each shape, variant (pwt, pisa, drop) and density (0.125; Wan2.1-14B 480p also 0.25 and 0.5):
  * full operator: `kernels.triton.forward` vs `kernels.cute.forward`, the same Triton statistics and routing,
    so the difference is the attention kernel;
  * attention kernel alone: routing precomputed once (`kernels.triton.prepare`: st, idx, vbias), then
    `kernels.triton.fwd.attention` vs `kernels.cute.fwd.attention` on the same inputs;
  * rel L2 of cute vs triton on both (a fast kernel that computes something else must show here);
  * the first call of each (shape, variant) through the cute backend, wall seconds (JIT compile included),
    and `kernels.cute.compile_stats()` at the end.
Dense at each shape: cuDNN SDPA, flash SDPA, FA4 dense when flash-attn-4 imports (bench/peers.py).
Timing, inputs and shapes are bench/bench_attention.py's (median of triton.testing.do_bench, random bf16 N(0,1),
B=1, D=128, first call outside the timing). Writes DIR/cute_h200.json and DIR/cute_h200.md, after every shape
(partial results survive a time-out); prints one line per measurement. `--budget-s` bounds the wall time: the
measurements left when it runs out are recorded as skipped, so a run stays under 4 minutes on the H200.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_attention as BA  # noqa: E402  (puts the repo root on sys.path; timing, inputs, shapes)
import peers as P  # noqa: E402
import torch  # noqa: E402

from kernels import cute as kc  # noqa: E402
from kernels import triton as kt  # noqa: E402
from kernels.triton import fwd as ktf  # noqa: E402

SHAPES = {"wan14": BA.WAN14, "flux": BA.FLUX, "wan13": BA.WAN13, "wan14_720": BA.WAN720}
DENSITIES = {"wan14": (0.125, 0.25, 0.5)}  # every other shape: 0.125
VARIANTS = ("pwt", "pisa", "drop")
T0 = time.time()


def say(*parts):
    print(f"[{time.time() - T0:6.1f}s]", *parts, flush=True)


def _short(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}".replace("\n", " ")
    return s[:300]


def timed(label: str, fn, rep: int):
    """Median ms of fn (first call outside, as in bench_attention.ms) or 'failed: ...'; one printed line."""
    try:
        fn()
        torch.cuda.synchronize()
        t = BA.ms(fn, rep=rep)
    except Exception as e:
        traceback.print_exc()
        say(label, "FAILED", _short(e))
        return f"failed: {_short(e)}"
    say(f"{label}: {t:.3f} ms")
    return t


def _cute_fwd():
    """kernels.cute.fwd (imported only once the backend said it can run: it needs nvidia-cutlass-dsl)."""
    import importlib
    return importlib.import_module("kernels.cute.fwd")


def first_call_s(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def _num(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _ratio(a, b):
    return a / b if _num(a) and _num(b) and b > 0 else None


def dense_row(key, q, k, v, rep):
    n = BA.name(q.shape)
    return {"shape": n, "key": key,
            "sdpa_cudnn_ms": timed(f"{n} cuDNN SDPA", lambda: BA.sdpa_cudnn(q, k, v), rep),
            "sdpa_flash_ms": timed(f"{n} flash SDPA", lambda: BA.sdpa_flash(q, k, v), rep),
            "fa4_dense_ms": _fa4(n, q, k, v, rep)}


def _fa4(n, q, k, v, rep):
    t = P.time_fa4_dense(q, k, v, ms=lambda fn: BA.ms(fn, rep=rep))
    say(f"{n} FA4 dense: " + (f"{t:.3f} ms" if _num(t) else str(t)))
    return t


def sparse_row(q, k, v, cfg, rep, cute_ok: bool):
    n = BA.name(q.shape)
    tag = f"{n} {cfg.variant} d={cfg.density:g}"
    row = {"shape": n, "variant": cfg.variant, "density": cfg.density}
    if cute_ok:
        # the first call: JIT compile of this shape class (if new) + one run
        try:
            row["cute_first_call_s"] = first_call_s(lambda: kc.forward(q, k, v, cfg))
            say(f"{tag} cute first call: {row['cute_first_call_s']:.2f} s")
        except Exception as e:
            traceback.print_exc()
            row["cute_first_call_s"] = f"failed: {_short(e)}"
            say(tag, "cute first call FAILED", _short(e))
            cute_ok = False
    row["triton_ms"] = timed(f"{tag} triton full", lambda: kt.forward(q, k, v, cfg), rep)
    if cute_ok:
        row["cute_ms"] = timed(f"{tag} cute full", lambda: kc.forward(q, k, v, cfg), rep)
        try:
            row["rel_full_cute_vs_triton"] = BA.rel(kc.forward(q, k, v, cfg), kt.forward(q, k, v, cfg))
            say(f"{tag} full rel L2 cute vs triton: {row['rel_full_cute_vs_triton']:.2e}")
        except Exception as e:
            row["rel_full_cute_vs_triton"] = f"failed: {_short(e)}"
    # attention kernel alone, routing precomputed (all heads at once, no chunking)
    st, idx, vbias = kt.prepare(q, k, v, cfg)
    vb = vbias if cfg.variant in ("pisa", "pwt") else None
    row["K"] = int(idx.shape[-1])
    out_t = torch.empty_like(q)
    row["triton_attn_ms"] = timed(f"{tag} triton attention only",
                                  lambda: ktf.attention(q, k, v, out_t, st, idx, vbias, cfg), rep)
    if cute_ok:
        out_c = torch.empty_like(q)
        row["cute_attn_ms"] = timed(f"{tag} cute attention only",
                                    lambda: _cute_fwd().attention(q, k, v, out_c, st, idx, vb, cfg), rep)
        if _num(row["cute_attn_ms"]) and _num(row["triton_attn_ms"]):
            row["rel_attn_cute_vs_triton"] = BA.rel(out_c, out_t)
            say(f"{tag} attention rel L2 cute vs triton: {row['rel_attn_cute_vs_triton']:.2e}")
    row["speedup_full"] = _ratio(row.get("triton_ms"), row.get("cute_ms"))
    row["speedup_attn"] = _ratio(row.get("triton_attn_ms"), row.get("cute_attn_ms"))
    del st, idx, vbias, vb
    return row


def _fmt(x, nd=3):
    if x is None:
        return "-"
    if _num(x):
        return f"{x:.{nd}f}" if abs(x) >= 1e-2 or x == 0 else f"{x:.1e}"
    return str(x)[:40]


def markdown(res) -> str:
    env = res.get("env", {})
    v = res.get("versions", {})
    lines = [
        "# CuTe-DSL backend vs Triton backend (bench/bench_cute.py)", "",
        f"{env.get('gpu')} (SM {env.get('sm')}), torch {env.get('torch')}, triton {env.get('triton')}, "
        f"nvidia-cutlass-dsl {v.get('nvidia-cutlass-dsl')}, flash-attn-4 {v.get('flash-attn-4')}; {env.get('date')}.",
        f"cute backend: {res.get('cute_status') or 'usable'}.",
        "Random bf16 N(0,1) q/k/v, B=1, D=128, median of triton.testing.do_bench, first call outside the timing. "
        "full = statistics + routing (Triton, identical for both) + attention; attention only = the kernel on "
        "precomputed routing.", "",
        "| shape | variant | density | K | triton full ms | cute full ms | speedup | triton attn ms | cute attn ms | "
        "attn speedup | rel cute vs triton | cute first call s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        if "skipped" in r:
            lines.append(f"| {r['shape']} | {r['variant']} | {r['density']:g} | skipped: {r['skipped']} "
                         "| | | | | | | | |")
            continue
        lines.append("| " + " | ".join([
            r["shape"], r["variant"], f"{r['density']:g}", str(r.get("K", "-")), _fmt(r.get("triton_ms")),
            _fmt(r.get("cute_ms")), _fmt(r.get("speedup_full"), 2), _fmt(r.get("triton_attn_ms")),
            _fmt(r.get("cute_attn_ms")), _fmt(r.get("speedup_attn"), 2),
            _fmt(r.get("rel_attn_cute_vs_triton", r.get("rel_full_cute_vs_triton"))),
            _fmt(r.get("cute_first_call_s"), 2)]) + " |")
    lines += ["", "Dense attention next to the cute pwt time at density 0.125 (full operator):", "",
              "| shape | cuDNN SDPA ms | flash SDPA ms | FA4 dense ms | cute pwt 0.125 ms | FA4 dense / cute | "
              "SDPA / cute |", "|---|---|---|---|---|---|---|"]
    for d in res["dense"]:
        c = next((r.get("cute_ms") for r in res["rows"] if r["shape"] == d["shape"] and r["variant"] == "pwt"
                  and r["density"] == 0.125), None)
        lines.append("| " + " | ".join([d["shape"], _fmt(d["sdpa_cudnn_ms"]), _fmt(d["sdpa_flash_ms"]),
                                        _fmt(d["fa4_dense_ms"]), _fmt(c), _fmt(_ratio(d["fa4_dense_ms"], c), 2),
                                        _fmt(_ratio(d["sdpa_cudnn_ms"], c), 2)]) + " |")
    why = sorted({r["cute"] for r in res["rows"] if r.get("cute")})
    if why:
        lines += ["", "Rows without cute numbers: " + "; ".join(why)]
    lines += ["", f"Compile seconds per shape class (kernels.cute.compile_stats()): "
              f"`{json.dumps(res.get('compile_stats'))}`", f"Wall time of the run: {res.get('wall_s')} s."]
    tgt = res.get("target")
    if tgt:
        lines += ["", f"Issue 6 target (Wan2.1-14B 480p, pwt, density 0.125, cute >= 1.3x triton, full operator): "
                      f"{_fmt(tgt.get('speedup'), 2)}x -> {'met' if tgt.get('met') else 'NOT met'}."]
    return "\n".join(lines) + "\n"


def write(out: Path, res):
    res["wall_s"] = round(time.time() - T0, 1)
    (out / "cute_h200.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "cute_h200.md").write_text(markdown(res))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {','.join(SHAPES)}")
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    ap.add_argument("--budget-s", type=float, default=200.0,
                    help="stop starting new measurements after this many seconds (recorded as skipped)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    BA.env()
    res = {"env": BA.RES["env"], "versions": P.versions(), "rep_ms": a.rep, "rows": [], "dense": []}
    probe = BA.rnd((1, 1, 64, 128))
    res["cute_status"] = kc.unavailable_reason(probe, BA.cfg_of(128, 0.125, "pwt"))
    say("cute backend:", res["cute_status"] or "usable")
    for key in a.shapes.split(","):
        shape = SHAPES[key]
        q, k, v = BA.qkv(shape)
        if time.time() - T0 > a.budget_s:
            res["dense"].append({"shape": BA.name(shape), "key": key, "sdpa_cudnn_ms": "skipped: time budget",
                                 "sdpa_flash_ms": "skipped", "fa4_dense_ms": "skipped"})
        else:
            res["dense"].append(dense_row(key, q, k, v, a.rep))
        for d in DENSITIES.get(key, (0.125,)):
            for variant in VARIANTS:
                cfg = BA.cfg_of(128, d, variant)
                if time.time() - T0 > a.budget_s:
                    res["rows"].append({"shape": BA.name(shape), "variant": variant, "density": d,
                                        "skipped": "time budget"})
                    say(f"{BA.name(shape)} {variant} d={d:g} skipped (time budget)")
                    continue
                why = kc.unavailable_reason(q, cfg)
                try:
                    row = sparse_row(q, k, v, cfg, a.rep, cute_ok=why is None)
                except Exception as e:
                    traceback.print_exc()
                    row = {"shape": BA.name(shape), "variant": variant, "density": d, "error": _short(e)}
                if why is not None:
                    row["cute"] = why
                res["rows"].append(row)
        del q, k, v
        torch.cuda.empty_cache()
        res["compile_stats"] = kc.compile_stats()
        write(out, res)
    res["compile_stats"] = kc.compile_stats()
    say("compile_stats:", json.dumps(res["compile_stats"]))
    t = next((r for r in res["rows"] if r["shape"] == BA.name(BA.WAN14) and r["variant"] == "pwt"
              and r["density"] == 0.125), None)
    if t is not None and t.get("speedup_full") is not None:
        res["target"] = {"speedup": t["speedup_full"], "met": t["speedup_full"] >= 1.3}
        say(f"target: Wan2.1-14B pwt 0.125 cute/triton speedup {t['speedup_full']:.2f}x (>= 1.3x: "
            f"{'met' if res['target']['met'] else 'NOT met'})")
    write(out, res)
    say(f"wrote {out / 'cute_h200.json'} and {out / 'cute_h200.md'}")


if __name__ == "__main__":
    main()
