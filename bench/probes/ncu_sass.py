"""Where a kernel's warps wait, instruction by instruction: reads Nsight Compute's source page of one profiled kernel
(`ncu --section SourceCounters --section WarpStateStats -o REP ...`, then
`ncu -i REP.ncu-rep --page source --csv --print-source sass > REP.csv`) and prints

  * the stall samples by opcode (the SASS mnemonic without its modifiers, plus the full one for the top few),
  * the instructions with the most samples, each with the 3 instructions before it (what it waits on is usually
    the producer a few lines up: a SYNCS wait on an mbarrier, a WARPGROUP.DEPBAR on a wgmma, an LDG's consumer),
  * every per-reason sample column the export has (stall_long_sb, stall_barrier...), summed.

Session 18 (A18's per-issue stall ratios: long scoreboard 1.4-2.0, wait 1.6-1.9, barrier 1.0-1.2 on the pair and
one-block kernels) could not say which warps (producer or consumer) or which instructions the ratios come from.

    python bench/probes/ncu_sass.py REP.csv [--top 30]
"""
import csv
import re
import sys
from collections import defaultdict


def _num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def read(path):
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"') and "Source" in ln), None)
    if start is None:
        raise SystemExit(f"{path}: no source-page header (first lines: {lines[:3]})")
    rows = list(csv.DictReader(lines[start:]))
    return rows, list(rows[0].keys()) if rows else []


def opcode(src):
    s = re.sub(r"^\s*@!?U?P\w+\s+", "", src.strip())  # drop a predicate
    return s.split(" ")[0].rstrip(";") if s else "?"


def main(argv):
    path = argv[0]
    top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 30
    rows, cols = read(path)
    src_col = next(c for c in cols if c.strip() == "Source")
    all_col = next((c for c in cols if "Warp Stall Sampling (All" in c), None)
    ni_col = next((c for c in cols if "Not-issued" in c or "Not Issued" in c), None)
    if all_col is None:
        raise SystemExit(f"no stall-sampling column among {cols}")
    reason_cols = [c for c in cols if c.startswith("stall_") or "stalled" in c or c.startswith("smsp__pcsamp")]
    total = sum(_num(r[all_col]) for r in rows)
    print(f"# {path}: {len(rows)} SASS lines, {total:.0f} samples; columns: {cols}")
    by_op, by_full = defaultdict(float), defaultdict(float)
    for r in rows:
        s = _num(r[all_col])
        by_op[opcode(r[src_col]).split(".")[0]] += s
        by_full[opcode(r[src_col])] += s
    print("\n## samples by opcode")
    for op, s in sorted(by_op.items(), key=lambda x: -x[1])[:25]:
        print(f"{op:24s} {s:10.0f} {100 * s / max(total, 1):6.2f}%")
    print("\n## samples by full mnemonic (top 25)")
    for op, s in sorted(by_full.items(), key=lambda x: -x[1])[:25]:
        print(f"{op:40s} {s:10.0f} {100 * s / max(total, 1):6.2f}%")
    if reason_cols:
        print("\n## per-reason sample columns, summed")
        sums = {c: sum(_num(r[c]) for r in rows) for c in reason_cols}
        for c, s in sorted(sums.items(), key=lambda x: -x[1]):
            if s:
                print(f"{c:60s} {s:10.0f} {100 * s / max(total, 1):6.2f}%")
    print(f"\n## top {top} instructions (samples, not-issued samples, % of all) with the 3 before each")
    order = sorted(range(len(rows)), key=lambda i: -_num(rows[i][all_col]))[:top]
    for i in order:
        r = rows[i]
        extra = ""
        if reason_cols:
            rs = sorted(((c, _num(r[c])) for c in reason_cols), key=lambda x: -x[1])[:3]
            extra = " " + ", ".join(f"{c.replace('stall_', '')}={v:.0f}" for c, v in rs if v)
        ni = _num(r[ni_col]) if ni_col else 0
        print(f"--- line {i}: {_num(r[all_col]):.0f} / {ni:.0f} ({100 * _num(r[all_col]) / max(total, 1):.2f}%){extra}")
        for j in range(max(0, i - 3), i + 1):
            print(f"   {'>' if j == i else ' '} {j:5d} {rows[j][src_col].strip()[:110]}")


if __name__ == "__main__":
    main(sys.argv[1:])
