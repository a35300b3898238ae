import sys

from spark.main import main

sys.exit(main())
