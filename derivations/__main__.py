"""``python -m derivations`` is ``unmask derive``."""

import sys

from unmask.cli import main

sys.exit(main(["derive", *sys.argv[1:]]))
