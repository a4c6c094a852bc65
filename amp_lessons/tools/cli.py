"""Command line: `python -m amp_lessons <command>`.

doctor            is this machine ready for the course? (exit 0 when it is; --instructor: ready to grade?)
learner-config    write a learner's nbgrader settings (course id, exchange; --student NAME on a shared account)
build-exercises   regenerate exercises/ from solutions/ (--check: fail when exercises/ is stale)
mark-solutions    give solution and check cells in solutions/ the nbgrader metadata they lack
clean PATH...     strip outputs and execution counts from notebooks (what the repository stores)
grade PATH...     run learners' exercise notebooks headless and tabulate every check (CSV + summary)
progress          what this learner has done: passed / attempted / not started, per exercise
gpu-report        on a CUDA GPU: run the suite and lessons, keep the GPU figures (docs/gpu_report.json)
validate RECIPE   the course's validation protocol on your model: report.html + report.json, a CI gate (lesson 12)

Each command imports what it needs when it runs, so `doctor` still explains a machine where numpy, torch
or Jupyter is missing instead of failing to start.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_doctor(args) -> int:
    from amp_lessons.tools.doctor import run_doctor, run_instructor_doctor

    return run_instructor_doctor() if args.instructor else run_doctor()


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
    from amp_lessons.tools.grade.command import run

    return run(args)


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


def cmd_validate(arguments) -> int:
    from amp_lessons.l12_your_model_validated.command import main as validate

    return validate(arguments)


def _validate_parser(commands) -> None:
    # listed in --help only: main() hands `validate ...` to lesson 12's own parser, which reads its arguments
    commands.add_parser("validate", help="validate AMP on your model from a recipe (docs/validate.md)")


def _grade_parser(commands) -> None:
    from amp_lessons.tools.grade.command import add_arguments  # standard library only at import

    command = commands.add_parser("grade", help="run learners' exercise notebooks and tabulate the checks")
    add_arguments(command)
    command.set_defaults(run=cmd_grade)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m amp_lessons", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", metavar="command")
    doctor = commands.add_parser("doctor", help="check this machine is ready for the course")
    doctor.add_argument(
        "--instructor", action="store_true", help="check nbgrader, the exchange and the course's assignments"
    )
    doctor.set_defaults(run=cmd_doctor)
    from amp_lessons.tools import learner_config  # standard library only: the doctor still starts anywhere

    learner = commands.add_parser("learner-config", help="write a learner's nbgrader settings")
    learner_config.add_arguments(learner)
    learner.set_defaults(run=learner_config.run)
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
    _validate_parser(commands)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # lesson 12 parses its own arguments (and --help); nothing of it loads for the other commands
    if argv[:1] == ["validate"]:
        return cmd_validate(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    return args.run(args)
