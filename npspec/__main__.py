"""python -m npspec: the `npspec` command (npspec.cli), for where its console script is not on PATH."""

import sys

from .cli import main

sys.exit(main())
