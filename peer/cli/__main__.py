"""``python -m peer.cli``: the ``peer`` command (as the console script runs it)."""

from __future__ import annotations

import sys

from peer.cli import main

sys.exit(main())
