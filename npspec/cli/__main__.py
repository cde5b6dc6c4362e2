"""python -m npspec.cli: the `npspec` command (npspec.cli.main), for where its console script is not on PATH."""

import sys

from .main import main

sys.exit(main())
