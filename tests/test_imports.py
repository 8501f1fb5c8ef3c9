"""The package's modules import one way (docs: DESIGN "Layers and layout"):

    _ffi <- _args <- ring <- sharding <- attention <- adapters (flax, equinox)

No import cycle among jax_dash's modules (every import statement counts, function-level lazy ones
too); no module takes another's private names except from ``_args`` and ``_ffi``; and the DAG model
(``jax_dash.schedules``) stays off the run path.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

PACKAGE = "jax_dash"
PACKAGE_DIR = pathlib.Path(__file__).resolve().parent.parent / PACKAGE
MODULES = sorted(f"{PACKAGE}.{path.stem}" for path in PACKAGE_DIR.glob("*.py")
                 if path.stem != "__init__")
# Layers of the run path, bottom first: a module imports only from layers below its own. The
# package (its __init__) re-exports attention and ring, and the adapters call through it.
LAYERS = {f"{PACKAGE}._ffi": 0, f"{PACKAGE}._args": 1, f"{PACKAGE}.ring": 2,
          f"{PACKAGE}.sharding": 3, f"{PACKAGE}.attention": 4, PACKAGE: 5,
          f"{PACKAGE}.flax": 6, f"{PACKAGE}.equinox": 6}
# The modules whose private names others may take.
SHARED_PRIVATE = {f"{PACKAGE}._args", f"{PACKAGE}._ffi"}
# Optional dependencies of some modules: their import is only tried where these are installed.
OPTIONAL = {f"{PACKAGE}.flax": "flax", f"{PACKAGE}.equinox": "equinox",
            f"{PACKAGE}._flax_embed": "flax", f"{PACKAGE}._equinox_embed": "equinox"}


def _source_path(module):
    return PACKAGE_DIR / ("__init__.py" if module == PACKAGE else f"{module.split('.')[-1]}.py")


def _is_module(name):
    parts = name.split(".")
    return name == PACKAGE or (len(parts) == 2 and parts[0] == PACKAGE
                               and _source_path(name).exists())


def _is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class _Imports(ast.NodeVisitor):
    """Every jax_dash module a module imports (anywhere in it), and every private name it takes
    from another jax_dash module: ``from m import _x`` or ``m._x`` through a name bound to m."""

    def __init__(self, module):
        self.module = module
        self.edges = {}            # imported module -> first line
        self.private_uses = []     # (line, "module._name")
        self.bound = {}            # local name -> jax_dash module it names

    def _absolute(self, node):
        if not node.level:
            return node.module or ""
        base = (self.module if self.module == PACKAGE else self.module.rsplit(".", 1)[0])
        parts = base.split(".")[:len(base.split(".")) - node.level + 1]
        return ".".join(parts + ([node.module] if node.module else []))

    def _edge(self, target, line):
        if target != self.module:
            self.edges.setdefault(target, line)

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                self._edge(alias.name, node.lineno)
                if alias.asname:
                    self.bound[alias.asname] = alias.name
                else:
                    self.bound[alias.name.split(".")[0]] = PACKAGE

    def visit_ImportFrom(self, node):
        source = self._absolute(node)
        if not _is_module(source):
            return
        for alias in node.names:
            submodule = f"{source}.{alias.name}"
            if _is_module(submodule):  # from jax_dash import ring
                self._edge(submodule, node.lineno)
                self.bound[alias.asname or alias.name] = submodule
                continue
            self._edge(source, node.lineno)
            if _is_private(alias.name) and source not in SHARED_PRIVATE:
                self.private_uses.append((node.lineno, f"{source}.{alias.name}"))

    def visit_Attribute(self, node):
        chain, value = [node.attr], node.value
        while isinstance(value, ast.Attribute):
            chain.insert(0, value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in self.bound:
            owner = self.bound[value.id]
            for attr in chain:
                if _is_module(f"{owner}.{attr}"):
                    owner = f"{owner}.{attr}"
                    continue
                if _is_private(attr) and owner not in SHARED_PRIVATE and owner != self.module:
                    self.private_uses.append((node.lineno, f"{owner}.{attr}"))
                break
        self.generic_visit(node)


def _scan(module):
    visitor = _Imports(module)
    visitor.visit(ast.parse(_source_path(module).read_text(), str(_source_path(module))))
    return visitor


def _graph():
    return {module: _scan(module).edges for module in [PACKAGE] + MODULES}


def _find_cycle(graph):
    """One cycle as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for target in graph.get(module, {}):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        stack.pop()
        state[module] = "done"
        return None

    for module in graph:
        if module not in state:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def test_the_scanner_sees_lazy_imports_and_private_names():
    """The scan of a function-level import and of an attribute through a bound module."""
    source = textwrap.dedent("""
        def f():
            from jax_dash import ring
            from jax_dash.attention import _hidden
            return ring._ACCUMULATE
    """)
    visitor = _Imports(f"{PACKAGE}.sharding")
    visitor.visit(ast.parse(source))
    assert set(visitor.edges) == {f"{PACKAGE}.ring", f"{PACKAGE}.attention"}
    assert [use for _, use in visitor.private_uses] == [f"{PACKAGE}.attention._hidden",
                                                        f"{PACKAGE}.ring._ACCUMULATE"]
    assert _find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]


def test_the_module_graph_has_no_cycle():
    graph = _graph()
    assert _find_cycle(graph) is None, " -> ".join(_find_cycle(graph))


def test_the_run_path_imports_downwards_only():
    wrong = [f"{module} imports {target} (line {line})"
             for module, edges in _graph().items() if module in LAYERS
             for target, line in edges.items()
             if target in LAYERS and LAYERS[target] >= LAYERS[module]]
    assert not wrong, wrong


def test_no_module_takes_another_modules_private_names():
    taken = [f"{module} line {line}: {use}" for module in [PACKAGE] + MODULES
             for line, use in _scan(module).private_uses]
    assert not taken, taken


def test_the_run_path_never_imports_schedules():
    schedules = f"{PACKAGE}.schedules"
    graph = _graph()
    reached, todo = set(), [m for m in LAYERS]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph.get(module, {}))
    assert schedules not in reached


def _run_fresh(code):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_every_module_imports_alone_in_a_fresh_process():
    """Each module first, in its own process: an order-dependent cycle fails here as an
    ImportError of a partially initialized module."""
    modules = [m for m in [PACKAGE] + MODULES
               if m not in OPTIONAL or importlib.util.find_spec(OPTIONAL[m]) is not None]
    processes = {m: _run_fresh(f"import {m}") for m in modules}
    failed = {}
    for module, process in processes.items():
        _, stderr = process.communicate(timeout=300)
        if process.returncode:
            failed[module] = stderr.strip().splitlines()[-1:]
    assert not failed, failed


def test_an_attention_call_does_not_import_schedules():
    code = textwrap.dedent("""
        import sys
        import jax
        import jax.numpy as jnp
        import jax_dash
        q = jnp.ones((1, 128, 2, 64), jnp.float32)
        jax_dash.attention(q, q, q, is_causal=True).block_until_ready()
        jax.grad(lambda q: jax_dash.attention(q, q, q).sum())(q).block_until_ready()
        jax.jit(lambda q: jax_dash.attention(q, q, q, schedule="auto"))(q).block_until_ready()
        print(sorted(m for m in sys.modules if m.startswith("jax_dash")))
    """)
    process = _run_fresh(code)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    loaded = ast.literal_eval(stdout.strip().splitlines()[-1])
    assert f"{PACKAGE}.attention" in loaded
    assert f"{PACKAGE}.schedules" not in loaded, loaded


@pytest.mark.parametrize("module", [f"{PACKAGE}.flax", f"{PACKAGE}.equinox"])
def test_adapters_do_not_import_schedules(module):
    if importlib.util.find_spec(OPTIONAL[module]) is None:
        pytest.skip(f"{OPTIONAL[module]} is not installed")
    process = _run_fresh(f"import sys, {module}; print('{PACKAGE}.schedules' in sys.modules)")
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert stdout.strip().splitlines()[-1] == "False"
