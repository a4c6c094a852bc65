"""Command line: `python -m amp_lessons <command>`.

doctor            is this machine ready for the course? (exit 0 when it is)
build-exercises   regenerate exercises/ from solutions/ (--check: fail when exercises/ is stale)
mark-solutions    give solution and check cells in solutions/ the nbgrader metadata they lack
clean PATH...     strip outputs and execution counts from notebooks (what the repository stores)
grade PATH...     run learners' exercise notebooks headless and tabulate every check (CSV + summary)
progress          what this learner has done: passed / attempted / not started, per exercise
gpu-report        on a CUDA GPU: run the suite and lessons, keep the GPU figures (docs/gpu_report.json)

Each command imports what it needs when it runs, so `doctor` still explains a machine where numpy, torch
or Jupyter is missing instead of failing to start.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_doctor(args) -> int:
    from amp_lessons.tools.doctor import run_doctor

    return run_doctor()


def cmd_build_exercises(args) -> int:
    from amp_lessons.core.files import repo_root
    from amp_lessons.tools.exercises import builder

    try:
        if args.check:
            problems = builder.stale_exercises()
            if problems:
                print("exercises/ is stale:")
                for problem in problems:
                    print(f"  {problem}")
                print("Run `python -m amp_lessons build-exercises` and commit the result.")
                return 1
            print("exercises/ is up to date with solutions/.")
            return 0
        written = builder.build()
    except builder.BuildError as exc:
        print(f"cannot build exercises: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path.relative_to(repo_root())}")
    print(
        f"{len(written)} exercise notebook(s) updated." if written else "exercises/ was already up to date."
    )
    return 0


def cmd_mark_solutions(args) -> int:
    from amp_lessons.core.files import repo_root
    from amp_lessons.tools.exercises import builder

    try:
        written = builder.mark_solutions()
    except builder.BuildError as exc:
        print(f"cannot mark solutions: {exc}", file=sys.stderr)
        return 2
    for path, cells in written:
        print(f"marked {path.relative_to(repo_root())}: cells {', '.join(map(str, cells))}")
    print(
        "Every solution and check cell already had its nbgrader metadata."
        if not written
        else "Now run `python -m amp_lessons build-exercises`."
    )
    return 0


def cmd_clean(args) -> int:
    from amp_lessons.tools.exercises import builder

    status = 0
    for name in args.paths:
        path = Path(name)
        try:
            text = builder.dumps(builder.clean_notebook(builder.read_notebook(path)))
        except builder.BuildError as exc:
            print(exc, file=sys.stderr)
            status = 2
            continue
        if path.read_text(encoding="utf-8") == text:
            continue
        if args.check:
            print(f"{path} has outputs or execution counts: run python -m amp_lessons clean {path}")
            status = max(status, 1)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"cleaned {path}")
    return status


def cmd_grade(args) -> int:
    from amp_lessons.tools.grade import grade, table

    if args.timeout <= 0 or args.jobs < 1:
        print("--timeout must be a positive number of seconds and --jobs at least 1.", file=sys.stderr)
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
        f"Grading {len(notebooks)} notebook(s), at most {args.timeout:g} s each, {args.jobs} at a time; "
        f"{csv_path} is rewritten as each one finishes...",
        flush=True,
    )

    def report(path, rows):
        exercises = [r for r in rows if r["exercise"] != grade.WHOLE_NOTEBOOK]
        statuses = ", ".join(sorted({table.safe_text(r["status"]) for r in rows}))
        passed = sum(bool(r["passed"]) for r in exercises)
        name = table.safe_text(grade.display_name(path))
        print(f"  {name}: {passed} of {len(exercises)} passed ({statuses})", flush=True)

    try:
        rows = grade.grade(
            notebooks,
            timeout=args.timeout,
            kernel_name=args.kernel,
            jobs=args.jobs,
            on_notebook=report,
            csv_path=csv_path,
            sources=args.source,
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
    print(f"\nWrote {csv_path} ({len(rows)} rows).")
    return 0


def cmd_progress(args) -> int:
    from amp_lessons.core import record
    from amp_lessons.tools import progress

    path = Path(args.file).expanduser() if args.file else record.progress_path()
    if path is None:
        print("Progress recording is switched off (AMP_LESSONS_PROGRESS_FILE=off).")
        return 0
    print(f"Progress record: {path}{'' if path.exists() else ' (nothing recorded yet)'}")
    data = record.load(path, warn=lambda message: print(f"warning: {message}"))
    print(progress.format_summary(progress.summarize(data)))
    return 0


def cmd_gpu_report(args) -> int:
    from amp_lessons.tools.gpu_report import main as gpu_report

    return gpu_report([])


def _grade_parser(commands) -> None:
    command = commands.add_parser("grade", help="run learners' exercise notebooks and tabulate the checks")
    command.add_argument("paths", nargs="+", metavar="PATH", help="notebooks, or folders to search")
    command.add_argument("--timeout", type=float, default=120.0, help="seconds per notebook (default 120)")
    command.add_argument("--csv", default="grades.csv", help="where to write the table (default grades.csv)")
    command.add_argument("--jobs", type=int, default=1, help="notebooks run at the same time (default 1)")
    command.add_argument("--kernel", default="python3", help="kernel to run them with (default python3)")
    command.add_argument(
        "--source",
        default=None,
        metavar="FOLDER",
        help="the course's source notebooks NN_topic.ipynb (default: solutions/)",
    )
    command.set_defaults(run=cmd_grade)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m amp_lessons", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", metavar="command")
    doctor = commands.add_parser("doctor", help="check this machine is ready for the course")
    doctor.set_defaults(run=cmd_doctor)
    build = commands.add_parser("build-exercises", help="generate exercises/ from solutions/")
    build.add_argument("--check", action="store_true", help="only report whether exercises/ is stale")
    build.set_defaults(run=cmd_build_exercises)
    mark = commands.add_parser("mark-solutions", help="add missing nbgrader cell metadata to solutions/")
    mark.set_defaults(run=cmd_mark_solutions)
    clean = commands.add_parser("clean", help="strip outputs from notebooks")
    clean.add_argument("paths", nargs="+")
    clean.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a notebook is not clean"
    )
    clean.set_defaults(run=cmd_clean)
    _grade_parser(commands)
    progress = commands.add_parser("progress", help="list each exercise: passed / attempted / not started")
    progress.add_argument(
        "--file", help="a progress record to read (default: this learner's, see amp_lessons.core.record)"
    )
    progress.set_defaults(run=cmd_progress)
    gpu = commands.add_parser("gpu-report", help="on a CUDA GPU: run the course and keep its GPU figures")
    gpu.set_defaults(run=cmd_gpu_report)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    return args.run(args)
