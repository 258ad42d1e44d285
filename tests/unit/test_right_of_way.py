"""The loss path's right of way: bulk work waits at its step boundaries while the urgent lane holds it, never
longer than the bound, and not at all when it is off or free."""

from __future__ import annotations

import threading
import time

from streaming.right_of_way import RightOfWay


def _hold_in_thread(way: RightOfWay, seconds: float) -> threading.Thread:
    holding = threading.Event()

    def hold() -> None:
        with way.held():
            holding.set()
            time.sleep(seconds)

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait(5)
    return thread


def test_bulk_work_waits_until_the_urgent_lane_lets_go() -> None:
    way = RightOfWay(max_wait_s=10.0)
    thread = _hold_in_thread(way, 0.3)
    waited = way.give_way()
    assert way.holders == 0 and 0.2 <= waited < 5.0 and way.waited_s == waited
    thread.join()


def test_the_wait_is_bounded_when_the_urgent_lane_stalls() -> None:
    way = RightOfWay(max_wait_s=0.2)
    thread = _hold_in_thread(way, 2.0)
    waited = way.give_way()
    assert way.holders == 1 and 0.15 <= waited < 1.5
    thread.join()


def test_no_wait_when_off_or_free() -> None:
    off = RightOfWay(max_wait_s=10.0, enabled=False)
    thread = _hold_in_thread(off, 0.5)
    assert off.give_way() == 0.0
    thread.join()
    assert RightOfWay().give_way() == 0.0


def test_holds_from_several_threads_count() -> None:
    way = RightOfWay(max_wait_s=10.0)
    with way.held():
        with way.held():
            assert way.holders == 2
        assert way.holders == 1
    assert way.holders == 0
