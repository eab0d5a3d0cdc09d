"""minips: a small parameter server for distributed deep learning, written to be read."""

import logging

__version__ = "0.1.0"

# A library logs, an application decides what to show: commands configure handlers.
logging.getLogger("minips").addHandler(logging.NullHandler())
