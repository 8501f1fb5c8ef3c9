#!/usr/bin/env python3
"""Compare the sm90 kernels of two builds by their SASS, off the GPU.

    python maintainers/scripts/sass_compare.py OLD NEW [--filter bwd_main]

OLD and NEW are binaries with the kernels (the driver `jax_dash_sm90_check` that
`maintainers/scripts/build_here.sh` leaves, or the extension's .so); their SASS comes from
sass_identity.py's `normalized_sass` (cuobjdump: $CUOBJDUMP, PATH or the CUDA toolkit's). Per kernel with wgmmas: the step loop (first to last HGMMA) in instructions, its
LDL/STL (spills), and the wgmmas waited for at once ("serialized": an HGMMA followed directly
by a WARPGROUP.DEPBAR; a count to compare between builds: a chain's last wait may be one, while
ptxas's serialization, its C7512-C7520 messages, makes it nearly every wgmma). A kernel change
should leave the last two alone: the thirty-first session's probe had the same spills and fewer
instructions at head_dim 64, but its wgmmas serialized and it ran 8-12% slower
(maintainers/perf-notes.md). Kernels whose name differs between the builds (a template argument
added) are matched after dropping the arguments that only one of them has, where that is unique.
Exit status 1 if any matched kernel has more spills or more serialized wgmmas in NEW.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sass_identity import normalized_sass  # noqa: E402  (cuobjdump's per-kernel text)

_OPCODE = re.compile(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def kernels(binary: str, name_filter: str) -> dict[str, dict[str, int]]:
    out = {}
    for name, lines in normalized_sass(Path(binary)).items():
        if name_filter not in name:
            continue
        ops = [m.group(1) for m in map(_OPCODE.match, lines) if m]
        wgmma = [i for i, op in enumerate(ops) if op.startswith("HGMMA")]
        if not wgmma:
            continue
        loop = ops[wgmma[0]:wgmma[-1] + 1]
        out[name] = {
            "loop": len(loop),
            "spills": sum(op.split(".")[0] in ("LDL", "STL") for op in loop),
            "serialized": sum(ops[i + 1].startswith("WARPGROUP.DEPBAR")
                              for i in wgmma if i + 1 < len(ops)),
            "wgmma": len(wgmma),
        }
    return out


def _short(name: str) -> str:
    """A readable key: the kernel's template name and its WsTraits/traits arguments."""
    m = re.search(r"\d([a-z_]+_kernel)I.*?Traits\w*?IN7cutlass(\w+?)ELi(\d+)((?:ELb[01])*)",
                  name)
    if not m:
        return name[:90]
    flags = "".join(m.group(4).replace("ELb", ""))
    return f"{m.group(1)} {m.group(2).lstrip('0123456789')} d{m.group(3)} {flags}"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--filter", default="", help="only kernels whose mangled name contains this")
    args = ap.parse_args(argv)
    old, new = kernels(args.old, args.filter), kernels(args.new, args.filter)
    by_short_old: dict[str, list[str]] = {}
    for n in old:
        by_short_old.setdefault(_short(n), []).append(n)
    worse = 0
    print(f"{'kernel':44s} {'loop':>11s} {'spills':>8s} {'serialized':>11s}")
    for n, s in sorted(new.items(), key=lambda kv: _short(kv[0])):
        o = old.get(n)
        if o is None:  # a name that changed: match by the shorter key when unique
            short = _short(n)
            cands = [c for k, v in by_short_old.items() if short.startswith(k) for c in v]
            o = old[cands[0]] if len(cands) == 1 else None
        if o is None:
            print(f"{_short(n):44s} {'- ' + str(s['loop']):>11s} {'- ' + str(s['spills']):>8s} "
                  f"{'- ' + str(s['serialized']):>11s}  (new)")
            continue
        flag = s["spills"] > o["spills"] or s["serialized"] > o["serialized"]
        worse += flag
        print(f"{_short(n):44s} {o['loop']:>5d} {s['loop']:>5d} {o['spills']:>3d} "
              f"{s['spills']:>4d} {o['serialized']:>4d} {s['serialized']:>6d}"
              f"{'  WORSE' if flag else ''}")
    print(f"{len(new)} kernels in NEW, {worse} with more spills or serialized wgmmas than in OLD")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
