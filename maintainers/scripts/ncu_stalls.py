"""Summarise `ncu --page source --csv --print-source sass` output: the SASS instructions with the
most warp-stall samples, and the stall reasons summed over the kernel.
    ncu -i report.ncu-rep --page source --csv --print-source sass > sass.csv
    python maintainers/scripts/ncu_stalls.py sass.csv [top]
"""
import csv
import sys


def number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def main(path, top=45):
    with open(path, newline="") as f:
        lines = [line for line in f if line.count(",") > 3]
    rows = list(csv.DictReader(lines))
    if not rows:
        print("no rows")
        return
    cols = list(rows[0].keys())
    print("columns:", " | ".join(cols))
    sample_col = next((c for c in cols if "Sampling (All" in c), None) or next(
        (c for c in cols if "Sampl" in c), None)
    src_col = next((c for c in cols if c.strip().lower() == "source"), cols[1])
    if sample_col is None:
        print("no stall-sampling column")
        return
    total = sum(number(r[sample_col]) for r in rows)
    print(f"total samples ({sample_col}): {total:.0f} over {len(rows)} instructions")
    reason_cols = [c for c in cols if c.lower().startswith("stall") or "stall_" in c.lower()]
    sums = sorted(((sum(number(r[c]) for r in rows), c) for c in reason_cols), reverse=True)
    for value, c in sums[:14]:
        if value:
            print(f"  {c:45s} {value:10.0f} {100 * value / max(total, 1):5.1f}%")
    ranked = sorted(rows, key=lambda r: number(r[sample_col]), reverse=True)[:top]
    addr_col = next((c for c in cols if "Address" in c), cols[0])
    for r in ranked:
        s = number(r[sample_col])
        top_reasons = sorted(((number(r[c]), c) for c in reason_cols), reverse=True)[:2]
        why = ", ".join(f"{c.replace('stall_', '')}={v:.0f}" for v, c in top_reasons if v)
        print(f"{100 * s / max(total, 1):5.1f}% {r[addr_col]:>6} {r[src_col][:70]:70s} {why}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 45)
