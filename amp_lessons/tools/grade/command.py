"""The ``python -m amp_lessons grade`` command line (the CLI hands its arguments here).

``grade PATH... [--csv grades.csv]`` grades every notebook and writes two tables: ``grades.csv`` (one row
per learner file and exercise) and ``grades_learners.csv`` (one row per learner, with totals). At the end it
prints each file's SHA-256 fingerprint and writes them to ``grades.csv.sha256``; keep the printed line.
``grade --verify grades.csv`` says whether the tables are still what grading wrote.
"""

from __future__ import annotations

import sys
from pathlib import Path


def add_arguments(command) -> None:
    command.add_argument("paths", nargs="*", metavar="PATH", help="notebooks, or folders to search")
    command.add_argument("--timeout", type=float, default=120.0, help="seconds per notebook (default 120)")
    command.add_argument("--csv", default="grades.csv", help="where to write the table (default grades.csv)")
    command.add_argument("--jobs", type=int, default=1, help="notebooks run at the same time (default 1)")
    command.add_argument(
        "--kernel", default="python3", help="(kept for old scripts; the grader's own kernel runs)"
    )
    command.add_argument(
        "--source",
        default=None,
        metavar="FOLDER",
        help="the course's source notebooks NN_topic.ipynb (default: solutions/)",
    )
    command.add_argument(
        "--verify",
        metavar="CSV",
        default=None,
        help="check that CSV (and its learners table) still match the fingerprints grading printed",
    )
    command.add_argument(
        "--sha256", default=None, help="with --verify: the fingerprint you kept (else CSV.sha256)"
    )


def verify(csv_path: Path, expected: str | None = None) -> int:
    from amp_lessons.tools.grade import table

    try:
        problems = table.verify_fingerprints(Path(csv_path), expected)
    except OSError as exc:
        print(f"Cannot verify {csv_path}: {exc}", file=sys.stderr)
        return 2
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        return 1
    print(f"{csv_path}: the fingerprints match; the tables are what grading wrote.")
    return 0


def _report(grade, table):
    def report(path, rows):
        exercises = [r for r in rows if r["exercise"] != grade.WHOLE_NOTEBOOK]
        statuses = ", ".join(sorted({table.safe_text(r["status"]) for r in rows}))
        passed = sum(bool(r["passed"]) for r in exercises)
        name = table.safe_text(grade.display_name(path))
        print(f"  {name}: {passed} of {len(exercises)} passed ({statuses})", flush=True)

    return report


def run(args) -> int:
    from amp_lessons.tools.grade import grade, sandbox, table

    if args.verify:
        return verify(Path(args.verify), args.sha256)
    if not args.paths:
        print("Name the notebooks or folders to grade (or --verify grades.csv).", file=sys.stderr)
        return 2
    if args.timeout <= 0 or args.jobs < 1:
        print("--timeout must be a positive number of seconds and --jobs at least 1.", file=sys.stderr)
        return 2
    if args.source and not any(Path(args.source).glob("[0-9][0-9]_*.ipynb")):
        print(
            f"--source {args.source}: no course notebooks NN_topic.ipynb there (it names the folder of the "
            "course's own notebooks with their check cells, solutions/ by default). Nothing was graded.",
            file=sys.stderr,
        )
        return 2
    notebooks = grade.find_notebooks(args.paths)
    if not notebooks:
        print("No notebooks found in " + ", ".join(args.paths), file=sys.stderr)
        return 2
    try:
        csv_path = table.prepare_output(Path(args.csv), grade.pending_rows(notebooks))
    except table.OutputError as exc:
        print(f"{exc}. Nothing was graded.", file=sys.stderr)
        return 2
    print(
        f"Grading {len(notebooks)} notebook(s), at most {args.timeout:g} s each, {args.jobs} at a time, each "
        f"kernel in a sandbox ({sandbox.describe(sandbox.kind())}); {csv_path} is rewritten as each one "
        "finishes...",
        flush=True,
    )
    try:
        rows = grade.grade(
            notebooks,
            timeout=args.timeout,
            jobs=args.jobs,
            on_notebook=_report(grade, table),
            csv_path=csv_path,
            sources=args.source,
            roots=args.paths,
        )
    except KeyboardInterrupt:
        print(
            f"\nInterrupted. {csv_path} keeps every notebook graded so far; the others say "
            f"'{grade.NOT_GRADED}'.",
            file=sys.stderr,
        )
        return 130
    print()
    print(grade.summary(rows))
    learners = table.learners_path(csv_path)
    print(f"\nWrote {csv_path} ({len(rows)} rows) and {learners} (one row per learner, with totals).")
    for line in table.seal(csv_path):
        print(f"SHA-256 {line}")
    print(
        f"Keep these lines: `python -m amp_lessons grade --verify {csv_path}` checks the files against them."
    )
    return 0
