"""``python -m infra.cli``: the same as the `rollstream` script."""

import sys

from infra.cli import main

sys.exit(main())
