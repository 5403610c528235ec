import sys

from rollpacker.sim.cli import main

sys.exit(main())
