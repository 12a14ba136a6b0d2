"""``python -m traceml_nb.selfcheck``: run the GPU self-check and exit with its code."""

import sys

from .cli import main

sys.exit(main())
