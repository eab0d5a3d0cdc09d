"""How strong is the test suite? Plant small, plausible bugs one at a time and count the kills.

    nice -n 10 python tools/mutate.py tools/mutants.json --jobs 2 [--only ID ...] [--out FILE]
    python tools/mutate.py tools/mutants.json --check     # every mutant still matches the code

A mutant is one text edit of one file of a clean copy of this checkout (`git archive HEAD`):

    {"id": "registry-seq-window", "file": "minips/state/registry.py",
     "find": "len(self.answered) > SEQ_WINDOW", "replace": "len(self.answered) > SEQ_WINDOW + 1",
     "kind": "boundary", "recent": true, "note": "one answer too many remembered"}

`find` must occur exactly once in the file (otherwise the mutant is "invalid": the list no
longer matches the code). The mutant is "killed" when the tests that could see it fail (or
time out), "survived" when they pass. Which tests: a mutant's own "tests" list (test files
or node ids: the tests written for that code) when it has one; else those that name the
mutated module (its dotted name, its path, or `from <package> import <module>`) or, when
none does, any module of its package; `--all` runs the whole suite for every mutant. A
chosen subset can only kill fewer mutants than the whole suite: the score is a lower bound.
The score is the share of valid mutants killed, overall, for those marked "recent", and by
kind. After the mutants, the baseline: each test that killed one runs again on the clean
tree (and each selection a mutant timed out in); a kill by a test that fails without any
mutant (a slow machine's timing, a broken test) is "unconfirmed" and not counted.

The lists: tools/mutants.json (written beside the tests they target), tools/mutants_fresh.json
(written from minips/ and docs/ alone, tests/ unread; its tests chosen by module name) and
tools/mutants_replication.json (the same way, for the replicated server: minips/ops/
replication.py, replica_link.py, snapshot.py, minips/run/replicas.py; each runs the
replication tests, the fast ones first) and tools/mutants_blind.json (the integrity
modules: what a run says and keeps after signals, kills and hostile input; written from
minips/ and docs/ alone, its tests chosen by module name).

Each job has its own copy of the tree, so `--jobs 2` runs two mutants at once; a mutant's
file is restored after its run, so a copy serves every mutant of its job.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def clean_copy(into: Path) -> Path:
    """This checkout's HEAD (committed files only) unpacked into `into`."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def module_name(path: str) -> str:
    """minips/state/registry.py -> minips.state.registry"""
    return path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def tests_for(tree: Path, mutant: dict, run_all: bool) -> list[str]:
    """The test files that can see a mutant of `mutant["file"]` (see the module docstring)."""
    files = sorted(str(p.relative_to(tree)) for p in (tree / "tests").rglob("test_*.py"))
    if run_all:
        return files
    if mutant.get("tests"):
        return list(mutant["tests"])
    dotted = module_name(mutant["file"])
    package, _, stem = dotted.rpartition(".")
    naming = re.compile(
        rf"{re.escape(dotted)}\b|{re.escape(mutant['file'])}"
        rf"|from {re.escape(package)} import [^\n]*\b{re.escape(stem)}\b"
    )
    chosen = [f for f in files if naming.search((tree / f).read_text())]
    if not chosen:
        chosen = [f for f in files if re.search(rf"{re.escape(package)}\b", (tree / f).read_text())]
    return chosen


def run_tests(tree: Path, tests: list[str], timeout: float, first_failure: bool = True) -> dict:
    """Run `tests` in `tree` (in the given order, one process): pytest's exit code (None: it
    timed out), its last line and the node ids that failed."""
    # the tests in the list's order (the ones written for the code first), not slowest first;
    # not a MINIPS_ name: minips warns of those it does not read, which tests of one-line
    # errors would take for a kill
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1",
           "KEEP_TEST_ORDER": "1"}  # fmt: skip
    stop_early = ["-x"] if first_failure else []
    command = [sys.executable, "-m", "pytest", *stop_early, "-q", "-n", "0",
               "-p", "no:cacheprovider", *tests]  # fmt: skip
    # Its own process group: a timeout or an interrupt ends the tests' servers and runs too.
    output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    proc = subprocess.Popen(command, cwd=tree, env=env, start_new_session=True, **output)
    RUNNING.add(proc)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
        lines = stdout.strip().splitlines()
        # which test failed: a kill on a loaded machine can be read for a timing failure
        failed = [line.removeprefix("FAILED ").split(" - ")[0] for line in lines
                  if line.startswith("FAILED ")]  # fmt: skip
        return {"code": proc.returncode, "last_line": lines[-1] if lines else "", "failed": failed}
    except subprocess.TimeoutExpired:
        return {"code": None, "last_line": "timeout", "failed": []}
    finally:
        end_group(proc)
        RUNNING.discard(proc)


def run_mutant(tree: Path, mutant: dict, timeout: float, run_all: bool) -> dict:
    """Apply one mutant in `tree`, run its tests, restore the file; the verdict as a dict."""
    target = tree / mutant["file"]
    original = target.read_text()
    result = {"id": mutant["id"], "kind": mutant.get("kind", ""), "recent": mutant.get("recent")}
    if original.count(mutant["find"]) != 1:
        found = original.count(mutant["find"])
        return {**result, "verdict": "invalid", "why": f"'find' occurs {found} times"}
    tests = tests_for(tree, mutant, run_all)
    target.write_text(original.replace(mutant["find"], mutant["replace"]))
    start = time.monotonic()
    try:
        run = run_tests(tree, tests, timeout)
    finally:
        target.write_text(original)
    # pytest's 4 (usage: a test file that is not there) and 5 (no test collected) say
    # nothing about the mutant: the list no longer matches the tests
    verdict = {0: "survived", 4: "invalid", 5: "invalid"}.get(run["code"], "killed")
    seconds = round(time.monotonic() - start, 1)
    return {**result, "verdict": verdict, "seconds": seconds, "tests": len(tests),
            "last_line": run["last_line"], "failed": run["failed"],
            "selection": tests}  # fmt: skip


def confirm_kills(tree: Path, results: list[dict], timeout: float) -> list[str]:
    """The baseline, run after the mutants: every test that killed one is run again on the
    clean tree (and each selection a mutant timed out in, whole). A kill whose test also
    fails (or times out) without the mutant proves nothing: its row becomes "unconfirmed"
    (not counted as killed). Returns the tests that failed on the clean tree."""
    killers = sorted({test for row in results if row["verdict"] == "killed"
                      for test in row["failed"]})  # fmt: skip
    broken: set[str] = set()
    if killers:
        run = run_tests(tree, killers, timeout * 2, first_failure=False)
        broken |= set(run["failed"]) if run["code"] is not None else set(killers)
    timed_out = {tuple(row["selection"]) for row in results
                 if row["verdict"] == "killed" and not row["failed"]}  # fmt: skip
    for selection in sorted(timed_out):
        if run_tests(tree, list(selection), timeout)["code"] != 0:
            broken |= {" ".join(selection)}
    for row in results:
        if row["verdict"] != "killed":
            continue
        if (row["failed"] and set(row["failed"]) <= broken) or (
            not row["failed"] and " ".join(row["selection"]) in broken
        ):
            row["verdict"] = "unconfirmed"
    return sorted(broken)


RUNNING: set[subprocess.Popen] = set()  # the test runs under way (ended on an interrupt)


def end_group(proc: subprocess.Popen) -> None:
    """SIGKILL a test run's whole process group (whatever of it is still there)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def score(results: list[dict]) -> dict:
    """Killed / valid, overall and for the mutants marked recent."""

    def share(rows: list[dict]) -> dict:
        valid = [r for r in rows if r["verdict"] != "invalid"]
        killed = sum(r["verdict"] == "killed" for r in valid)
        return {"valid": len(valid), "killed": killed,
                "score": round(killed / len(valid), 3) if valid else None}  # fmt: skip

    kinds = sorted({r["kind"] for r in results})
    return {
        "all": share(results),
        "recent": share([r for r in results if r.get("recent")]),
        "older": share([r for r in results if not r.get("recent")]),
        "by_kind": {kind: share([r for r in results if r["kind"] == kind]) for kind in kinds},
    }


def check(mutants: list[dict]) -> int:
    """1 when an id repeats or a mutant's `find` does not occur exactly once in this checkout."""
    bad = [m["id"] for m in mutants if [n["id"] for n in mutants].count(m["id"]) > 1]
    for mutant in mutants:
        found = (ROOT / mutant["file"]).read_text().count(mutant["find"])
        if found != 1 or mutant["find"] == mutant["replace"]:
            bad.append(mutant["id"])
            print(f"invalid: {mutant['id']}: 'find' occurs {found} times in {mutant['file']}")
    recent = sum(bool(m.get("recent")) for m in mutants)
    print(f"{len(mutants)} mutants, {recent} recent, {len(set(bad))} invalid")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mutants", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="ids to run (default: all)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant")
    parser.add_argument("--all", action="store_true", help="run the whole suite per mutant")
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    parser.add_argument("--check", action="store_true", help="only check that each mutant matches")
    parser.add_argument("--no-baseline", action="store_true",
                        help="do not run the killing tests again on the clean tree")  # fmt: skip
    args = parser.parse_args(argv)
    # `kill` (SIGTERM) ends the runs under way as Ctrl-C does: no test run left behind.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    mutants = json.loads(args.mutants.read_text())
    if args.only:
        mutants = [m for m in mutants if m["id"] in set(args.only)]
    if args.check:
        return check(mutants)
    workdir = Path(tempfile.mkdtemp(prefix="minips-mutate-"))
    stopping = threading.Event()
    results: list[dict] = []  # in the order they end; kept when interrupted
    interrupted = False
    try:
        trees = [clean_copy(workdir / f"job{j}") for j in range(max(1, args.jobs))]
        queues = [mutants[j :: len(trees)] for j in range(len(trees))]

        def run_queue(j: int) -> None:
            for mutant in queues[j]:
                if stopping.is_set():
                    break
                row = run_mutant(trees[j], mutant, args.timeout, args.all)
                if stopping.is_set():
                    break  # its tests were ended by the interrupt: no verdict
                print(f"{row['verdict']:9} {row['id']:40} {row.get('seconds', '')}", flush=True)
                results.append(row)

        with ThreadPoolExecutor(len(trees)) as pool:
            futures = [pool.submit(run_queue, j) for j in range(len(trees))]
            try:
                for future in futures:
                    future.result()
            except KeyboardInterrupt:
                stopping.set()
                for proc in list(RUNNING):
                    end_group(proc)
                interrupted = True
        if not interrupted and not args.no_baseline:
            broken = confirm_kills(trees[0], results, args.timeout)
            for test in broken:
                print(f"fails without any mutant: {test}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if interrupted:  # what was decided is kept: --only the rest resumes the list
        print(f"interrupted after {len(results)} of {len(mutants)} mutants", file=sys.stderr)
    totals = score(results)
    for row in results:
        if row["verdict"] in ("survived", "invalid", "unconfirmed"):
            print(f"{row['verdict']}: {row['id']} ({row['kind']}) {row.get('why', '')}")
    print(json.dumps(totals))
    if args.out:
        args.out.write_text(json.dumps({"totals": totals, "results": results}, indent=1) + "\n")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
