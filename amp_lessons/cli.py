"""Command line: `python -m amp_lessons <command>`.

doctor            is this machine ready for the course? (exit 0 when it is)
build-exercises   regenerate exercises/ from solutions/ (--check: fail when exercises/ is stale)
clean PATH...     strip outputs and execution counts from notebooks (what the repository stores)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_doctor(args) -> int:
    from amp_lessons.doctor import run_doctor

    return run_doctor()


def cmd_build_exercises(args) -> int:
    from amp_lessons import builder

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
        print(f"wrote {path.relative_to(builder.repo_root())}")
    print(f"{len(written)} exercise notebook(s) updated." if written else "exercises/ was already up to date.")
    return 0


def cmd_clean(args) -> int:
    from amp_lessons import builder

    status = 0
    for name in args.paths:
        path = Path(name)
        try:
            text = builder.dumps(builder.clean_notebook(builder.read_notebook(path)))
        except builder.BuildError as exc:
            print(exc, file=sys.stderr)
            status = 2
            continue
        if path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"cleaned {path}")
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m amp_lessons", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", metavar="command")
    commands.add_parser("doctor", help="check this machine is ready for the course").set_defaults(run=cmd_doctor)
    build = commands.add_parser("build-exercises", help="generate exercises/ from solutions/")
    build.add_argument("--check", action="store_true", help="only report whether exercises/ is stale")
    build.set_defaults(run=cmd_build_exercises)
    clean = commands.add_parser("clean", help="strip outputs from notebooks")
    clean.add_argument("paths", nargs="+")
    clean.set_defaults(run=cmd_clean)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    return args.run(args)
