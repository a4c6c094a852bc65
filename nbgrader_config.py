"""nbgrader configuration for the course "Mixed Precision, Validated" (docs/instructor_guide.md: the steps).

Run nbgrader's own commands from this folder (the course's folder); JupyterLab's formgrader finds this file
when JupyterLab is started here (``make instructor``). The nbgrader course lives in ``course/``:

    course/source/mixed_precision  -> ../../solutions  (the single source: nbgrader metadata marks the cells)
    course/release/ submitted/ autograded/ feedback/ gradebook.db    (written by nbgrader, not committed)

One assignment, ``mixed_precision``, holds every exercise notebook; each check is a locked, graded cell
worth one point. A workshop on one shared machine or JupyterHub needs the exchange folder (``Exchange.root``,
nbgrader's default, set below) to exist and be writable by everyone:
``sudo mkdir -p /usr/local/share/nbgrader/exchange && sudo chmod ugo+rwx /usr/local/share/nbgrader/exchange``.
Set ``AMP_LESSONS_COURSE_ID`` to run two courses on one exchange, ``AMP_LESSONS_EXCHANGE`` to move it.
"""

import os
import sys

c = get_config()  # noqa: F821  (traitlets defines get_config while it reads this file)
HERE = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.course_id = os.environ.get("AMP_LESSONS_COURSE_ID", "mixed-precision-validated")
c.CourseDirectory.root = os.path.join(HERE, "course")
c.Exchange.root = os.environ.get("AMP_LESSONS_EXCHANGE", "/usr/local/share/nbgrader/exchange")

# generate_assignment: the same stub the course's exercise builder writes, so exercises/ and nbgrader's
# release are the same notebooks (tests/tools/test_builder.py runs nbgrader and compares).
STUB = 'raise NotImplementedError("Exercise: replace this line with your code")'  # = amp_lessons builder.STUB
c.ClearSolutions.code_stub = {"python": STUB}
c.ClearSolutions.enforce_metadata = True
c.GenerateAssignment.create_assignment = True

# autograde: check cells come from the source, never from the learner's copy; a deleted one is put back.
c.OverwriteCells.add_missing_cells = True
c.Autograde.create_student = True
c.Execute.timeout = 120  # seconds per cell (nbgrader's own Execute; the course's judge replaces it below)

# autograde runs each submission through the course's judge (docs/grading.md), not nbgrader's Execute: the
# learner's cells run in a sandboxed kernel with a clean environment and a throw-away home, every check is
# judged outside it, and each check cell's output is written from the verdict (a pass as text, anything else
# as an error showing the learner's message), so nbgrader scores it as before.
sys.path.insert(0, HERE)
from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties,
    CheckCellMetadata,
    IgnorePattern,
    LimitOutput,
    SaveAutoGrades,
)

from amp_lessons.tools.grade.nbgrader_judge import JudgedExecute  # noqa: E402

c.Autograde.autograde_preprocessors = [
    JudgedExecute,
    IgnorePattern,
    ClearMetadataPreprocessor,
    LimitOutput,
    SaveAutoGrades,
    AssignLatePenalties,
    CheckCellMetadata,
]
c.JudgedExecute.timeout = 300  # seconds for a whole notebook (measured: 5-16 s each on a laptop CPU)

# collect: with one account per learner (JupyterHub, a lab of machines) nbgrader warns ("cheating attempt?")
# when a submission's files belong to another account than the learner it names. Read collect's log.
c.ExchangeCollect.check_owner = True
