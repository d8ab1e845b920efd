"""The house's floors hold: no module imports from a higher floor, no import circle runs
through src/shoestring, except the known ones listed here (which may only shrink), and no
circle runs between its units either (a package or top-level module: eval → plan → eval
through different modules is a circle of the house even when no module is in one).

The floors are declared once, in docs/architecture.md's ``floors`` block; this test reads
them there. Imports are found with ``ast`` in the source, top-level and function-level alike;
those under ``if TYPE_CHECKING:`` count for circles (a type named both ways ties two modules
as much as a call does: issue 63 found the loop and its summary tied so) but not for floors.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "shoestring"

# (importer, imported) module pairs that go up a floor; each is scheduled work of issue 36.
KNOWN_UPWARD: set[tuple[str, str]] = set()
# Import circles (sets of modules), each scheduled work of issue 36.
KNOWN_CYCLES: set[frozenset[str]] = set()


def floors() -> dict[str, int]:
    """unit (first name under shoestring) → floor, from docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"```floors\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```floors block"
    out = {}
    for line in block.group(1).strip().splitlines():
        number, units = line.split(":", 1)
        for unit in units.split():
            assert unit not in out, f"{unit} is on two floors"
            out[unit] = int(number)
    return out


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def import_graph(typing: bool = False) -> dict[str, set[str]]:
    """module → the shoestring modules it imports (``from pkg import mod`` counts as mod);
    with ``typing``, those imported under ``if TYPE_CHECKING:`` too."""
    paths = {_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in typing_only and not typing:
                continue
            if isinstance(node, ast.Import):
                graph[module] |= {a.name for a in node.names if a.name in paths}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    if f"{target}.{alias.name}" in paths:
                        graph[module].add(f"{target}.{alias.name}")
                    elif target in paths:
                        graph[module].add(target)
    graph.update({m: graph[m] - {m} for m in list(graph)})
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_unit_is_on_a_floor() -> None:
    declared = floors()
    units = {_unit(_name(p)) for p in SRC.rglob("*.py")}
    assert not units - set(declared), f"not on any floor: {sorted(units - set(declared))}"
    assert not set(declared) - units, f"floors name missing units: {set(declared) - units}"


def test_the_engine_sits_below_every_stage() -> None:
    """DESIGN.md: the engine (and the model folders it loads) below train and the stages, so
    serving a model never imports a stage."""
    floor = floors()
    below = [floor[u] for u in ("inference", "export", "classifier", "artifacts")]
    assert max(below) < min(floor[u] for u in ("train", "eval", "prep", "retrieval", "serve"))


def test_no_module_imports_from_a_higher_floor() -> None:
    floor, graph = floors(), import_graph()
    upward = {(a, b) for a, targets in graph.items() for b in targets
              if floor[_unit(b)] > floor[_unit(a)]}
    assert not upward - KNOWN_UPWARD, "imports from a higher floor:\n" + "\n".join(
        f"  {a} (floor {floor[_unit(a)]}) -> {b} (floor {floor[_unit(b)]})"
        for a, b in sorted(upward - KNOWN_UPWARD))
    assert not KNOWN_UPWARD - upward, f"fixed, remove from KNOWN_UPWARD: {KNOWN_UPWARD - upward}"


def test_no_import_circles() -> None:
    found = cycles(import_graph(typing=True))
    assert not found - KNOWN_CYCLES, "import circles:\n" + "\n".join(
        "  " + " -> ".join(sorted(c)) for c in found - KNOWN_CYCLES)
    assert not KNOWN_CYCLES - found, f"fixed, remove from KNOWN_CYCLES: {KNOWN_CYCLES - found}"


def unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """unit → the other units its modules import: the module graph seen from a floor up."""
    units: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        units[_unit(a)] |= {_unit(b) for b in targets} - {_unit(a)}
    return units


def test_no_circles_between_packages() -> None:
    """Units on one floor may import each other, but never both ways round, however far apart
    the modules: a package that reaches back into its importer is not below it."""
    graph = import_graph(typing=True)
    found = cycles(unit_graph(graph))
    edges = "\n".join(f"  {a} -> {b}" for a, targets in sorted(graph.items())
                      for b in sorted(targets)
                      if any({_unit(a), _unit(b)} <= c and _unit(a) != _unit(b) for c in found))
    assert not found, "circles between units:\n" + "\n".join(
        "  " + " -> ".join(sorted(c)) for c in found) + "\nthrough:\n" + edges


def test_the_checker_sees_function_level_imports_and_cycles() -> None:
    """The graph builder itself: a function-level import is an edge, a TYPE_CHECKING one only
    for circles, and a two-module circle is found."""
    graph = import_graph()
    assert "shoestring.config" not in graph["shoestring.data.sources"]  # TYPE_CHECKING only
    assert "shoestring.config" in import_graph(typing=True)["shoestring.data.sources"]
    assert "shoestring.inference.engine" in graph["shoestring.retrieval.dense"]  # in a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
    assert "shoestring.inference.engine" not in graph["shoestring.families.spec"]
    modules = {"shoestring.p.a": {"shoestring.q.a"}, "shoestring.q.b": {"shoestring.p.b"}}
    assert cycles(unit_graph(modules)) == {frozenset("pq")}  # no module circle, a package one
    assert not cycles(modules)


# What cli.py may import (issue 63): the standard library and typer (click under it); from
# shoestring, floor 0, `config` (where option text becomes objects, once) and `flags` (the
# options' declarations), and the command bodies it dispatches to: a module named `cli_*` in
# the package its command belongs to, a top-level stage module whose function is the whole
# command, or (a body of a few lines) one function in the module it calls, named here.
CLI_THIRD_PARTY = {"typer", "click"}
CLI_BORDER = {"shoestring.config", "shoestring.flags"}
CLI_STAGES = {"shoestring.cram", "shoestring.report"}
CLI_BODIES = {"shoestring.privacy.audit", "shoestring.serve.server", "shoestring.model.presets"}


def test_the_cli_imports_only_dispatch_targets() -> None:
    import sys

    floor = floors()
    ours = import_graph()["shoestring.cli"]
    allowed = CLI_BORDER | CLI_STAGES | CLI_BODIES
    wrong = sorted(m for m in ours if floor[_unit(m)] != 0 and m not in allowed
                   and not m.rpartition(".")[2].startswith("cli_"))
    assert not wrong, f"cli.py imports more than the border and its command bodies: {wrong}"
    tree = ast.parse((SRC / "cli.py").read_text(encoding="utf-8"))
    tops = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
            for a in n.names}
    tops |= {n.module.split(".")[0] for n in ast.walk(tree)
             if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    other = tops - set(sys.stdlib_module_names) - CLI_THIRD_PARTY - {"shoestring", "__future__"}
    assert not other, f"cli.py imports libraries the command bodies should: {sorted(other)}"


def test_the_cli_is_thin() -> None:
    """cli.py stays at most 400 lines, and no function in it (a command from its ``def`` to its
    last line, the options in its signature included) runs over 40."""
    text = (SRC / "cli.py").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400, f"cli.py is {len(text.splitlines())} lines (400 at most)"
    long = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno + 1 > 40}
    assert not long, f"functions of cli.py over 40 lines: {long}"


def test_no_module_imports_a_private_name_of_another() -> None:
    """A name with a leading underscore is its module's own: whatever another module needs is
    public (issue 63: the timing probe imported the loop's ``_build`` and ``_Run``). Imports
    under TYPE_CHECKING count too: a type is a dependency all the same."""
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(
                    "shoestring")):
                found += [f"{path.relative_to(SRC)}:{node.lineno} {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, "private names imported from another module:\n  " + "\n  ".join(found)


def test_each_module_name_says_one_thing() -> None:
    """No two modules share a file name (issue 63: ``stages.py`` was prep's stages and the
    engine's timing laps, ``metrics.py`` three different things): a name in a traceback, an
    import or a doc points at one place. Packages' ``__init__`` and ``__main__`` aside."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in SRC.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            by_name[path.name].append(str(path.relative_to(SRC)))
    twice = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not twice, f"module names used twice: {twice}"
