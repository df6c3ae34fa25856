"""``python -m tests.benchmarks``: see :mod:`tests.benchmarks.runner`."""

import sys

from tests.benchmarks.runner import main

sys.exit(main())
