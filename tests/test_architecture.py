"""The package layout holds: imports point one way (tools -> checks -> lesson helpers -> core), no import
cycles (imports inside functions count), no module over 600 lines, no function over 80 lines, and every
lesson helper's docstring opens with its lesson number. See docs/architecture.md."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "amp_lessons"
CORE = {"amp_lessons", "amp_lessons.environment", "amp_lessons.models", "amp_lessons.data",
        "amp_lessons.quiz", "amp_lessons.record", "amp_lessons.utils", "amp_lessons.autocast_state"}
CHECK_INFRASTRUCTURE = {"amp_lessons.checks", "amp_lessons.checks.harness", "amp_lessons.checks.registry",
                        "amp_lessons.checks.mistakes"}
MAX_MODULE_LINES = 600
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
        found |= {name for name in names if name in known}
    return found


def graph() -> dict:
    mods = modules()
    return {name: imports(path, set(mods)) - {name} for name, path in mods.items()}


def layer(name: str) -> str:
    if name in CORE:
        return "core"
    if name.startswith("amp_lessons.tools") or name == "amp_lessons.__main__":
        return "tools"
    if name.startswith("amp_lessons.checks"):
        return "checks"
    return "lesson"


def lesson_number(name: str, path: Path) -> int:
    if name.startswith("amp_lessons.checks.l"):
        return int(re.match(r"l(\d\d)_", name.rsplit(".", 1)[1]).group(1))
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    match = re.match(r"Lessons? (\d\d)", docstring)
    assert match, f"{name}: a lesson helper's docstring must open with 'Lesson NN' (got {docstring[:60]!r})"
    return int(match.group(1))


def test_no_import_cycles():
    edges = graph()
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                cycle = stack[stack.index(target):] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_imports_point_down():
    order = {"core": 0, "lesson": 1, "checks": 2, "tools": 3}
    mods = modules()
    wrong = []
    for source, targets in graph().items():
        for target in targets:
            if order[layer(target)] > order[layer(source)]:
                wrong.append(f"{source} ({layer(source)}) imports {target} ({layer(target)})")
            elif layer(source) in ("lesson", "checks") and layer(target) == "lesson":
                if source in CHECK_INFRASTRUCTURE:
                    wrong.append(f"{source} is checker infrastructure but imports the lesson helper {target}")
                elif lesson_number(target, mods[target]) > lesson_number(source, mods[source]):
                    wrong.append(f"{source} imports {target}, a helper of a later lesson")
            elif layer(source) == "checks" and target.startswith("amp_lessons.checks.l"):
                wrong.append(f"{source} imports another lesson's checkers ({target})")
    assert not wrong, "\n".join(sorted(wrong))


def test_every_lesson_helper_names_its_lesson():
    for name, path in modules().items():
        if layer(name) == "lesson":
            lesson_number(name, path)


def test_module_and_function_sizes():
    too_long = []
    for name, path in modules().items():
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {len(text.splitlines())} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    assert not too_long, "\n".join(too_long)


def test_registry_matches_the_loaded_checkers():
    """The labels ``progress`` reads from source are exactly the checkers the package registers."""
    import amp_lessons.checks as checks
    from amp_lessons.checks import registry

    assert {name: check.exercise for name, check in ((n, getattr(checks, n)) for n in checks.__all__[1:])} \
        == registry.declared_checks()
    lesson_checks = {label for label, check in registry.checkers().items()
                     if check.__module__.startswith("amp_lessons.checks.l")}  # tests register demo checks too
    assert sorted(lesson_checks) == sorted(registry.declared_labels())


def test_listing_exercises_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from amp_lessons.tools import progress; progress.known_exercises(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
