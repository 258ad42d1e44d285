"""Our bookie client against our simulated bookie over real TCP on 127.0.0.1.

Both ends are our own components, so nothing is mocked: answers, timeouts, refused connections, pipelining,
reconnects and the fault switches all go through real sockets. Hand-written raw peers cover what our server
never sends (foreign txnIds, garbage, oversize frames) and what our client never sends (AUTH, v2 headers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from connectors.bookie.client import (
    AuthRequired,
    BadResponse,
    BlockingBookieClient,
    BookieClient,
    BookieError,
    ConnectionFailed,
    EntryList,
    EntryPresent,
    NoEntry,
    NoLedger,
    ProbeRequest,
    Timeout,
    probe_ledger_entries_sync,
)
from connectors.bookie.frames import (
    FrameDecoder,
    auth_request,
    encode_frame,
    list_entries_request,
    list_entries_response,
    parse_request,
    parse_response,
)
from connectors.bookie.server import BookieServer, InMemoryEntryStore
from connectors.bookie.tls import auth_required_reason
from connectors.process import free_port
from core.domain.availability import EntryAvailability, encode_availability
from core.pb import bookkeeper_protocol_pb2 as pb

pytestmark = pytest.mark.integration

SILENT_TIMEOUT_S = 0.3


def run(coroutine: Awaitable[object]) -> object:
    return asyncio.run(asyncio.wait_for(coroutine, timeout=15))


@contextlib.asynccontextmanager
async def running_bookie(
    store: InMemoryEntryStore | None = None, **options: object
) -> AsyncIterator[BookieServer]:
    server = BookieServer(store or InMemoryEntryStore(), **options)  # type: ignore[arg-type]
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def store() -> InMemoryEntryStore:
    store = InMemoryEntryStore()
    store.add_entries(5, [0, 1, 2, 3, 5, 6, 7, 8])
    store.create_ledger(6)  # known but empty
    return store


# ------------------------------------------------------------------------------------------------ answers


def test_entry_list_matches_the_store(store):
    async def scenario() -> None:
        async with running_bookie(store) as server, BookieClient() as client:
            result = await client.list_entries(server.address, 5, timeout=2.0)
            assert isinstance(result, EntryList)
            assert list(result.availability.iter_entries()) == [0, 1, 2, 3, 5, 6, 7, 8]
            assert result.availability.to_bytes() == encode_availability(store.entries_of(5) or ())
            assert [group.as_list() for group in result.availability.groups] == [[0, 0, 4, 0], [5, 5, 4, 0]]

            empty = await client.list_entries(server.address, 6)
            assert isinstance(empty, EntryList) and empty.availability == EntryAvailability.empty()

            store.drop_entries(5, [0, 8])  # the next answer reflects the store at that moment
            again = await client.list_entries(server.address, 5)
            assert isinstance(again, EntryList) and list(again.availability.iter_entries()) == [
                1,
                2,
                3,
                5,
                6,
                7,
            ]

    run(scenario())


def test_unknown_ledger_and_enoledger_fault_answer_no_ledger(store):
    async def scenario() -> None:
        async with running_bookie(store) as server, BookieClient() as client:
            assert await client.list_entries(server.address, 404) == NoLedger()
            server.enoledger_for = {5}
            assert await client.list_entries(server.address, 5) == NoLedger()
            assert await client.read_entry_exists(server.address, 5, 0) == NoLedger()
            server.enoledger_for = set()
            assert isinstance(await client.list_entries(server.address, 5), EntryList)
            store.drop_ledger(5)
            assert await client.list_entries(server.address, 5) == NoLedger()

    run(scenario())


def test_read_entry_present_and_absent(store):
    async def scenario() -> None:
        async with running_bookie(store) as server, BookieClient() as client:
            present = await client.read_entry_exists(server.address, 5, 3)
            assert isinstance(present, EntryPresent) and present.body_size > 0
            assert await client.read_entry_exists(server.address, 5, 4) == NoEntry()
            assert await client.read_entry_exists(server.address, 6, 0) == NoEntry()
            assert await client.read_entry_exists(server.address, 99, 0) == NoLedger()

    run(scenario())


def test_fail_status_answers_bookie_error(store):
    async def scenario() -> None:
        async with running_bookie(store) as server, BookieClient() as client:
            server.fail_status = pb.EIO
            result = await client.list_entries(server.address, 5)
            assert result == BookieError(pb.EIO) and not result.conclusive
            assert await client.read_entry_exists(server.address, 5, 0) == BookieError(pb.EIO)
            server.fail_status = None
            assert isinstance(await client.list_entries(server.address, 5), EntryList)

    run(scenario())


def test_auth_required_answers_eua(store):
    async def scenario() -> None:
        async with running_bookie(store, require_auth=True) as server, BookieClient() as client:
            wanted = AuthRequired(auth_required_reason(None))  # names what bkaudit was not given
            assert await client.list_entries(server.address, 5) == wanted
            assert await client.read_entry_exists(server.address, 5, 0) == wanted

    run(scenario())


# ------------------------------------------------------------------------------------------ unknown outcomes


def test_silent_bookie_times_out_within_the_timeout(store):
    async def scenario() -> None:
        async with running_bookie(store) as server, BookieClient() as client:
            server.silent = True
            started = time.monotonic()
            result = await client.list_entries(server.address, 5, timeout=SILENT_TIMEOUT_S)
            elapsed = time.monotonic() - started
            assert result == Timeout(SILENT_TIMEOUT_S) and not result.conclusive
            assert SILENT_TIMEOUT_S <= elapsed < SILENT_TIMEOUT_S + 3.0  # not the 5 s default
            assert (
                server.stats.requests_received == 1 and server.stats.responses_sent == 0
            )  # read, not answered
            server.silent = False
            # Same connection, still usable: the timeout did not break it.
            assert isinstance(await client.list_entries(server.address, 5), EntryList)
            assert client.connection_count == 1 and server.stats.connections_accepted == 1

    run(scenario())


def test_a_count_silence_drops_exactly_that_many_requests_then_answers(store):
    async def scenario() -> None:
        async with running_bookie(store) as server, BookieClient() as client:
            server.drop_next = 2
            for _ in range(2):
                assert await client.list_entries(server.address, 5, timeout=SILENT_TIMEOUT_S) == Timeout(
                    SILENT_TIMEOUT_S
                )
            assert isinstance(await client.list_entries(server.address, 5), EntryList)
            assert server.stats.requests_dropped == 2 and server.drop_next == 0 and not server.silent

    run(scenario())


def test_slow_bookie_is_answered_within_a_larger_timeout_and_late_answers_are_dropped(store, caplog):
    async def scenario() -> None:
        async with running_bookie(store) as server, BookieClient() as client:
            server.delay_s = 0.2
            assert isinstance(await client.list_entries(server.address, 5, timeout=2.0), EntryList)
            assert await client.list_entries(server.address, 5, timeout=0.05) == Timeout(0.05)
            await asyncio.sleep(0.25)  # the late answer arrives and is dropped quietly
            server.delay_s = 0.0
            assert isinstance(await client.list_entries(server.address, 5), EntryList)

    with caplog.at_level(logging.DEBUG, logger="connectors.bookie.client"):
        run(scenario())
    assert any("late answer" in record.message for record in caplog.records)
    assert not any(record.levelno >= logging.WARNING for record in caplog.records)


def test_closed_port_and_refusing_bookie_give_connection_failed(store):
    async def scenario() -> None:
        async with BookieClient() as client:
            result = await client.list_entries(f"127.0.0.1:{free_port()}", 5)
            assert isinstance(result, ConnectionFailed) and "cannot connect" in result.reason
            bad_address = await client.list_entries("no-port-here", 5)
            assert isinstance(bad_address, ConnectionFailed) and "host:port" in bad_address.reason
            async with running_bookie(store) as server:
                server.refuse = True
                refused = await client.list_entries(server.address, 5, timeout=2.0)
                assert isinstance(refused, ConnectionFailed)
                server.refuse = False
                assert isinstance(await client.list_entries(server.address, 5), EntryList)

    run(scenario())


def test_in_flight_requests_fail_fast_when_the_connection_drops(store):
    async def scenario() -> None:
        async with running_bookie(store) as server, BookieClient() as client:
            server.silent = True
            probes = [
                asyncio.create_task(client.list_entries(server.address, 5, timeout=5.0)) for _ in range(3)
            ]
            await asyncio.sleep(0.1)
            started = time.monotonic()
            await server.stop()
            results = await asyncio.gather(*probes)
            assert time.monotonic() - started < 3.0  # failed at once, not after the 5 s timeout
            assert all(isinstance(result, ConnectionFailed) for result in results)

    run(scenario())


def test_client_reconnects_after_a_server_restart(store):
    async def scenario() -> None:
        async with running_bookie(store) as server, BookieClient() as client:
            assert isinstance(await client.list_entries(server.address, 5), EntryList)
            port = server.port
            await server.stop()
            assert isinstance(await client.list_entries(server.address, 5), ConnectionFailed)
            await server.start()
            assert server.port == port
            assert isinstance(await client.list_entries(server.address, 5), EntryList)
            assert client.connection_count == 1 and server.stats.connections_accepted == 2

    run(scenario())


# -------------------------------------------------------------------------------------- pipelining, limits


def test_500_pipelined_requests_with_random_delays_match_their_txn_ids():
    store = InMemoryEntryStore()
    expected: dict[int, list[int]] = {}
    rng = random.Random(7)
    for ledger_id in range(500):
        entries = sorted(rng.sample(range(64), rng.randint(0, 20)))
        if ledger_id % 10 == 9:
            continue  # unknown to the bookie → ENOLEDGER
        store.add_entries(ledger_id, entries)
        store.create_ledger(ledger_id)
        expected[ledger_id] = entries

    async def scenario() -> None:
        async with running_bookie(store) as server:
            server.delay_jitter_s = 0.05  # answers complete out of order
            async with BookieClient(max_in_flight_per_bookie=500) as client:
                ledger_ids = list(range(500))
                rng.shuffle(ledger_ids)
                results = await asyncio.gather(
                    *(client.list_entries(server.address, lid) for lid in ledger_ids)
                )
                for ledger_id, result in zip(ledger_ids, results, strict=True):
                    if ledger_id in expected:
                        assert isinstance(result, EntryList), (ledger_id, result)
                        assert list(result.availability.iter_entries()) == expected[ledger_id]
                    else:
                        assert result == NoLedger()
                assert client.connection_count == 1
            assert server.stats.connections_accepted == 1 and server.stats.responses_sent == 500

    run(scenario())


def test_in_flight_requests_per_bookie_are_bounded(store):
    async def scenario() -> None:
        async with running_bookie(store) as server, BookieClient(max_in_flight_per_bookie=4) as client:
            server.delay_s = 0.1
            started = time.monotonic()
            results = await client.probe_many([ProbeRequest(server.address, 5)] * 20, concurrency=20)
            elapsed = time.monotonic() - started
            assert all(isinstance(result, EntryList) for result in results)
            assert elapsed >= 5 * 0.1 * 0.9  # 20 requests, 4 at a time, 0.1 s each: at least 5 waves

    run(scenario())


def test_global_in_flight_limit_spans_bookies(store):
    async def scenario() -> None:
        async with running_bookie(store) as first, running_bookie(store) as second:
            first.delay_s = second.delay_s = 0.1
            async with BookieClient(max_in_flight=2, max_in_flight_per_bookie=10) as client:
                requests = [ProbeRequest(first.address, 5), ProbeRequest(second.address, 5)] * 4
                started = time.monotonic()
                results = await client.probe_many(requests, concurrency=8)
                assert time.monotonic() - started >= 4 * 0.1 * 0.9
                assert all(isinstance(result, EntryList) for result in results)

    run(scenario())


def test_probe_many_keeps_input_order_across_bookies_and_kinds(store):
    async def scenario() -> None:
        async with running_bookie(store) as healthy, running_bookie(store) as silent:
            silent.silent = True
            requests = [
                ProbeRequest(healthy.address, 5),
                ProbeRequest(silent.address, 5),
                ProbeRequest(healthy.address, 5, entry_id=4),
                ProbeRequest(healthy.address, 77),
                ProbeRequest(healthy.address, 5, entry_id=5),
            ]
            async with BookieClient() as client:
                results = await client.probe_many(requests, concurrency=3, timeout=SILENT_TIMEOUT_S)
            assert [result.kind for result in results] == [
                "entry_list",
                "timeout",
                "no_entry",
                "no_ledger",
                "entry_present",
            ]

    run(scenario())


def test_closing_the_client_fails_in_flight_requests(store):
    async def scenario() -> None:
        async with running_bookie(store) as server:
            server.silent = True
            client = BookieClient()
            probe = asyncio.create_task(client.list_entries(server.address, 5, timeout=5.0))
            await asyncio.sleep(0.1)
            await client.close()
            assert isinstance(await asyncio.wait_for(probe, 1.0), ConnectionFailed)
            assert isinstance(await client.list_entries(server.address, 5), ConnectionFailed)

    run(scenario())


# ------------------------------------------------------------------------------------------- sync callers


def test_blocking_client_against_a_background_server(store):
    with BookieServer(store) as healthy, BookieServer(store) as silent:
        silent.silent = True  # set from this thread while the server runs on its own
        with BlockingBookieClient(timeout=SILENT_TIMEOUT_S) as client:
            assert isinstance(client.list_entries(healthy.address, 5), EntryList)
            assert client.read_entry_exists(healthy.address, 5, 4) == NoEntry()
            first = client.probe_many([ProbeRequest(healthy.address, 5), ProbeRequest(silent.address, 5)])
            second = client.probe_many([ProbeRequest(healthy.address, 6)])
            assert [r.kind for r in first + second] == ["entry_list", "timeout", "entry_list"]
        assert healthy.stats.connections_accepted == 1  # reused across calls ("micro-batches")
        results = probe_ledger_entries_sync([(healthy.address, 5), (healthy.address, 404)], timeout=1.0)
        assert [r.kind for r in results] == ["entry_list", "no_ledger"]


def test_background_server_restarts_on_the_same_port(store):
    server = BookieServer(store).start_background()
    try:
        address = server.address
        server.stop_background()
        assert isinstance(probe_ledger_entries_sync([(address, 5)], timeout=1.0)[0], ConnectionFailed)
        server.start_background()
        assert server.address == address
        assert isinstance(probe_ledger_entries_sync([(address, 5)], timeout=1.0)[0], EntryList)
    finally:
        server.stop_background()


def test_sync_wrapper_works_inside_a_running_event_loop(store):
    async def scenario() -> None:
        with BookieServer(store) as server:
            # A notebook or a framework may already run a loop on this thread.
            results = probe_ledger_entries_sync([(server.address, 5)], timeout=1.0)
            assert isinstance(results[0], EntryList)

    run(scenario())


def test_faults_can_be_flipped_from_many_threads(store):
    with BookieServer(store) as server:
        flips = [
            threading.Thread(target=lambda: server.set_faults(delay_s=0.0, silent=False)) for _ in range(8)
        ]
        for thread in flips:
            thread.start()
        for thread in flips:
            thread.join()
        assert server.faults.silent is False
        assert isinstance(probe_ledger_entries_sync([(server.address, 5)], timeout=1.0)[0], EntryList)


# ------------------------------------------------------------------------------------ raw peers (our server)


async def _raw_exchange(address: str, requests: list[pb.Request]) -> list[pb.Response]:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    decoder, answers = FrameDecoder(), list[pb.Response]()
    try:
        for sent, request in enumerate(requests, start=1):
            writer.write(encode_frame(request))
            await writer.drain()
            while len(answers) < sent:
                answers += [parse_response(frame) for frame in decoder.feed(await reader.read(65536))]
    finally:
        writer.close()
    return answers


def test_server_answers_a_non_v3_header_with_ebadversion(store):
    async def scenario() -> None:
        async with running_bookie(store) as server:
            (answer,) = await _raw_exchange(
                server.address, [list_entries_request(5, 3, version=pb.VERSION_TWO)]
            )
            assert answer.status == pb.EBADVERSION == answer.getListOfEntriesOfLedgerResponse.status
            assert (answer.header.txnId, answer.header.operation) == (3, pb.GET_LIST_OF_ENTRIES_OF_LEDGER)

    run(scenario())


def test_server_serves_after_auth_with_the_right_plugin(store):
    async def scenario() -> None:
        async with running_bookie(store, require_auth=True, auth_plugin_name="TestPlugin") as server:
            answers = await _raw_exchange(
                server.address,
                [
                    list_entries_request(5, 1),
                    auth_request("WrongPlugin", b"", 2),
                    auth_request("TestPlugin", b"secret", 3),
                    list_entries_request(5, 4),
                ],
            )
            assert [answer.status for answer in answers] == [pb.EUA, pb.EUA, pb.EOK, pb.EOK]
            assert not answers[0].HasField("getListOfEntriesOfLedgerResponse")  # EUA carries no inner answer
            assert answers[3].getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger

    run(scenario())


def test_server_answers_unsupported_operations_with_ebadreq(store):
    async def scenario() -> None:
        async with running_bookie(store) as server:
            request = pb.Request(
                header=pb.BKPacketHeader(version=pb.VERSION_THREE, operation=pb.ADD_ENTRY, txnId=9)
            )
            (answer,) = await _raw_exchange(server.address, [request])
            assert answer.status == pb.EBADREQ and answer.header.txnId == 9

    run(scenario())


# ----------------------------------------------------------------------------------- raw peers (our client)

Reply = Callable[[pb.Request], list[bytes]]


@contextlib.asynccontextmanager
async def raw_bookie(reply: Reply) -> AsyncIterator[str]:
    """A hand-written peer: for every request, writes the frames ``reply`` returns (already framed)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                for frame in decoder.feed(data):
                    for chunk in reply(parse_request(frame)):
                        writer.write(chunk)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def _answer(request: pb.Request, txn_id: int | None = None, entries: tuple[int, ...] = (1, 2)) -> bytes:
    header = pb.BKPacketHeader()
    header.CopyFrom(request.header)
    if txn_id is not None:
        header.txnId = txn_id
    ledger_id = request.getListOfEntriesOfLedgerRequest.ledgerId
    return encode_frame(list_entries_response(header, ledger_id, pb.EOK, encode_availability(entries)))


def test_client_drops_answers_for_unknown_txn_ids(caplog):
    def reply(request: pb.Request) -> list[bytes]:
        foreign = _answer(request, txn_id=request.header.txnId + 1_000_000, entries=(9,))
        return [foreign, _answer(request)]

    async def scenario() -> None:
        async with raw_bookie(reply) as address, BookieClient() as client:
            result = await client.list_entries(address, 5, timeout=2.0)
            assert isinstance(result, EntryList) and list(result.availability.iter_entries()) == [1, 2]

    with caplog.at_level(logging.WARNING, logger="connectors.bookie.client"):
        run(scenario())
    assert any("unknown txnId" in record.message for record in caplog.records)


def test_client_matches_on_txn_id_and_operation():
    def reply(request: pb.Request) -> list[bytes]:
        wrong_op = list_entries_response(request.header, 5, pb.EOK, encode_availability([9]))
        wrong_op.header.operation = pb.READ_ENTRY  # same txnId, other operation: not ours
        return [encode_frame(wrong_op), _answer(request, entries=(3,))]

    async def scenario() -> None:
        async with raw_bookie(reply) as address, BookieClient() as client:
            result = await client.list_entries(address, 5, timeout=2.0)
            assert isinstance(result, EntryList) and list(result.availability.iter_entries()) == [3]

    run(scenario())


def test_undecodable_answer_is_a_bad_response_not_a_timeout():
    def reply(request: pb.Request) -> list[bytes]:
        return [encode_frame(b"\xff\xfe garbage")]

    async def scenario() -> None:
        async with raw_bookie(reply) as address, BookieClient() as client:
            started = time.monotonic()
            result = await client.list_entries(address, 5, timeout=5.0)
            assert isinstance(result, BadResponse) and "undecodable" in result.reason
            assert time.monotonic() - started < 3.0  # at once, not after the 5 s timeout

    run(scenario())


def test_routable_but_invalid_answer_is_a_bad_response_for_that_request():
    def reply(request: pb.Request) -> list[bytes]:
        header = request.header.SerializeToString()
        # Header readable, status 999 unknown to us: routed to its request as a BadResponse.
        return [encode_frame(b"\x0a" + bytes([len(header)]) + header + b"\x10\xe7\x07")]

    async def scenario() -> None:
        async with raw_bookie(reply) as address, BookieClient() as client:
            result = await client.list_entries(address, 5, timeout=2.0)
            assert isinstance(result, BadResponse) and "unknown status code 999" in result.reason
            again = await client.list_entries(address, 5, timeout=2.0)  # connection still usable
            assert isinstance(again, BadResponse) and client.connection_count == 1

    run(scenario())


def test_oversize_frame_from_a_bookie_is_a_bad_response():
    def reply(request: pb.Request) -> list[bytes]:
        return [b"\x7f\x00\x00\x00"]

    async def scenario() -> None:
        async with raw_bookie(reply) as address, BookieClient(max_frame_size=1024) as client:
            result = await client.list_entries(address, 5, timeout=2.0)
            assert isinstance(result, BadResponse) and "exceeds the maximum frame size" in result.reason

    run(scenario())


def test_corrupt_availability_bytes_are_a_bad_response():
    def reply(request: pb.Request) -> list[bytes]:
        response = list_entries_response(request.header, 5, pb.EOK, b"\x00\x00\x00\x01" + bytes(60))
        return [encode_frame(response)]

    async def scenario() -> None:
        async with raw_bookie(reply) as address, BookieClient() as client:
            result = await client.list_entries(address, 5, timeout=2.0)
            assert isinstance(result, BadResponse) and "unsupported header version 1" in result.reason

    run(scenario())


def test_request_bytes_on_the_wire_are_bookkeepers():
    seen: list[bytes] = []

    def reply(request: pb.Request) -> list[bytes]:
        seen.append(request.SerializeToString())
        return [_answer(request)]

    async def scenario() -> None:
        async with raw_bookie(reply) as address, BookieClient() as client:
            await client.list_entries(address, 5)

    run(scenario())
    (body,) = seen
    request = parse_request(body)
    assert body == list_entries_request(5, request.header.txnId).SerializeToString()
    assert request.header.version == pb.VERSION_THREE and request.header.txnId >= 1


def test_blocking_client_with_bad_options_raises_and_leaves_no_thread():
    threads_before = threading.active_count()
    with pytest.raises(ValueError, match="in-flight limits"):
        BlockingBookieClient(max_in_flight=0)
    assert threading.active_count() == threads_before
