import sys

from mpiring.cli import main

sys.exit(main())
