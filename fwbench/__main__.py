"""``python -m fwbench`` is the ``fwbench`` command."""

from __future__ import annotations

import sys

from fwbench.cli import main

sys.exit(main())
