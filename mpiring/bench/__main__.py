"""`python -m mpiring.bench`: see mpiring.bench.cli."""

import sys

from mpiring.bench.cli import main

sys.exit(main())
