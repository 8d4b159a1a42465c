"""python -m mpiring.cost_model: calibrate, predict, project, switch-points."""

import sys

from mpiring.cost_model.command_line import main

sys.exit(main())
