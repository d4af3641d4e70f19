"""``python -m proofs_check`` is ``unmask verify``."""

import sys

from unmask.cli import main

sys.exit(main(["verify", *sys.argv[1:]]))
