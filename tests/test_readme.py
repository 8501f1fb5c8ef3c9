"""README.md stays true: its Python examples run on a CPU as written, its install and test commands
are the ones CI runs, the files it (and docs/design.md) names exist, and its CPU numbers are the
committed measurement's.

Convention: every block fenced ```python in README.md is run, in a fresh namespace, unless its
first line contains ``# not run``. A block that leaves a ``report`` (jax_dash.check_determinism's
result) must find the step deterministic on the CPU."""

import contextlib
import io
import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _python_blocks(path):
    """(section heading, code) of every ```python block not marked ``# not run``."""
    blocks, heading = [], ""
    text = path.read_text()
    for match in re.finditer(r"^(#{1,6} [^\n]*)$|^```python\n(.*?)^```", text, flags=re.M | re.S):
        if match.group(1):
            heading = match.group(1).lstrip("#").strip()
        elif "# not run" not in match.group(2).splitlines()[0]:
            blocks.append((heading, match.group(2)))
    return blocks


BLOCKS = _python_blocks(README)


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; keep it to 200"


def test_readme_has_the_first_example_and_the_training_recipe_on_the_first_screen():
    headings = [h for h, _ in BLOCKS]
    assert headings[:2] == ["First example", "Reproducible training step"], headings
    text = README.read_text().splitlines()
    first = next(i for i, line in enumerate(text) if line.startswith("## Reproducible training"))
    assert first < 60, f"the training recipe starts at line {first + 1}"


@pytest.mark.parametrize("heading,code", BLOCKS, ids=[h for h, _ in BLOCKS])
def test_readme_python_block_runs(heading, code):
    namespace = {"__name__": "__readme__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"README.md ({heading})", "exec"), namespace)
    report = namespace.get("report")
    if report is not None:
        assert report.ok, f"check_determinism found the README's step not deterministic:\n{report}"
        assert str(report) in out.getvalue()


def test_ci_runs_the_commands_the_readme_gives():
    readme = README.read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    bash = "\n".join(re.findall(r"```bash\n(.*?)```", readme, flags=re.S))
    commands = [line.split("#")[0].strip() for line in bash.splitlines()]
    for command in ('python -m pip install -v ".[test]"', "pytest -q -n auto"):
        assert command in commands, f"README.md's first bash block lost {command!r}"
        assert re.search(rf"^{re.escape(command)}$", ci, flags=re.M), f".ci/run does not run {command!r}"
    assert "python -m jax_dash.demo" in commands


def _named_paths(path):
    """Relative link targets and backticked repository paths named in a markdown file."""
    text = path.read_text()
    names = set()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            names.add((path.parent / target).resolve())
    tops = ("benchmarks/", "maintainers/", "docs/", "jax_dash/", "cuda/", "scripts/", "tests/")
    for token in re.findall(r"`([^`\s]+)`", text):
        token = token.split("::")[0]
        if token.startswith(tops) and "<" not in token and "*" not in token:
            names.add((ROOT / token).resolve())
    return names


@pytest.mark.parametrize("doc", ["README.md", "docs/design.md", "CHANGELOG.md",
                                 "benchmarks/README.md"])
def test_named_files_exist(doc):
    missing = sorted(str(p.relative_to(ROOT)) for p in _named_paths(ROOT / doc) if not p.exists())
    if doc == "benchmarks/README.md":  # its bare `results/...` names are relative to benchmarks/
        missing = [m for m in missing if not (ROOT / "benchmarks" / m).exists()]
    assert not missing, f"{doc} names files that do not exist: {missing}"


def test_readme_cpu_numbers_are_the_committed_ones():
    runs = sorted((ROOT / "benchmarks" / "results").glob("*-cpu/bench_cpu.json"))
    assert runs, "no committed benchmarks/results/*-cpu/bench_cpu.json"
    data = json.loads(runs[-1].read_text())
    ratios = [p["ratio"] for p in data["points"]]
    readme = README.read_text()
    assert f"{min(ratios):.1f}x to {max(ratios):.1f}x" in readme
    demo = data["demo"]
    assert f"{demo['user_s'] + demo['system_s']:.0f} s of CPU time" in readme


def test_bench_cpu_runs(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_cpu
    finally:
        sys.path.pop(0)
    report = bench_cpu.main(["--shapes", "1x64x2x32", "--masks", "causal", "--iters", "1",
                             "--out", str(tmp_path)])
    (point,) = report["points"]
    assert point["ratio"] > 0 and point["xla"]["median_s"] > 0
    assert "| 1x64x2x32 | float32 | causal |" in (tmp_path / "bench_cpu.md").read_text()
