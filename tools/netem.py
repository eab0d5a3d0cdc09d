"""A real shaped link at the server, from a source checkout: `python tools/netem.py --help`.

The code is minips/run/netem.py (in the package, so `minips run --netem` works from a wheel);
this file only runs its command line: the same as `python -m minips.run.netem`.
"""

import sys

from minips.run.netem import main

if __name__ == "__main__":
    sys.exit(main())
