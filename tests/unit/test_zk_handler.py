"""kazoo's handler with ``poll`` and read-ahead: a held read sleeps first and then reads all that came."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from connectors.zookeeper.handler import PollingHandler, ReadAheadSocket


@pytest.fixture
def pair() -> Iterator[tuple[ReadAheadSocket, socket.socket]]:
    ours, theirs = socket.socketpair()
    yield ReadAheadSocket(ours), theirs
    ours.close()
    theirs.close()


def test_a_held_read_waits_out_the_hold_and_then_finds_what_arrived(pair) -> None:
    ours, theirs = pair
    handler = PollingHandler()
    theirs.send(b"first")
    handler.hold_reads_until(time.monotonic() + 0.15)
    started = time.monotonic()
    theirs.send(b"second")
    readable, _, _ = handler.select([ours], [], [], 5.0)
    assert readable == [ours] and time.monotonic() - started >= 0.14
    assert ours.recv(100) == b"firstsecond"  # one read for both


def test_a_hold_never_outlasts_the_callers_timeout(pair) -> None:
    ours, _ = pair
    handler = PollingHandler()
    handler.hold_reads_until(time.monotonic() + 5.0)
    started = time.monotonic()
    assert handler.select([ours], [], [], 0.05) == ([], [], [])
    assert time.monotonic() - started < 2.5  # a wait that slept out the 5 s hold would take 5 s


def test_writes_and_bytes_read_ahead_are_not_held(pair) -> None:
    ours, theirs = pair
    handler = PollingHandler()
    theirs.send(b"\x00\x00\x00\x02hi")
    assert ours.recv(4) == b"\x00\x00\x00\x02"  # "hi" stays read ahead
    handler.hold_reads_until(time.monotonic() + 5.0)
    started = time.monotonic()
    assert handler.select([ours], [], [], 5.0)[0] == [ours]
    assert handler.select([], [theirs], [], 5.0)[1] == [theirs]
    assert time.monotonic() - started < 2.5  # a wait that slept out the 5 s hold would take 5 s


def test_an_expired_hold_reads_at_once(pair) -> None:
    ours, theirs = pair
    handler = PollingHandler()
    handler.hold_reads_until(time.monotonic() - 1.0)
    theirs.send(b"x")
    started = time.monotonic()
    assert handler.select([ours], [], [], 5.0)[0] == [ours]
    assert time.monotonic() - started < 2.5  # a wait that slept out the 5 s hold would take 5 s
