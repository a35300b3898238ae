"""The routing job's entry point for `spark-submit` (the image has it at /opt/echelon/spark/main.py).

The job itself is the package `echelon.replan` (docs/operations.md, "The routing job"); this
file is what `spark-submit` is given, because it takes a file, not a module.
"""

import sys

from echelon.replan.main import main

if __name__ == "__main__":
    sys.exit(main())
