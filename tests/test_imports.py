"""The import graph of pipeline/, read from the source with `ast`: two rules of the structure.

    .venv/bin/python -m pytest tests/test_imports.py -q

- The task seam: outside pipeline/tasks/, a module imports `pipeline.tasks` (get_task, Task) or
  a module beside the task folders (`pipeline.tasks.base`, `pipeline.tasks.overlap`), never a task's own
  module (`pipeline.tasks.hotpotqa...`); and one task's
  folder never imports another's (what two tasks share is in tasks/base.py).
- No circle: no module reaches itself through the modules it imports.
- The directions of import that never happen (NEVER): the environment imports no backend, task or
  method; a backend no environment; training no inference backend; core/ nothing above it; the
  report no training, backend or RL; hub/ no RL; a task no stage and no episode runner.

What counts as an import: every `import` / `from ... import` statement anywhere in a file, at module
level or inside a function (a lazy import runs too, later), under `if TYPE_CHECKING:` too. An edge
goes to the module named (a relative import, `from ..tasks.fever import x`, resolved against the
importer's package); `from package import name` goes to `package.name` where that is a module of
the tree. Not counted: the package `__init__` that Python loads on the way to a submodule (a
package's face hands names on), and names loaded by `importlib` (`get_task` loads a task by name:
that is the seam itself, not an import of one task).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The modules of the tree that `path` imports (module level or in a function; relative
    imports resolved against its package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = absolute(node, module_name(path), is_package=path.name == "__init__.py")
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in known else module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & known


def absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The module a `from ... import` names, a relative one (`from ..tasks import x`, level 2)
    resolved as Python does: level 1 is the importer's own package (a package's __init__ is its
    own package), each further dot one package up."""
    if node.level == 0:
        return node.module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports(path, known) for name, path in found.items()}


def task_of_module(name: str) -> str | None:
    """The task folder a module belongs to (pipeline.tasks.fever.replay -> fever), else None. A task
    is a folder under pipeline/tasks/; the modules beside those folders (base.py, overlap.py) are
    what the tasks share, the seam the rest of the pipeline may import."""
    parts = name.split(".")
    is_task = len(parts) > 2 and parts[:2] == ["pipeline", "tasks"] and (PACKAGE / "tasks" / parts[2]).is_dir()
    return parts[2] if is_task else None


def test_a_relative_import_is_read_as_the_module_it_names():
    def named(source: str, importer: str, is_package: bool = False) -> str:
        return absolute(ast.parse(source).body[0], importer, is_package)

    assert named("from ..tasks.hotpotqa import metric", "pipeline.stages.eval") == "pipeline.tasks.hotpotqa"
    assert named("from . import metric", "pipeline.tasks.fever") == "pipeline.tasks"
    assert named("from . import metric", "pipeline.tasks.fever", is_package=True) == "pipeline.tasks.fever"
    assert named("from .questions import load", "pipeline.tasks.fever", is_package=True) == "pipeline.tasks.fever.questions"
    assert named("from pipeline.core import paths", "pipeline.stages.eval") == "pipeline.core"


def test_only_the_tasks_import_a_tasks_own_module():
    g = graph()
    assert {"pipeline.tasks.hotpotqa", "pipeline.tasks.fever"} <= set(g)  # the graph did read the tasks
    reaching = {}
    for name, targets in g.items():
        own = task_of_module(name)
        for target in targets:
            task = task_of_module(target)
            if task is not None and task != own:  # another task's module, or one from outside tasks/
                reaching.setdefault(name, []).append(target)
    assert not reaching, "\n".join(f"{m} imports {', '.join(sorted(t))}" for m, t in sorted(reaching.items()))


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (or a module importing
    itself), by Tarjan's algorithm; each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in g[v]:
                found.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_circle_and_passes_a_line():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_pipeline_reaches_itself_through_its_imports():
    found = cycles(graph())
    assert not found, "circles:\n" + "\n".join(" <-> ".join(c) for c in found)


LOWER = ("pipeline.core", "pipeline.sampling")
NEVER = {  # importer -> what it never imports
    "pipeline.wiki": ("pipeline.llm", "pipeline.tasks", "pipeline.methods", "pipeline.agent", "pipeline.stages"),
    "pipeline.llm": ("pipeline.wiki", "pipeline.tasks", "pipeline.methods", "pipeline.agent", "pipeline.stages"),
    "pipeline.train": ("pipeline.llm", "pipeline.agent", "pipeline.stages"),
    "pipeline.report": ("pipeline.train", "pipeline.llm", "pipeline.rl", "pipeline.stages"),
    "pipeline.hub": ("pipeline.rl", "pipeline.stages"),
    "pipeline.tasks": ("pipeline.stages", "pipeline.agent"),
    "pipeline.core": tuple(m for m in modules() if m != "pipeline" and not m.startswith(LOWER)),
}


def within(module: str, part: str) -> bool:
    return module == part or module.startswith(part + ".")


def test_no_import_runs_in_a_direction_the_design_forbids():
    g = graph()
    broken = [f"{m} imports {t}" for part, never in NEVER.items() for m, targets in sorted(g.items())
              if within(m, part) for t in sorted(targets) if any(within(t, n) for n in never)]
    assert not broken, "\n".join(broken)
