import sys

from amp_lessons.tools.cli import main

sys.exit(main())
