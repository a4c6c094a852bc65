"""Load a function defined in a solution or exercise notebook, without starting a kernel.

Convention the notebooks follow: the cell that defines an exercise function is self-contained (it
imports what it uses) and only defines things; the check runs in the next cell. So executing that one
cell gives the learner-facing function exactly as the notebook has it.
"""

from pathlib import Path

from amp_lessons.tools.exercises.builder import cell_source, read_notebook

ROOT = Path(__file__).resolve().parent.parent


def defining_cell(path, name: str) -> str:
    notebook = read_notebook(ROOT / path)
    for cell in notebook["cells"]:
        source = cell_source(cell)
        if cell["cell_type"] == "code" and f"def {name}(" in source:
            return source
    raise LookupError(f"{path} has no code cell defining {name}()")


def load_function(path, name: str):
    """The function ``name`` as defined in notebook ``path`` (relative to the repository root)."""
    namespace = {"__name__": f"notebook_{Path(path).stem}"}
    exec(compile(defining_cell(path, name), f"{path}:{name}", "exec"), namespace)
    return namespace[name]


def solution(lesson_file: str, name: str):
    return load_function(f"solutions/{lesson_file}", name)


def exercise(lesson_file: str, name: str):
    return load_function(f"exercises/{lesson_file}", name)
