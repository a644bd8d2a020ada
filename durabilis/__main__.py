"""``python -m durabilis`` runs the CLI."""

import sys

from durabilis.cli import main

sys.exit(main())
