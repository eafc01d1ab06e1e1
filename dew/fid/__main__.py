"""``python -m dew.fid``: see ``dew.fid.cli``."""

import sys

from dew.fid.cli import main

sys.exit(main())
