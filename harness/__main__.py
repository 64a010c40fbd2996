"""`python -m harness` is the `xfalign` command."""

import sys

from harness.cli import main

sys.exit(main())
