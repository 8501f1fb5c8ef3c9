# Call 3 analysis (see dump.py): per-phase samples -> cycles a step; the index ranges belong to this
# call's two listings only.
import sys
def seg(path, cps, total, bounds, names):
    rows=[l.split(None,3) for l in open(path)]
    d={int(r[0]):int(r[2]) for r in rows}
    print(path)
    for (a,b),n in zip(bounds,names):
        s=sum(v for k,v in d.items() if a<=k<=b)
        print(f"  {n:34s} {s:7d} samples {cps*s/total:6.0f} cyc/step")
# ours: loop samples 195975 total incl diag
seg('ours.txt', 4260, 195975, [(1816,1853),(1854,1977),(1978,2047),(2048,2120),(2121,2616),(2617,2629),(2630,2646),(2647,2691),(2692,2704),(2705,2760),(2761,2776),(2777,2778),(2779,2800)],
    ['step start, Q/dO wait','S,dP issue + LDS','S wait + exp (non-diag)','diag path','dP wait, dS, STSM','dV issue + fence','PdS barrier','dQ issue','dK issue','dQ wait + dq_empty','dQ STS','fence + arrive','tail'])
seg('fa3.txt', 3540, 190658, [(356,364),(365,426),(427,431),(432,509),(510,754),(755,769),(770,773),(774,814),(815,817),(818,829),(830,832),(833,840),(841,843),(844,870)],
    ['step start, Q wait','S issue + LDS','dO wait','dP issue','S wait, exp, dP wait, dS, STSM','dV issue + fence','PdS barrier','dQ issue','dV wait + arrive','dK issue','dQ wait + dq_empty','dQ STS','fence + arrive','tail'])
