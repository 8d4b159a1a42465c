"""`python -m mpiring.cluster`: see mpiring.cluster.cli."""

import sys

from mpiring.cluster.cli import main

sys.exit(main())
