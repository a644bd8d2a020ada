"""``python -m durabilis.cli``: the ``durabilis`` command."""

import sys

from durabilis.cli import main

sys.exit(main())
