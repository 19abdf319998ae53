"""``python -m agentrt``: the same as the ``agentrt`` command."""

import sys

from .cli import main

sys.exit(main())
