#!/usr/bin/env python3
"""Per-kernel SASS and ptxas identity of the sm90 CUDA objects, for refactors that must not change
the generated code (issue 32's "house" steps).

  sass_identity.py build SRC BUILD [-DOPTION=VALUE ...]
                                        configure SRC with the CMake target's flags plus -Xptxas -v
                                        (Release, -DJAX_DASH_WERROR=ON) into BUILD and build the
                                        kernels' library (jax_dash_sm90) and the driver
                                        (jax_dash_sm90_check), incrementally; ptxas's lines go to
                                        BUILD/build.log and per object to BUILD/ptxas/
  sass_identity.py dump BUILD OUT.json  every entry function of BUILD's objects: normalized SASS
                                        (its hash, instruction count; the text in OUT.json.sass/)
                                        and its ptxas lines (stack, spills, registers, barriers,
                                        smem, cmem; C7xxx advisories)
  sass_identity.py compare BASE.json NEW.json
                                        exit 0 when every kernel of BASE has one in NEW with the
                                        same SASS and ptxas lines and NEW has no other kernel

Normalization: cuobjdump's address comments (/*0a30*/) and encodings (/* 0x... */) are dropped and
whitespace is trimmed; nothing else (branch targets are offsets inside the function, so moving a
kernel to another object or renaming it leaves its text alone). Kernels are paired by mangled name
first; those whose name changed (a refactor that changes template arguments renames the
__global__) are then paired by content, and the pairs are printed so that a reader can check each
old name against its new one. (Kernels in an anonymous namespace carry a hash of their source
file's path in their mangled names: a tree built at another path, or a kernel moved to another
file, pairs them by content too.)

cuobjdump: $CUOBJDUMP, else the one on PATH, else the CUDA toolkit's (nvcc 13.0 here ships none:
`pip install nvidia-cuda-cuobjdump` brings one). Used by maintainers/perf-notes.md's "house"
entries.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TARGETS = ["jax_dash_sm90", "jax_dash_sm90_check"]


def cuobjdump() -> str:
    for candidate in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"),
                      "/usr/local/cuda/bin/cuobjdump"):
        if candidate and Path(candidate).exists():
            return candidate
    sys.exit("cuobjdump not found: set CUOBJDUMP or `pip install nvidia-cuda-cuobjdump`")


def build(src: Path, out: Path, cmake_args: list[str]) -> None:
    python = os.environ.get("PYTHON", sys.executable)
    nvcc = os.environ.get("NVCC", shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), "-G", "Ninja",
                    "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={python}",
                    "-DJAX_DASH_CUDA=ON", "-DJAX_DASH_WERROR=ON",
                    f"-DCMAKE_CUDA_COMPILER={nvcc}", "-DCMAKE_CUDA_FLAGS=-Xptxas -v",
                    *cmake_args],
                   check=True, stdout=subprocess.DEVNULL)
    log = subprocess.run(["ninja", "-C", str(out)] + TARGETS, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    with open(out / "build.log", "a") as f:
        f.write(log.stdout)
    if log.returncode != 0:
        sys.exit(log.stdout[-5000:])
    split_ptxas_log(out)


def split_ptxas_log(build_dir: Path) -> None:
    """BUILD/ptxas/OBJECT.log: the ptxas lines of each object's latest compile (ninja prints each
    command's output as one block after its "[i/n] Building CUDA object" line, so parallel
    compiles do not interleave), so that an incremental build keeps the others' lines."""
    ptxas_dir = build_dir / "ptxas"
    ptxas_dir.mkdir(exist_ok=True)
    blocks: dict[str, list[str]] = {}
    current = None
    for line in (build_dir / "build.log").read_text().splitlines():
        m = re.match(r"\[\d+/\d+\] (.*)", line)
        if m:
            o = re.match(r"Building CUDA object (\S+)", m.group(1))
            current = o.group(1) if o else None
            if current:
                blocks[current] = []
        elif current:
            blocks[current].append(line)
    for obj, lines in blocks.items():
        (ptxas_dir / (obj.replace("/", "@") + ".log")).write_text("\n".join(lines) + "\n")


def normalized_sass(obj: Path) -> dict[str, list[str]]:
    text = subprocess.run([cuobjdump(), "-sass", str(obj)], capture_output=True, text=True,
                          check=True).stdout
    funcs: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = m.group(1)
            if current in funcs:
                sys.exit(f"{current} appears in two objects")
            funcs[current] = []
            continue
        if current is None:
            continue
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)
        line = re.sub(r"/\* 0x[0-9a-f]+ \*/", "", line).strip()
        if line:
            funcs[current].append(line)
    return funcs


def ptxas_lines(build_dir: Path) -> dict[str, list[str]]:
    if not (build_dir / "ptxas").is_dir():
        split_ptxas_log(build_dir)
    lines = []
    for log in sorted((build_dir / "ptxas").glob("*.log")):
        if (build_dir / log.stem.replace("@", "/")).exists():  # objects of this build only
            lines += log.read_text().splitlines()
    props: dict[str, list[str]] = collections.defaultdict(list)
    compiled = set()
    name = None
    for line in lines:
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            name = m.group(1)
            if name in compiled:
                sys.exit(f"{name} compiled twice (two objects instantiate it)")
            compiled.add(name)
            continue
        w = re.search(r"\((C7\d+)\).*function '(\S+)'", line)
        if w:
            props[w.group(2)].append(w.group(1))
            continue
        if name and ("bytes stack frame" in line or "Used " in line):
            props[name].append(line.replace("ptxas info    :", "").strip())
    return {k: sorted(v) for k, v in props.items()}


def dump(build_dir: Path, out: Path) -> None:
    funcs: dict[str, list[str]] = {}
    for target in TARGETS:
        for obj in sorted((build_dir / "CMakeFiles" / f"{target}.dir").rglob("*.o")):
            for name, body in normalized_sass(obj).items():
                if name in funcs:
                    sys.exit(f"{name} appears in two objects")
                funcs[name] = body
    props = ptxas_lines(build_dir)
    names = sorted(funcs)
    demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                               text=True, check=True).stdout.splitlines()
    sass_dir = Path(str(out) + ".sass")
    sass_dir.mkdir(parents=True, exist_ok=True)
    result = {}
    for name, dem in zip(names, demangled):
        body = "\n".join(funcs[name]) + "\n"
        digest = hashlib.sha256(body.encode()).hexdigest()[:16]
        (sass_dir / f"{digest}.sass").write_text(body)
        result[name] = dict(demangled=dem, sass=digest, instructions=len(funcs[name]),
                            ptxas=props.get(name, []))
    out.write_text(json.dumps(result, indent=1, sort_keys=True))
    missing = [n for n in names if not props.get(n)]
    print(f"{len(result)} kernels in {build_dir}; without ptxas lines: {len(missing)}")
    for n in missing:
        print("  no ptxas lines:", n)


def compare(base_file: Path, new_file: Path) -> int:
    base = json.loads(base_file.read_text())
    new = json.loads(new_file.read_text())
    key = lambda v: (v["sass"], tuple(v["ptxas"]))  # noqa: E731
    same_name, differ = [], []
    for name in sorted(set(base) & set(new)):
        (same_name if key(base[name]) == key(new[name]) else differ).append(name)
    left_base = {n: base[n] for n in base if n not in new}
    left_new = {n: new[n] for n in new if n not in base}
    pool = collections.defaultdict(list)
    for n, v in sorted(left_new.items()):
        pool[key(v)].append(n)
    # Among kernels of the same content (bf16 and fp16 may compile alike), the new name sharing the
    # most words with the old one (dtype, head_dim, flags), so that the printed pairs read right.
    words = lambda d: set(re.findall(r"\w+", d))  # noqa: E731
    renamed, unmatched = [], []
    for n, v in sorted(left_base.items()):
        candidates = pool.get(key(v))
        if candidates:
            best = max(candidates, key=lambda c: len(words(v["demangled"]) &
                                                     words(new[c]["demangled"])))
            candidates.remove(best)
            renamed.append((n, best))
        else:
            unmatched.append(n)
    extra = [n for names in pool.values() for n in names]
    print(f"base {len(base)} kernels, new {len(new)}: {len(same_name)} identical under the same "
          f"name, {len(renamed)} identical under a new name, {len(differ)} differ, "
          f"{len(unmatched)} base kernels without a match, {len(extra)} new kernels without one")
    for old, nw in renamed:
        print(f"  renamed: {base[old]['demangled'][:200]}\n       -> {new[nw]['demangled'][:200]}")
    for n in differ:
        print(f"  DIFFERS: {base[n]['demangled'][:200]}\n    base {base[n]['instructions']} "
              f"instructions {base[n]['ptxas']}\n    new  {new[n]['instructions']} instructions "
              f"{new[n]['ptxas']}")
    for n in unmatched:
        print(f"  NO MATCH (base): {base[n]['demangled'][:200]} {base[n]['instructions']} "
              f"instructions {base[n]['ptxas']}")
    for n in extra:
        print(f"  NO MATCH (new):  {new[n]['demangled'][:200]} {new[n]['instructions']} "
              f"instructions {new[n]['ptxas']}")
    ok = not differ and not unmatched and not extra
    print("IDENTICAL" if ok else "NOT IDENTICAL")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("src", type=Path)
    b.add_argument("build_dir", type=Path)
    d = sub.add_parser("dump")
    d.add_argument("build_dir", type=Path)
    d.add_argument("out", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("base", type=Path)
    c.add_argument("new", type=Path)
    # build passes the -D options it does not know on to CMake (-DJAX_DASH_SM90_UNITS=kernels).
    args, cmake_args = parser.parse_known_args()
    if cmake_args and args.cmd != "build":
        parser.error(f"unrecognized arguments: {cmake_args}")
    if args.cmd == "build":
        build(args.src.resolve(), args.build_dir.resolve(), cmake_args)
    elif args.cmd == "dump":
        dump(args.build_dir.resolve(), args.out)
    else:
        return compare(args.base, args.new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
