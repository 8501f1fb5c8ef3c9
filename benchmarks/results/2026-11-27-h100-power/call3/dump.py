# Call 3 analysis: dump.py FILE_sass.csv OUT.txt writes one line per SASS instruction (index, executions,
# stall samples, source, top reasons); seg.py sums the samples of index ranges read off those listings
# (ours.txt / fa3.txt of this call) into cycles a step (perf-notes, twenty-second session, call 3).
import csv, io, sys, collections
path = sys.argv[1]
text = open(path).read()
rows = []; header=None
for rec in csv.reader(io.StringIO(text)):
    if not rec: continue
    if rec[0] == "Kernel Name": continue
    if rec[0] == "Address": header = rec; continue
    if header: rows.append(dict(zip(header, rec)))
def num(x):
    try: return int(x.replace(",", ""))
    except: return 0
reasons = [k for k in header if k.startswith("stall_") and "(Not Issued)" not in k]
out = open(sys.argv[2], "w")
for i, r in enumerate(rows):
    s = num(r["Warp Stall Sampling (All Samples)"]); ex = num(r["Instructions Executed"])
    top = sorted(((num(r[k]), k[6:]) for k in reasons), reverse=True)[:3]
    why = " ".join(f"{k}={v}" for v, k in top if v)
    out.write(f"{i:5d} {ex:9d} {s:6d} {r['Source'].strip()[:80]:80s} {why}\n")
# histogram of samples by exec count bucket
b = collections.Counter(); n = collections.Counter()
for r in rows:
    ex = num(r["Instructions Executed"]); s = num(r["Warp Stall Sampling (All Samples)"])
    b[ex] += s; n[ex] += 1
tot = sum(b.values())
print("total", tot)
for ex, s in sorted(b.items(), key=lambda t: -t[1])[:25]:
    print(f"exec {ex:9d}: {n[ex]:5d} instrs, samples {s:7d} {100*s/tot:5.1f}%")
