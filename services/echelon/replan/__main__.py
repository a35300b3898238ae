import sys

from echelon.replan.main import main

sys.exit(main())
