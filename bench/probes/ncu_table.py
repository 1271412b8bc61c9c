"""Nsight Compute CSV exports (`ncu --csv`, sections or `--metrics`) side by side: one row per (section, metric), one
column per file, as a markdown table. The profiler's own lines before the CSV header are skipped; a file with several
kernels gets one column per kernel ID. `--grep TEXT` keeps the metrics whose name holds TEXT (e.g. `stalled`); stall
ratios are sorted largest first by the first column. Session 17 read ncu_pair_{pwt,novt,pwt_peel}_s17_h200.csv this
way; A18's ncu_stalls_*.csv are the next.

    python bench/probes/ncu_table.py A.csv B.csv ... [--grep TEXT]
"""
import csv
import sys


def read(path):
    """{(section, metric, unit): value} per kernel ID of one export."""
    lines = [ln for ln in open(path, encoding="utf-8", errors="replace") if ln.startswith('"')]
    out = {}
    for row in csv.DictReader(lines):
        if not row.get("Metric Name"):
            continue
        key = (row.get("Section Name", ""), row["Metric Name"], row.get("Metric Unit", ""))
        out.setdefault(row.get("ID", "0"), {})[key] = row.get("Metric Value", "")
    return out


def _num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return None


def table(paths, grep=None):
    cols, data = [], []
    for p in paths:
        per_id = read(p)
        for kid, vals in per_id.items():
            cols.append(p.rsplit("/", 1)[-1] + ("" if len(per_id) == 1 else f"#{kid}"))
            data.append(vals)
    keys = list(dict.fromkeys(k for d in data for k in d))
    if grep:
        keys = [k for k in keys if grep in k[1]]
    if grep and "stalled" in grep and data:
        keys.sort(key=lambda k: -(_num(data[0].get(k, "")) or 0.0))
    rows = ["| section | metric | unit | " + " | ".join(cols) + " |", "|---|---|---|" + "---|" * len(cols)]
    for k in keys:
        name = k[1].replace("smsp__average_warps_issue_stalled_", "stall: ").replace("_per_issue_active.ratio", "")
        rows.append(f"| {k[0]} | {name} | {k[2]} | " + " | ".join(d.get(k, "") for d in data) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    args = sys.argv[1:]
    grep = None
    if "--grep" in args:
        i = args.index("--grep")
        grep = args[i + 1]
        del args[i:i + 2]
    if not args:
        sys.exit(__doc__)
    print(table(args, grep))
