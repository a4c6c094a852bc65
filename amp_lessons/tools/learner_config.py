"""`python -m amp_lessons learner-config`: the nbgrader settings a learner needs to fetch and submit.

nbgrader's ``fetch_assignment``, ``submit`` and ``fetch_feedback`` (and JupyterLab's *Assignments* tab) need the
course id and the exchange folder. The instructor's ``nbgrader_config.py`` sits in the course folder, where
learners do not run nbgrader, so each learner (or the instructor, once for everyone) writes a small config:

- ``learner-config``: ``~/.jupyter/nbgrader_config.py``, for a learner on their own account (nbgrader names
  the submission after the account);
- ``learner-config --student NAME``: ``./nbgrader_config.py`` in the current folder, which is this learner's
  own folder on a machine where everyone shares one account. It also sets nbgrader's student id, so two
  learners on one account hand in as two students. Run nbgrader (and JupyterLab) from that folder;
- ``learner-config --sys-prefix``: ``<this Python's prefix>/etc/jupyter/nbgrader_config.py``, read by every
  account that runs this Python (the instructor runs it once on a shared server).

The course id and the exchange are the ones the course's ``nbgrader_config.py`` sets (its defaults, or
``AMP_LESSONS_COURSE_ID`` and ``AMP_LESSONS_EXCHANGE``), without running that file (it imports nbgrader and the
course's judge); ``--course-id`` and ``--exchange`` say them explicitly (``doctor --instructor`` prints the command
with them when the instructor's differ from the defaults). An existing file with other content is left alone unless
``--force`` is given.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from amp_lessons.core.files import repo_root

FILE_NAME = "nbgrader_config.py"
# what the course's nbgrader_config.py sets unless AMP_LESSONS_COURSE_ID / AMP_LESSONS_EXCHANGE say otherwise (a test
# keeps the two equal); learners never execute that file, which imports nbgrader and the course's judge
DEFAULT_COURSE_ID = "mixed-precision-validated"
DEFAULT_EXCHANGE = "/usr/local/share/nbgrader/exchange"
STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")  # nbgrader refuses '*' and '+'; '/' makes paths


@dataclass
class CourseSettings:
    course_id: str
    exchange: str
    course_root: str
    config_file: Path


def course_settings(folder: Path | None = None) -> CourseSettings:
    """What nbgrader reads from the course's ``nbgrader_config.py`` (in ``folder``, default the course folder):
    the course id, the exchange and the course directory. Raises OSError or ValueError when it cannot be read."""
    from traitlets.config.loader import PyFileConfigLoader

    folder = Path(folder or repo_root())
    config_file = folder / FILE_NAME
    if not config_file.is_file():
        raise OSError(f"{config_file} does not exist")
    config = PyFileConfigLoader(FILE_NAME, path=str(folder)).load_config()
    course = config.get("CourseDirectory", {})
    return CourseSettings(
        course_id=str(course.get("course_id", "")),
        exchange=str(config.get("Exchange", {}).get("root", "/usr/local/share/nbgrader/exchange")),
        course_root=str(course.get("root", folder)),
        config_file=config_file,
    )


def learner_defaults() -> tuple[str, str]:
    """(course id, exchange) as the course's ``nbgrader_config.py`` sets them in this environment."""
    return (
        os.environ.get("AMP_LESSONS_COURSE_ID") or DEFAULT_COURSE_ID,
        os.environ.get("AMP_LESSONS_EXCHANGE") or DEFAULT_EXCHANGE,
    )


def render(course_id: str, exchange: str, student: str | None = None) -> str:
    """The text of a learner's ``nbgrader_config.py``."""
    lines = [
        '"""nbgrader for a learner of "Mixed Precision, Validated" (written by `python -m amp_lessons '
        'learner-config`)."""',
        "",
        "c = get_config()  # noqa: F821",
        f"c.CourseDirectory.course_id = {course_id!r}",
        f"c.Exchange.root = {exchange!r}",
    ]
    if student:
        lines += [
            "# one account shared by several learners: this folder's learner hands in under this name",
            f"c.CourseDirectory.student_id = {student!r}",
        ]
    return "\n".join(lines) + "\n"


def read_learner_config(path: Path) -> dict:
    """``{"course_id": ..., "exchange": ..., "student_id": ...}`` as a config file sets them (missing: absent)."""
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    course, exchange = config.get("CourseDirectory", {}), config.get("Exchange", {})
    found = {key: course[key] for key in ("course_id", "student_id") if key in course}
    if "root" in exchange:
        found["exchange"] = exchange["root"]
    return found


def user_config_path() -> Path:
    """``~/.jupyter/nbgrader_config.py`` (``JUPYTER_CONFIG_DIR`` moves it, as it moves Jupyter's own)."""
    folder = os.environ.get("JUPYTER_CONFIG_DIR") or str(Path.home() / ".jupyter")
    return Path(folder) / FILE_NAME


def sys_prefix_config_path() -> Path:
    return Path(sys.prefix) / "etc" / "jupyter" / FILE_NAME


def target(args) -> Path:
    if args.output:
        return Path(args.output).expanduser()
    if args.sys_prefix:
        return sys_prefix_config_path()
    if args.student:
        return Path.cwd() / FILE_NAME
    return user_config_path()


def write(path: Path, text: str, force: bool) -> str | None:
    """Write ``text`` to ``path``; return why not (an existing file with other content, without --force)."""
    if path.exists() and path.read_text(encoding="utf-8", errors="replace") != text and not force:
        return f"{path} exists with other settings; add --force to replace it"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return None


def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))


def run(args) -> int:
    """Write (or print) the learner's config; 0 when done, 1 when an existing file was kept, 2 on bad input."""
    from amp_lessons.tools.exercises.course import CORE_ASSIGNMENT, FULL_ASSIGNMENT

    if args.student is not None and not STUDENT_ID.match(args.student):
        print(f"--student {args.student!r}: use letters, digits, '.', '_', '@' or '-'.", file=sys.stderr)
        return 2
    if args.student and args.sys_prefix:
        print("--student names one learner; --sys-prefix writes a file every account reads.", file=sys.stderr)
        return 2
    default_course, default_exchange = learner_defaults()
    course_id = args.course_id or default_course
    exchange = args.exchange or default_exchange
    text = render(course_id, exchange, args.student)
    if args.print:
        print(text, end="")
        return 0
    path = target(args)
    refused = write(path, text, args.force)
    if refused:
        print(refused, file=sys.stderr)
        return 1
    who = f"learner {args.student!r}" if args.student else "the account's own name"
    print(f"wrote {path}: course id {course_id}, exchange {exchange}; submissions are handed in as {who}.")
    where = f" (from {path.parent})" if args.student else ""
    print(
        f"Next{where}: nbgrader fetch_assignment {FULL_ASSIGNMENT} (a 3-hour room: {CORE_ASSIGNMENT}), "
        "or JupyterLab's Assignments tab."
    )
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--student",
        metavar="NAME",
        help="one account shared by several learners: this learner's name (writes ./nbgrader_config.py, "
        "in this learner's own folder)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--sys-prefix",
        action="store_true",
        help="write <this Python's prefix>/etc/jupyter/nbgrader_config.py, read by every account that runs it",
    )
    where.add_argument("--output", metavar="PATH", help="write this file instead")
    parser.add_argument(
        "--course-id", help=f"the course id (default: $AMP_LESSONS_COURSE_ID or {DEFAULT_COURSE_ID})"
    )
    parser.add_argument(
        "--exchange", help=f"the exchange folder (default: $AMP_LESSONS_EXCHANGE or {DEFAULT_EXCHANGE})"
    )
    parser.add_argument("--force", action="store_true", help="replace an existing file with other settings")
    parser.add_argument("--print", action="store_true", help="print the file instead of writing it")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m amp_lessons learner-config",
        description="Write the nbgrader settings a learner needs: the course id and the exchange (and, on one "
        "shared account, the learner's name).",
    )
    add_arguments(parser)
    return parser
