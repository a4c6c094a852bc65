"""nbgrader settings for every server on the hub (learners' Assignments tab and the instructor's commands alike).

The hub sets AMP_LESSONS_EXCHANGE and AMP_LESSONS_COURSE_ID for each server; the course's own nbgrader_config.py
(in the instructor's course folder) reads the same two variables, so both agree on where the exchange is.
"""

import os

c = get_config()  # noqa: F821  (traitlets defines get_config while it reads this file)
c.CourseDirectory.course_id = os.environ.get("AMP_LESSONS_COURSE_ID", "mixed-precision-validated")
c.Exchange.root = os.environ.get("AMP_LESSONS_EXCHANGE", "/usr/local/share/nbgrader/exchange")
