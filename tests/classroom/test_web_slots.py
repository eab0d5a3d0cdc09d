"""How long a run waits for its browser seats (minips.classroom.web.slots.SeatWatch), on the
server's `stats` rows as they come: seats never taken, left and taken back, finished."""

import pytest

from minips.classroom.web.slots import SeatWatch, agent_name, browser_seats


def _row(rank, alive, finished=False, agent="browser", worker=None):
    return {"rank": rank, "alive": alive, "finished": finished, "observer": False,
            "worker": worker or f"w{rank}", "info": {"agent": agent}}  # fmt: skip


def _stats(*rows):
    return {"workers": list(rows)}


def test_an_untaken_seat_is_waited_for_the_join_wait_then_announced_once():
    watch = SeatWatch(slots=2, join_wait=30.0, started=0.0)
    stats = _stats(_row(0, True), _row(1, True, agent="numpy"))  # one seat of 2 taken
    assert watch.update(stats, now=10.0) == [] and watch.pending(stats, now=10.0)
    stats = _stats(_row(0, False, finished=True))
    assert watch.update(stats, now=29.9) == [] and watch.pending(stats, now=29.9)
    assert watch.update(stats, now=30.0) == [
        "1 browser seat was not taken within 30 s: the run goes on with the workers it has"
    ]
    assert not watch.pending(stats, now=30.0) and not watch.end_run
    assert watch.update(stats, now=40.0) == []  # said once


def test_the_join_wait_counts_from_the_servers_first_stats_not_the_launch():
    """A run slow to start (a loaded machine: its server answered 25 s after the launch)
    still waits the whole join wait, and shows the waiting line before giving up."""
    watch = SeatWatch(slots=1, join_wait=20.0)
    assert watch.update(None, now=25.0) == [] and watch.pending(None, now=25.0)
    stats = {**_stats(_row(1, True, agent="numpy")), "world_size": 2}  # no page yet
    assert watch.update(stats, now=25.0) == [] and watch.pending(stats, now=25.0)
    assert watch.waiting(stats, now=26.0)["left_s"] == pytest.approx(19.0)
    assert watch.update(stats, now=44.9) == [] and watch.pending(stats, now=44.9)
    assert watch.update(stats, now=45.0) == [
        "1 browser seat was not taken within 20 s: the run goes on with the workers it has"
    ]


def test_the_teacher_may_choose_to_end_on_an_empty_seat():
    watch = SeatWatch(slots=3, join_wait=5.0, end_if_empty=True, started=0.0)
    stats = _stats(_row(0, True))
    assert watch.update(stats, now=6.0) == [
        "2 browser seats were not taken within 5 s: the run ends, as --empty-seats end asks"
    ]
    assert watch.end_run and not watch.pending(stats, now=6.0)  # even with one training


def test_a_seat_left_unfinished_is_waited_for_and_taken_back():
    watch = SeatWatch(slots=1, join_wait=10.0, started=0.0)
    watch.update(_stats(_row(0, True)), now=1.0)
    gone = _stats(_row(0, False))  # a reload: the gateway gave the seat back
    assert watch.update(gone, now=2.0) == [] and watch.pending(gone, now=2.0)
    back = _stats(_row(0, False), _row(0, True, worker="w0-again"))  # two rows, one live
    assert browser_seats(back) == {0: "training"}
    assert watch.update(back, now=3.0) == [] and watch.pending(back, now=3.0)
    gone_again = _stats(_row(0, False), _row(0, False, worker="w0-again"))
    assert watch.update(gone_again, now=20.0) == [] and watch.pending(gone_again, now=20.0)
    assert watch.update(gone_again, now=30.0) == [
        "the browser on rank 0 left and did not come back within 10 s: "
        "the run goes on with the workers it has"
    ]
    assert not watch.pending(gone_again, now=30.0)


def test_finished_seats_and_other_workers_are_not_waited_for():
    watch = SeatWatch(slots=2, join_wait=10.0, started=0.0)
    done = _stats(_row(0, False, finished=True), _row(1, False, finished=True),
                  _row(2, True, agent="numpy"), {**_row(3, True), "observer": True})  # fmt: skip
    assert browser_seats(done) == {0: "finished", 1: "finished"}
    assert watch.update(done, now=1.0) == [] and not watch.pending(done, now=1.0)
    assert not SeatWatch(slots=0, join_wait=10.0).pending(None)
    assert SeatWatch(slots=1, join_wait=10.0, started=0.0).pending(None, now=1.0)


def test_a_ranks_live_row_wins_whatever_the_order_of_its_rows():
    replaced = _stats(_row(0, True, worker="w0-again"), _row(0, False))  # the live row first
    assert browser_seats(replaced) == {0: "training"}
    done = _stats(_row(1, False, finished=True), _row(1, False, worker="w1-again"))
    assert browser_seats(done) == {1: "finished"}  # finished beats left, in either order
    assert browser_seats(_stats(*reversed(done["workers"]))) == {1: "finished"}
    again = _stats(_row(2, False, finished=True), _row(2, True, worker="w2-again"))
    assert browser_seats(again) == {2: "training"}  # a live replacement beats finished
    assert browser_seats(_stats(*reversed(again["workers"]))) == {2: "training"}
    watch = SeatWatch(slots=1, join_wait=10.0, started=0.0)
    assert watch.update(again, now=50.0) == [] and watch.pending(again, now=50.0)


def test_a_seat_given_up_then_taken_back_and_left_again_is_announced_again():
    watch = SeatWatch(slots=1, join_wait=10.0, started=0.0)
    gone = _stats(_row(0, False))
    watch.update(gone, now=1.0)
    notice = (
        "the browser on rank 0 left and did not come back within 10 s: "
        "the run goes on with the workers it has"
    )
    assert watch.update(gone, now=11.0) == [notice]
    back = _stats(_row(0, False), _row(0, True, worker="w0-again"))
    assert watch.update(back, now=12.0) == [] and watch.pending(back, now=12.0)
    gone_again = _stats(_row(0, False), _row(0, False, worker="w0-again"))
    assert watch.update(gone_again, now=13.0) == [] and watch.pending(gone_again, now=13.0)
    assert watch.update(gone_again, now=22.9) == [] and watch.pending(gone_again, now=22.9)
    assert watch.update(gone_again, now=23.0) == [notice]  # the second leave, told too
    assert not watch.pending(gone_again, now=23.0)
    assert watch.update(gone_again, now=40.0) == []  # once per leave


WIN = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko)"
MAC = "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) AppleWebKit/605.1.15 (KHTML, like Gecko)"


@pytest.mark.parametrize(
    "ua, name",
    [
        (f"{WIN} Chrome/124.0.0.0 Safari/537.36 Edg/124.0.2478.51", "Edge 124"),
        (f"{WIN} Chrome/124.0.0.0 Safari/537.36 OPR/109.0.0.0", "Opera 109"),
        ("Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0", "Firefox 125"),
        (f"{WIN} Chrome/124.0.0.0 Safari/537.36", "Chrome 124"),
        ("Mozilla/5.0 (X11; Linux x86_64) HeadlessChrome/120.0.6099.224 Safari/537.36",
         "Chrome 120"),
        (f"{MAC} Version/17.4.1 Safari/605.1.15", "Safari 17"),
        ("curl/8.5.0", "browser"),
    ],
)  # fmt: skip
def test_a_browser_is_named_by_its_user_agent_most_specific_first(ua, name):
    assert agent_name({"agent": "browser", "ua": ua}) == name
    assert agent_name({"agent": "numpy", "ua": ua}) == "numpy"
