"""`python -m npspec.generate`: the generate command (npspec.cli.generate), at the name README gives it."""

import sys

from .cli.generate import main

if __name__ == "__main__":
    sys.exit(main())
