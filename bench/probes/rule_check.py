"""A device call's on/off rule, checked on its probe's output: bench/gpu_round.sh's phases write each switch's rule in
their header before timing; this applies it to the `RESULT {...}` line of bench/probes/vt_peel_kernel.py (the kernels
alone) or bench/probes/switch_ab.py (the node's call), and to the switch's pytest log, so the call's round.log carries
the decision with its reasons. Prints one line per row it read, then `DECISION NAME on|off: reasons`.

    python bench/probes/rule_check.py NAME PROBE_OUTPUT [--tests LOG [--tests-k SUBSTR]] [--rows SUBSTR]
        [--faster-rounds N] [--bitwise] [--novt-not-slower] [--max-ratio R] [--peak-below X] [--clocks R]
        [--vs-row SUBSTR --vs-max R]

--tests-k: only the failures whose test id holds SUBSTR count against NAME (one log for several switches' tests);
--rows: the rows whose key holds SUBSTR (default NAME: a vt_peel_kernel.py output may time several switches);
--clocks R: the output is bench/probes/split_clocks.py's; every "share:" build's median <= R x its twin's (both rounds);
--vs-row SUBSTR --vs-max R: switched on, every row's median <= R x the median of all rounds of the row holding
SUBSTR (one the switch does not change, e.g. switch_ab's wan14_none: Morton's time against the node's layout unordered);
--faster-rounds N: switched on, faster in >= N rounds of every row; --bitwise: the two outputs equal (maxdiff 0);
--novt-not-slower: the build without virtual tiles (the exact part) not slower switched on (median); --max-ratio R:
median on / median off <= R in every row (the graph replay's medians where a row has them); --peak-below X: the
call's peak memory above its output under X times q's bytes, switched on.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys


def result_of(path: str) -> dict:
    """The last `RESULT {...}` line of a probe's output ({} if none)."""
    res = {}
    for line in open(path, errors="replace"):
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
    return res


def tests_ok(path: str, k: str | None = None) -> tuple[bool, str]:
    """(passed, pytest's summary line): the run ended with a summary that some tests passed, and none failed or
    erred; with `k`, only the failures whose test id holds k count (one log for several switches' tests)."""
    lines = [ln.strip() for ln in open(path, errors="replace") if ln.strip()]
    summary = next((ln for ln in reversed(lines) if re.search(r"\d+ (passed|failed|error)", ln)), "no pytest summary")
    if "passed" not in summary:
        return False, summary
    if k is None:
        return not re.search(r"\d+ (failed|errors?)\b", summary), summary
    bad = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR ")) and k in ln]
    return not bad, summary + (f" ({len(bad)} of them {k!r})" if bad else "")


def _faster_rounds(d: dict) -> int:
    if "op1_faster_rounds" in d:
        return int(d["op1_faster_rounds"])
    r = 0
    while f"op0_r{r}_ms" in d:
        r += 1
    return sum(d[f"op1_r{i}_ms"] < d[f"op0_r{i}_ms"] for i in range(r))


def _median(d: dict, op: str) -> float | None:
    return d.get(f"op{op}_replay_median_ms", d.get(f"op{op}_median_ms"))


def check(res: dict, rows: str, *, faster_rounds: int | None = None, bitwise: bool = False,
          novt_not_slower: bool = False, max_ratio: float | None = None,
          peak_below: float | None = None) -> tuple[list[str], list[str]]:
    """(one line per row, the reasons the rule fails: empty when it holds)."""
    lines, fails = [], []
    picked = {k: d for k, d in res.items() if isinstance(d, dict) and rows in k}
    if not picked:
        return lines, [f"no row holding {rows!r} in the result"]
    for key, d in picked.items():
        if "error" in d:
            fails.append(f"{key}: {d['error'][:120]}")
            continue
        m0, m1 = _median(d, "0"), _median(d, "1")
        if m0 is None or m1 is None:
            fails.append(f"{key}: no medians")
            continue
        fr = _faster_rounds(d)
        line = f"{key}: {m0:.4f} -> {m1:.4f} ms ({m1 / m0 - 1:+.1%}), faster in {fr} rounds"
        if "maxdiff" in d:
            line += f", maxdiff {d['maxdiff']:.3g}"
        if "novt_median_ms" in d and "novt1_median_ms" in d:
            line += f", novt {d['novt_median_ms']:.4f} -> {d['novt1_median_ms']:.4f}"
        if "op1_peak_extra_x_q" in d:
            line += f", peak {d.get('op0_peak_extra_x_q', float('nan')):.2f}x -> {d['op1_peak_extra_x_q']:.2f}x q"
        lines.append(line)
        if faster_rounds is not None and fr < faster_rounds:
            fails.append(f"{key}: faster in {fr} rounds (< {faster_rounds})")
        if bitwise and d.get("maxdiff", 1.0) != 0.0:
            fails.append(f"{key}: outputs differ (maxdiff {d.get('maxdiff')})")
        if novt_not_slower and "novt1_median_ms" in d and d["novt1_median_ms"] > d["novt_median_ms"]:
            fails.append(f"{key}: the exact part slower ({d['novt_median_ms']:.4f} -> {d['novt1_median_ms']:.4f})")
        if max_ratio is not None and m1 > max_ratio * m0:
            fails.append(f"{key}: {m1 / m0 - 1:+.1%} (> {max_ratio - 1:+.1%})")
        if peak_below is not None and "op1_peak_extra_x_q" in d and d["op1_peak_extra_x_q"] >= peak_below:
            fails.append(f"{key}: peak {d['op1_peak_extra_x_q']:.2f}x q (>= {peak_below}x)")
    return lines, fails


def vs_check(res: dict, rows: str, vs_row: str, vs_max: float) -> tuple[list[str], list[str]]:
    """Every row holding `rows`, switched on, against the row holding `vs_row` (the median of both its arms' rounds):
    (one line per row, the reasons the rule fails)."""
    ref = [d for k, d in res.items() if isinstance(d, dict) and vs_row in k and "error" not in d]
    rounds = [d[k] for d in ref[:1] for k in d if re.fullmatch(r"op[01]_r\d+_ms", k)]
    if not rounds:
        return [], [f"no reference row holding {vs_row!r}"]
    m_ref = statistics.median(rounds)
    lines, fails = [], []
    for key, d in res.items():
        if not isinstance(d, dict) or rows not in key or vs_row in key or _median(d, "1") is None:
            continue
        m1 = _median(d, "1")
        lines.append(f"{key} on: {m1:.4f} ms against {vs_row} {m_ref:.4f} ({m1 / m_ref - 1:+.1%})")
        if m1 > vs_max * m_ref:
            fails.append(f"{key}: {m1 / m_ref - 1:+.1%} over {vs_row} (> {vs_max - 1:+.1%})")
    return lines, fails


def clocks_check(res: dict, max_ratio: float, prefix: str = "share:") -> tuple[list[str], list[str]]:
    """bench/probes/split_clocks.py's RESULT: every build B with a `prefix`B twin (and their second rounds, "#2"), the
    twin's median over B's must be <= max_ratio (e.g. 0.97: >= 3% faster; 1.01: not slower than 1%)."""
    lines, fails = [], []
    for t, rows in res.items():
        if not isinstance(rows, dict) or not any(isinstance(d, dict) and "ms_median" in d for d in rows.values()):
            continue
        for key, d in rows.items():
            if key.startswith(prefix) or not isinstance(d, dict) or prefix + key not in rows:
                continue
            m0, m1 = d["ms_median"], rows[prefix + key]["ms_median"]
            c0, c1 = d.get("sm_clock_mhz_median"), rows[prefix + key].get("sm_clock_mhz_median")
            line = f"T {t} {key}: {m0:.4f} -> {m1:.4f} ms ({m1 / m0 - 1:+.1%})"
            if c0 and c1:
                line += f", {c0:.0f} -> {c1:.0f} MHz, {m0 * c0 / 1e3:.2f} -> {m1 * c1 / 1e3:.2f} M cycles"
            lines.append(line)
            if m1 > max_ratio * m0:
                fails.append(f"T {t} {key}: {m1 / m0 - 1:+.1%} (> {max_ratio - 1:+.1%})")
    if not lines:
        fails.append(f"no build with a {prefix!r} twin in the result")
    return lines, fails


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name")
    ap.add_argument("output")
    ap.add_argument("--tests")
    ap.add_argument("--tests-k")
    ap.add_argument("--rows")
    ap.add_argument("--faster-rounds", type=int)
    ap.add_argument("--bitwise", action="store_true")
    ap.add_argument("--novt-not-slower", action="store_true")
    ap.add_argument("--max-ratio", type=float)
    ap.add_argument("--peak-below", type=float)
    ap.add_argument("--clocks", type=float, metavar="MAX_RATIO")
    ap.add_argument("--vs-row")
    ap.add_argument("--vs-max", type=float)
    a = ap.parse_args(argv)
    fails = []
    if a.tests:
        ok, summary = tests_ok(a.tests, a.tests_k)
        print(f"tests: {summary}")
        if not ok:
            fails.append(f"tests: {summary}")
    try:
        res = result_of(a.output)
    except OSError as e:
        res, fails = {}, fails + [f"no probe output ({e.strerror})"]
    rows = a.name if a.rows is None else a.rows
    if a.clocks is not None:
        lines, row_fails = clocks_check(res, a.clocks)
    else:
        lines, row_fails = check(res, rows, faster_rounds=a.faster_rounds,
                                 bitwise=a.bitwise, novt_not_slower=a.novt_not_slower, max_ratio=a.max_ratio,
                                 peak_below=a.peak_below)
    if a.vs_row is not None:
        vs_lines, vs_fails = vs_check(res, rows, a.vs_row, a.vs_max or 1.0)
        lines, row_fails = lines + vs_lines, row_fails + vs_fails
    for line in lines:
        print(line)
    fails += row_fails
    print(f"DECISION {a.name} {'off' if fails else 'on'}: {'; '.join(fails) if fails else 'every rule holds'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
