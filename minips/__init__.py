"""minips: a small parameter server for distributed deep learning, written to be read."""

__version__ = "0.1.0"
