"""Entry point of the frozen app: ``specview`` with the command line given, the window when there is none."""

import sys

from specview.cli import main

if __name__ == "__main__":
    sys.exit(main())
