"""Keep the cores busy while a command runs: N spinning processes, stopped when it ends.

    python tools/busy.py [-n 6] [--seconds 900] -- python -m pytest -q -n 0 tests/test_x.py

Tests must give the same verdict on a loaded machine (a shared CI host, a lab PC): this runs
them beside N busy loops (6 on a 2-core machine: load ~8) and exits with the command's code.
The loops are this process's children, each killed by its own id when the command ends, and
each stops itself after --seconds in case this process is killed first.
Without a command it spins for --seconds (or until Ctrl-C).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--loops", type=int, default=6, help="busy loops (default 6)")
    parser.add_argument("--seconds", type=float, default=900.0, help="each loop's own limit")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    code = SPIN.format(seconds=args.seconds)
    loops = [
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
        for _ in range(args.loops)
    ]
    start = time.monotonic()
    try:
        if not command:
            loops[0].wait()
            return 0
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
        elapsed = time.monotonic() - start
        print(f"busy.py: {args.loops} loops for {elapsed:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
