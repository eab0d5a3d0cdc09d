"""`python -m minips ...` is the `minips` command (the launcher starts its processes so)."""

from minips.cli import main

main()
