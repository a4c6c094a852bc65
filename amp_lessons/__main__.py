import sys

from amp_lessons.cli import main

sys.exit(main())
