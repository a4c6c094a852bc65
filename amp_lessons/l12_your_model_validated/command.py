"""Lesson 12: ``python -m amp_lessons validate RECIPE.py`` — the protocol as a command and a CI gate.

Exit codes: 0 when every dtype named by ``--require`` is accepted (and the run was not interrupted), 1 when one
is rejected, was not judged, or the run was interrupted (Ctrl-C), 2 when the recipe or the arguments are
unusable. A message, never a traceback of the tool: an exception inside the recipe shows the recipe's frames.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_arguments", "main", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", metavar="RECIPE.py", help="the recipe file (docs/validate.md)")
    parser.add_argument(
        "--out", default=None, help="folder for report.json and report.html (default <recipe>-report)"
    )
    parser.add_argument(
        "--require",
        nargs="+",
        default=[],
        metavar="DTYPE",
        help="exit 1 unless these are accepted (bf16, fp16)",
    )
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=None,
        metavar="DTYPE",
        help="the autocast dtypes to try (default: all that work here)",
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when visible)")
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps per trial (default 30; 0: inference only)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="the seed set before build_model() and each run (default 0)"
    )
    parser.add_argument(
        "--max-seconds", type=float, default=None, help="stop after this long; the report says what was left"
    )
    parser.add_argument("--force", action="store_true", help="replace an earlier report in --out")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args) -> int:
    from amp_lessons.l12_your_model_validated.recipe import UsageError
    from amp_lessons.l12_your_model_validated.validate import DEFAULT_STEPS, validate

    try:
        result = validate(
            args.recipe,
            out=args.out,
            dtypes=args.dtypes,
            require=args.require,
            device=args.device,
            seed=args.seed,
            steps=DEFAULT_STEPS if args.steps is None else args.steps,
            max_seconds=args.max_seconds,
            force=args.force,
            progress=not args.no_progress,
        )
    except UsageError as error:
        print(f"amp validate: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:  # before the protocol started: nothing to report
        print("amp validate: interrupted before any run; no report written.", file=sys.stderr)
        return 1
    print(result.table())
    timing = result.data["timing"]
    share = timing.get("bookkeeping_share")
    print(
        f"\n{result.paths['html']}\n{result.paths['json']}\n"
        f"{timing['total_seconds']:.1f} s in all, {timing['run_seconds']:.1f} s in the runs"
        + ("" if share is None else f" (the tool's bookkeeping added {share:.0%})")
        + f"; exit code {result.exit_code}"
    )
    return result.exit_code


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m amp_lessons validate", description=__doc__.split("\n\n")[0]
    )
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse's own message is printed; a bad argument is exit code 2
        return 2 if stop.code else 0
    return run(args)
