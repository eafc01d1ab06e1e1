"""``python -m dew.sweep``: see ``dew.sweep.cli``."""

import sys

from dew.sweep.cli import main

sys.exit(main())
