"""Summarise the source page of an Nsight Compute report exported as CSV
(`ncu -i R.ncu-rep --page source --csv --print-source sass`, scripts/device_round.sh's ncu stage):
per kernel, the warp-stall samples by reason and the SASS instructions that collect the most.

    python maintainers/scripts/ncu_sass_hotspots.py FILE.csv [--top 40] [--kernel SUBSTRING] [--loop]

--loop keeps only the instructions from the first to the last HGMMA (the main loop of the math
warps; the producer's and the writer's waits lie outside it in these kernels).
"""
from __future__ import annotations

import argparse
import csv
import io
from collections import Counter


def kernels(path):
    """Yields (kernel name, rows) for each kernel in the CSV."""
    name, rows, header = None, [], None
    with open(path, newline="") as f:
        text = f.read()
    for rec in csv.reader(io.StringIO(text)):
        if not rec:
            continue
        if rec[0] == "Kernel Name":
            if name is not None:
                yield name, rows
            name, rows, header = rec[1], [], None
        elif rec[0] == "Address":
            header = rec
        elif header is not None:
            rows.append(dict(zip(header, rec)))
    if name is not None:
        yield name, rows


def as_int(x):
    try:
        return int(x.replace(",", ""))
    except (ValueError, AttributeError):
        return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--kernel", default="")
    ap.add_argument("--loop", action="store_true",
                    help="only the instructions between the first and the last HGMMA")
    args = ap.parse_args()
    for name, rows in kernels(args.csv):
        if args.kernel not in name:
            continue
        if args.loop:
            hgmma = [i for i, r in enumerate(rows) if "HGMMA" in r["Source"]]
            if hgmma:
                rows = rows[hgmma[0]:hgmma[-1] + 1]
        total = sum(as_int(r["Warp Stall Sampling (All Samples)"]) for r in rows)
        reasons = Counter()
        for r in rows:
            for k, v in r.items():
                if k.startswith("stall_") and "(Not Issued)" not in k:
                    reasons[k] += as_int(v)
        print(f"== {name[:140]}\n   {len(rows)} SASS instructions, {total} samples")
        print("   by reason: " + ", ".join(f"{k[6:]} {100 * v / max(total, 1):.1f}%"
                                         for k, v in reasons.most_common(10)))
        opcodes = Counter()
        for r in rows:
            op = r["Source"].split()[0] if r["Source"].split() else "?"
            if op.startswith("@"):
                op = r["Source"].split()[1]
            opcodes[op.split(".")[0]] += as_int(r["Warp Stall Sampling (All Samples)"])
        print("   by opcode: " + ", ".join(f"{k} {100 * v / max(total, 1):.1f}%"
                                         for k, v in opcodes.most_common(12)))
        ranked = sorted(range(len(rows)),
                        key=lambda i: -as_int(rows[i]["Warp Stall Sampling (All Samples)"]))
        for i in ranked[:args.top]:
            r = rows[i]
            s = as_int(r["Warp Stall Sampling (All Samples)"])
            top = sorted(((as_int(v), k[6:]) for k, v in r.items()
                          if k.startswith("stall_") and "(Not Issued)" not in k), reverse=True)[:2]
            why = ", ".join(f"{k} {v}" for v, k in top if v)
            print(f"   {i:5d} {100 * s / max(total, 1):5.2f}%  {r['Source'].strip()[:60]:60s} {why}")


if __name__ == "__main__":
    main()
