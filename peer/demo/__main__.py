"""``python -m peer.demo``: the demo without the rest of the ``peer`` command."""

from __future__ import annotations

import argparse
import sys

from peer.demo.run import add_arguments, main

parser = argparse.ArgumentParser(prog="peer demo")
add_arguments(parser)
sys.exit(main(parser.parse_args()))
