"""What a student reads on the worker page (minips/classroom/web/static/words.js, run with Node):
every stop says what happened and what to do, nothing technical in the headline, and the
sentences docs/classroom.md quotes are the page's own."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORDS = ROOT / "minips" / "classroom" / "web" / "static" / "words.js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node not found: JS tests need Node >= 18")

ERRORS = {  # what worker.js posts for each way a page stops
    "full": {"code": "full", "message": "server refused the request (full): all 24 ranks taken"},
    "stopping": {"code": "stopping", "message": "server refused the request (stopping): ..."},
    "nonfinite": {"code": "nonfinite", "message": "server refused the request (nonfinite): ..."},
    "not_owner": {"code": "not_owner", "message": "server refused the request (not_owner): ..."},
    "cannot follow": {"code": "cannot_follow", "message": "this page cannot follow this run: ..."},
    "gateway full": {"closeCode": 1013, "message": "the connection closed (code 1013: ...)"},
    "gateway memory": {"closeCode": 1009, "message": "the connection closed (code 1009: ...)"},
    "teacher's Ctrl-C": {"closeCode": 1001, "message": "the connection closed (code 1001)"},
    "machine gone": {"closeCode": 1006, "message": "the connection closed (code 1006)"},
    "unreachable": {"unreachable": True, "message": "cannot connect to ws://x/ws"},
    "anything else": {"message": "no reply to push after 4 attempts"},
}  # fmt: skip
STATES = [
    {"state": "starting"},
    {"state": "loading data", "rank": 3},
    {"state": "training"},
    {"state": "finishing"},
    {"state": "ended"},
    {"state": "done", "outcome": "finished", "accuracy": 0.812},
    {"state": "done", "outcome": "ended", "accuracy": 0.81},
    {"state": "done", "outcome": "stopped", "steps": 20, "accuracy": 0.5},
]


def _words() -> dict:
    script = f"""
      import {{ explain, stateMessage }} from {json.dumps(WORDS.as_uri())};
      const errors = {json.dumps(ERRORS)}, states = {json.dumps(STATES)};
      const out = {{ errors: {{}}, states: states.map((s) => stateMessage(s)) }};
      for (const [k, e] of Object.entries(errors)) out.errors[k] = explain(e, {{ accuracy: 0.5 }});
      console.log(JSON.stringify(out));
    """
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_stop_says_what_happened_and_what_to_do():
    words = _words()
    for case, said in words["errors"].items():
        assert said["what"].endswith(".") and said["todo"].endswith("."), case
        headline = said["what"] + " " + said["todo"]
        for technical in ("refused the request", "(full)", "1001", "1006", "1013", "code"):
            assert technical not in headline, (case, headline)
    assert words["errors"]["full"] == {
        "what": "This class is full: every seat is taken.",
        "todo": "Ask your teacher for another seat, then reload this page.",
    }
    assert words["errors"]["teacher's Ctrl-C"]["what"].startswith("The class has ended")
    assert "last test accuracy: 50.0%" in words["errors"]["teacher's Ctrl-C"]["what"]
    assert words["states"][5] == (
        "done: this laptop's share is trained: final accuracy 81.2%. "
        "Thank you! You can close this tab."
    )
    assert (
        words["states"][6] == "The class has ended: final accuracy 81.0%. You can close this tab."
    )


def test_the_classroom_guide_quotes_the_pages_own_words():
    words = _words()
    said = [e["what"] for e in words["errors"].values()] + [
        e["todo"] for e in words["errors"].values()
    ]
    said += words["states"]
    text = " ".join(said)
    guide = (ROOT / "docs" / "classroom.md").read_text()
    table = guide[guide.index("| the page says | when |") :].split("\n\n", 1)[0]
    quoted = [row.split(" | ")[0].lstrip("| ") for row in table.splitlines()[2:]]
    assert len(quoted) >= 6
    for cell in quoted:
        for sentence in re.split(r"(?<=\.) |/ ", cell.replace(" / is busy.", "")):
            assert sentence.strip() in text, sentence
