"""``python -m fwbench`` is the ``fwbench`` command."""

import sys

from fwbench.cli import main

sys.exit(main())
