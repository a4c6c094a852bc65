"""The package layout holds (docs/architecture.md): one package per lesson named after its notebook, imports that
point one way (tools -> checks facade -> lessons -> harness -> core), a lesson importing only earlier lessons and
never another lesson's ``check.py``, no import cycle (imports inside functions count), no function over 80 lines,
and the learner's check table equal to the ``@checker`` lines. There is no module-size cap: a module is split
when it has two jobs, not when it is long."""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "amp_lessons"
LESSON = re.compile(r"^amp_lessons\.l(\d\d)_\w+")
HARNESS = {"amp_lessons.checks.harness", "amp_lessons.checks.mistakes", "amp_lessons.checks.registry"}
ROOT_MODULES = {"amp_lessons", "amp_lessons.legacy_paths"}
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set) -> set:
    """Every package module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [name for name in submodules if name in known] or [node.module]
        else:
            continue
        found |= {name for name in names if name.startswith("amp_lessons")}
    return found


def graph() -> dict:
    mods = modules()
    return {name: imports(path, set(mods)) - {name} for name, path in mods.items()}


def layer(name: str) -> str:
    if name in ROOT_MODULES or name.startswith("amp_lessons.core"):
        return "core"
    if name in HARNESS:
        return "harness"
    if LESSON.match(name):
        return "lesson"
    if name == "amp_lessons.checks":
        return "checks"
    if name.startswith("amp_lessons.tools") or name == "amp_lessons.__main__":
        return "tools"
    return "unplaced"


def lesson_of(name: str) -> int:
    return int(LESSON.match(name).group(1))


def test_every_module_has_a_place():
    assert [name for name in modules() if layer(name) == "unplaced"] == []


def test_every_import_names_a_module_that_exists():
    """No package module imports an old (flat-layout) path: those exist only for learners' old copies."""
    mods = set(modules())
    wrong = [
        f"{source} imports {target}"
        for source, targets in graph().items()
        for target in targets
        if target not in mods and target.rsplit(".", 1)[0] not in mods
    ]
    assert wrong == []


def test_no_import_cycles():
    edges = {name: {t for t in targets if t in modules()} for name, targets in graph().items()}
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                cycle = stack[stack.index(target) :] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_imports_point_one_way():
    order = {"core": 0, "harness": 1, "lesson": 2, "checks": 3, "tools": 4}
    wrong = []
    for source, targets in graph().items():
        for target in (t for t in targets if t in modules()):
            if order[layer(target)] > order[layer(source)]:
                wrong.append(f"{source} ({layer(source)}) imports {target} ({layer(target)})")
            elif layer(source) == "lesson" and layer(target) == "lesson":
                if lesson_of(target) > lesson_of(source):
                    wrong.append(f"{source} imports {target}, a module of a later lesson")
                elif target.endswith(".check") and lesson_of(target) != lesson_of(source):
                    wrong.append(f"{source} imports another lesson's checker ({target})")
    assert not wrong, "\n".join(sorted(wrong))


def test_every_lesson_package_is_named_after_its_notebook_and_maps_its_files():
    stems = {path.stem for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    packages = sorted(p for p in PACKAGE.glob("l[0-9][0-9]_*") if p.is_dir())
    assert {p.name[1:] for p in packages} == stems
    for package in packages:
        tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
        docstring = ast.get_docstring(tree) or ""
        assert docstring.startswith(f"Lesson {package.name[1:3]}"), package.name
        for item in sorted(package.iterdir()):
            if item.name not in ("__init__.py", "__pycache__"):
                shown = item.name + ("/" if item.is_dir() else "")
                assert f"``{shown}``" in docstring, f"{package.name}/__init__.py does not map {shown}"
        assert (ROOT / "tests" / package.name).is_dir(), f"tests/{package.name}/ is missing"


def test_every_lesson_exports_an_explicit_list_that_imports():
    import importlib

    for package in sorted(PACKAGE.glob("l[0-9][0-9]_*")):
        name = f"amp_lessons.{package.name}"
        tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
        declared = [
            node
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and getattr(node.targets[0] if isinstance(node, ast.Assign) else node.target, "id", "")
            == "__all__"
        ]
        assert declared, f"{name} has no __all__"
        module = importlib.import_module(name)
        for exported in module.__all__:
            assert hasattr(module, exported), f"{name}.__all__ names {exported}, which it lacks"


def test_function_sizes_and_the_largest_module():
    too_long, sizes = [], {}
    for name, path in modules().items():
        text = path.read_text(encoding="utf-8")
        sizes[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    assert not too_long, "\n".join(too_long)
    largest = max(sizes, key=sizes.get)
    print(f"largest module: {largest} ({sizes[largest]} lines)")


def test_the_check_table_matches_the_checkers():
    """``amp_lessons.checks.CHECKS`` (what learners import), the ``@checker`` lines ``progress`` reads from
    source, and the checkers the lessons register are one and the same list."""
    import amp_lessons.checks as checks
    from amp_lessons.checks import registry

    declared = registry.declared_checks()
    assert list(checks.CHECKS) == list(declared)
    for name, module in checks.CHECKS.items():
        check = getattr(checks, name)
        assert check.__module__ == module and check.exercise == declared[name]
    lesson_checks = {label for label, check in registry.load_all().items() if LESSON.match(check.__module__)}
    assert sorted(lesson_checks) == sorted(declared.values())


def test_listing_exercises_does_not_import_torch():
    code = (
        "import sys; from amp_lessons.tools import progress; progress.known_exercises(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_importing_the_checks_loads_no_lesson():
    code = "import sys, amp_lessons.checks; print(sorted(m for m in sys.modules if m.startswith('amp_lessons.l0')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
