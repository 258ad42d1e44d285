"""ZooKeeper reads whose completions reach the caller in the same order as watch notifications (kazoo).

ZooKeeper answers one session's requests and sends its watch notifications in one stream, in zxid order: a
client sees a change's notification before any read that returns the changed data. kazoo keeps that order on
its connection thread but then splits it: watch callbacks run on one worker thread (``callback_queue``),
async-result callbacks on another (``completion_queue``), so a program that mixes the two can see a read's
result before an earlier notification. :class:`OrderedReads` sends reads through kazoo's connection with a
result object whose completion is dispatched onto the *watch* callback queue instead, so reads, watch
notifications and :meth:`OrderedReads.marker` tokens are all delivered on kazoo's callback thread, in arrival
order. That thread must never block on ZooKeeper itself; the deliver function should only hand the item on.
With :class:`~connectors.zookeeper.handler.PollingHandler` (``inline_callbacks``) the same dispatch runs
the deliver function at once on kazoo's connection thread, again in arrival order; it must not block at all.

:meth:`OrderedReads.get_many` reads many znodes in one ``multiRead`` request (opcode 22, ZooKeeper ≥ 3.6):
one request and one answer instead of hundreds, which is what makes a snapshot of a million ledgers fast in
Python (kazoo spends several system calls per request on its connection thread). Each znode still gets its
own result (data and stat, or the error for that znode), delivered together in request order.

Example:
    >>> # reads = OrderedReads(client, lambda token, value, error: queue.put((token, value, error)))
    >>> # reads.get("/ledgers/00/0000/L0001", token="ledger-1")   # -> (token, (data, stat), None) later
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import EXCEPTIONS, KazooException, ZookeeperError
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.serialization import (
    Exists,
    GetChildren,
    GetData,
    int_struct,
    multiheader_struct,
    read_buffer,
    stat_struct,
    write_string,
)
from kazoo.protocol.states import Callback, ZnodeStat

MULTI_READ_OPCODE = 22
GET_DATA_OPCODE = 4
ERROR_OPCODE = -1

#: ``deliver(token, value, error)``: ``value`` is what kazoo's async call would return (``(data, stat)``,
#: a children list, a stat or None); ``error`` the exception instead (NoNodeError, ConnectionLoss, ...).
Deliver = Callable[[Any, Any, BaseException | None], Any]
WatchFunction = Callable[..., Any]


class MultiRead(namedtuple("MultiRead", "paths")):
    """``multiRead`` of getData operations (jute ``MultiOperationRecord``; paths are full server paths).

    The answer is one result per path, in order: ``(data, ZnodeStat)`` or the exception for that znode.

    Example:
        >>> MultiRead(["/a"]).serialize().hex()
        '0000000400ffffffff000000022f6100ffffffff01ffffffff'
        >>> body = bytes.fromhex("ffffffff00ffffff9b" "ffffff9b" "ffffffff01ffffffff")
        >>> [type(r).__name__ for r in MultiRead.deserialize(body, 0)]
        ['NoNodeError']
    """

    type = MULTI_READ_OPCODE

    def serialize(self) -> bytearray:
        body = bytearray()
        for path in self.paths:
            body.extend(multiheader_struct.pack(GET_DATA_OPCODE, False, -1))
            body.extend(write_string(path))
            body.append(0)  # no watch
        body.extend(multiheader_struct.pack(-1, True, -1))
        return body

    @classmethod
    def deserialize(cls, buffer: bytes, offset: int) -> list[Any]:
        results: list[Any] = []
        header_size, stat_size, int_size = multiheader_struct.size, stat_struct.size, int_struct.size
        while True:
            op_type, done, _err = multiheader_struct.unpack_from(buffer, offset)
            offset += header_size
            if done:
                return results
            if op_type == GET_DATA_OPCODE:
                data, offset = read_buffer(buffer, offset)
                results.append((data, ZnodeStat._make(stat_struct.unpack_from(buffer, offset))))
                offset += stat_size
            elif op_type == ERROR_OPCODE:
                code = int_struct.unpack_from(buffer, offset)[0]
                offset += int_size
                error_type = EXCEPTIONS.get(code, ZookeeperError)
                results.append(error_type())
            else:
                raise ValueError(f"unexpected operation type {op_type} in a multiRead answer")


class _OrderedResult:
    """Stands in for kazoo's AsyncResult (the connection only calls ``set``/``set_exception``)."""

    __slots__ = ("_deliver", "_handler", "_token")

    def __init__(self, handler: Any, deliver: Deliver, token: Any) -> None:
        self._handler = handler
        self._deliver = deliver
        self._token = token

    def set(self, value: Any = None) -> None:
        self._handler.dispatch_callback(Callback("completion", self._deliver, (self._token, value, None)))

    def set_exception(self, exception: BaseException) -> None:
        self._handler.dispatch_callback(Callback("completion", self._deliver, (self._token, None, exception)))


class OrderedReads:
    """Issue reads on ``client`` whose completions go to ``deliver`` in watch-notification order.

    Paths are as the caller sees them (inside the client's chroot). A ``watch`` function is registered the
    way kazoo's own ``get(path, watch)`` does (one-shot, kazoo-managed).

    Example:
        >>> # reads.get_children("/ledgers/available", token=("bookies", "writable"))
        >>> # reads.marker(token="end-of-scan")   # delivered after everything already received
    """

    def __init__(self, client: KazooClient, deliver: Deliver) -> None:
        self._client = client
        self._deliver = deliver

    def _send(self, request: Any, token: Any) -> None:
        self._client._call(request, _OrderedResult(self._client.handler, self._deliver, token))

    def _full_path(self, path: str) -> str:
        return str(_prefix_root(self._client.chroot, path))

    def get(self, path: str, token: Any, watch: WatchFunction | None = None) -> None:
        """Read data and stat: delivers ``(data, stat)`` or NoNodeError."""
        self._send(GetData(self._full_path(path), watch), token)

    def get_children(self, path: str, token: Any, watch: WatchFunction | None = None) -> None:
        """List children: delivers a list of names or NoNodeError."""
        self._send(GetChildren(self._full_path(path), watch), token)

    def exists(self, path: str, token: Any, watch: WatchFunction | None = None) -> None:
        """Stat a node: delivers a stat, or None when it does not exist (a watch is left either way)."""
        self._send(Exists(self._full_path(path), watch), token)

    def get_many(self, paths: list[str], token: Any) -> None:
        """Read every path in one ``multiRead``: delivers ``(token, [result per path], None)``, each result
        ``(data, stat)`` or an exception (NoNodeError...); a failure of the whole request as the error."""
        self._send(MultiRead([self._full_path(path) for path in paths]), token)

    def supports_multi_read(self, timeout: float = 10.0) -> bool:
        """True when the server answers ``multiRead`` (ZooKeeper ≥ 3.6); checked with a read of ``/``."""
        result = self._client.handler.async_result()
        self._client._call(MultiRead([self._full_path("/")]), result)
        try:
            result.get(timeout=timeout)
        except KazooException:
            return False
        return True

    def marker(self, token: Any) -> None:
        """Deliver ``token`` (value, error None) after every notification and completion received so far."""
        self._client.handler.dispatch_callback(Callback("marker", self._deliver, (token, None, None)))
