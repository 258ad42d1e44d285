"""The control channel of a running simulator: a tiny JSON-over-HTTP server on 127.0.0.1, and its client.

``bkaudit sim up`` runs a :class:`ControlServer` next to its :class:`~bkaudit.sim.cluster.SimulatedCluster`
and records where it listens in a state file (``<state dir>/sim.json``, the dev state directory
``.bkaudit`` by default). ``bkaudit sim <fault> ...``, ``sim truth``, ``sim run --control`` and ``sim down``
find it there (or take ``--control host:port``) and talk to it with :class:`ControlClient`.

Endpoints (JSON bodies and answers; answers are ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": "one line"}`` with status 400 for bad requests, 500 for failures):

- ``GET /status``: the cluster's status (bookies, ledgers, no password);
- ``POST /action`` ``{"action": name, "args": {...}}``: one action of :data:`bkaudit.sim.actions.ACTIONS`;
- ``POST /truth`` ``{"parameters": {...}}``: the ground truth now (parameters as in a scenario's ``truth``);
- ``POST /shutdown``: stop the simulator.

It binds to loopback only and has no authentication: anyone on the machine can inject faults into the
*simulated* cluster, nothing more. Plain ``http.server`` keeps it dependency-free; one request at a time is
handled per thread and the cluster's own lock serialises the actions.

Example:
    >>> state = SimulatorState(control="127.0.0.1:4000", pid=1, zookeeper="127.0.0.1:2181", root="/ledgers")
    >>> SimulatorState.from_json(state.to_json()) == state
    True
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from bkaudit.sim.actions import perform_action
from bkaudit.sim.errors import SimulatorError
from core.errors import BkauditError, ConfigError

if TYPE_CHECKING:
    from bkaudit.sim.cluster import SimulatedCluster

__all__ = [
    "STATE_FILE_NAME",
    "ControlClient",
    "ControlServer",
    "SimulatorState",
    "find_simulator",
    "read_state",
    "remove_state",
    "write_state",
]

logger = logging.getLogger(__name__)

STATE_FILE_NAME = "sim.json"
"""Name of the state file inside the state directory."""

_MAX_BODY = 1024 * 1024
NOT_RUNNING = "no simulator is running (start one with `bkaudit sim up`)"


@dataclass(frozen=True)
class SimulatorState:
    """Where a running simulator listens (the content of the state file).

    Example:
        >>> SimulatorState("127.0.0.1:1", 2, "zk:2181", "/ledgers").to_json()["control"]
        '127.0.0.1:1'
    """

    control: str
    pid: int
    zookeeper: str
    root: str

    def to_json(self) -> dict[str, Any]:
        """The state as a JSON object."""
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SimulatorState:
        """Read it back; a malformed document raises ``ConfigError``."""
        try:
            return cls(str(doc["control"]), int(doc["pid"]), str(doc["zookeeper"]), str(doc["root"]))
        except (KeyError, TypeError, ValueError):
            raise ConfigError("simulator state file is malformed") from None


def state_file(state_dir: str | Path) -> Path:
    """``<state_dir>/sim.json``.

    Example:
        >>> state_file(".bkaudit").as_posix()
        '.bkaudit/sim.json'
    """
    return Path(state_dir) / STATE_FILE_NAME


def write_state(state_dir: str | Path, state: SimulatorState) -> Path:
    """Write the state file (owner-only permissions) and return its path."""
    path = state_file(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as out:
        json.dump(state.to_json(), out)
    temporary.replace(path)
    return path


def read_state(state_dir: str | Path) -> SimulatorState | None:
    """The recorded simulator, or ``None`` when there is no state file."""
    path = state_file(state_dir)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        raise ConfigError(f"simulator state file {path} is unreadable") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"simulator state file {path} is malformed")
    return SimulatorState.from_json(doc)


def remove_state(state_dir: str | Path, pid: int | None = None) -> None:
    """Delete the state file (only if it still names ``pid``, when given)."""
    path = state_file(state_dir)
    with contextlib.suppress(OSError, ConfigError):
        if pid is not None:
            state = read_state(state_dir)
            if state is None or state.pid != pid:
                return
        path.unlink()


# ================================================================================================ server


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("control %s: " + format, self.address_string(), *args)

    def _reply(self, status: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            raise SimulatorError("request body too large")
        raw = self.rfile.read(length) if length else b"{}"
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise SimulatorError("request body is not JSON") from None

    def _handle(self, work: Callable[[], Any]) -> None:
        try:
            self._reply(200, {"ok": True, "result": work()})
        except BkauditError as err:
            self._reply(400, {"ok": False, "error": str(err)})
        except Exception as err:  # the simulator keeps running whatever one request did
            logger.exception("control request failed")
            self._reply(500, {"ok": False, "error": f"{type(err).__name__}: {err}"})

    def do_GET(self) -> None:
        if self.path == "/status":
            self._handle(self.server.sim.status)
        else:
            self._reply(404, {"ok": False, "error": f"no such endpoint {self.path}"})

    def do_POST(self) -> None:
        if self.path == "/action":
            self._handle(self._action)
        elif self.path == "/truth":
            self._handle(self._truth)
        elif self.path == "/shutdown":
            self._handle(self._shutdown)
        else:
            self._reply(404, {"ok": False, "error": f"no such endpoint {self.path}"})

    def _action(self) -> Any:
        body = self._body()
        if not isinstance(body, dict) or not isinstance(body.get("action"), str):
            raise SimulatorError('an action request is {"action": name, "args": {...}}')
        return perform_action(self.server.sim, body["action"], body.get("args") or {})

    def _truth(self) -> Any:
        from bkaudit.sim.scenario import TruthSpec

        body = self._body()
        parameters = body.get("parameters") if isinstance(body, dict) else None
        try:
            spec = TruthSpec.model_validate(parameters or {})
        except ValidationError as err:
            first = err.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"])
            raise SimulatorError(f"truth parameters: {where}: {first['msg']}") from None
        if parameters:
            return self.server.sim.ground_truth(params=spec.to_parameters())
        return self.server.sim.ground_truth()

    def _shutdown(self) -> Any:
        self.server.on_shutdown()
        return {"stopping": True}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], sim: SimulatedCluster, on_shutdown: Callable[[], None]):
        self.sim = sim
        self.on_shutdown = on_shutdown
        super().__init__(address, _Handler)


class ControlServer:
    """Serve a simulated cluster's control channel on ``127.0.0.1:port`` in a background thread.

    ``on_shutdown`` is called (from a request thread) when a client asks the simulator to stop.

    Example:
        >>> # server = ControlServer(sim, on_shutdown=stop_event.set).start()
        >>> # server.address  -> '127.0.0.1:41234'
    """

    def __init__(
        self,
        sim: SimulatedCluster,
        *,
        port: int = 0,
        on_shutdown: Callable[[], None] = lambda: None,
    ) -> None:
        self._server = _Server(("127.0.0.1", port), sim, on_shutdown)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``."""
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> ControlServer:
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="bkaudit-sim-control")
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5.0)
            self._thread = None
        self._server.server_close()


# ================================================================================================ client


class ControlClient:
    """Talk to a running simulator's control channel (every method raises ``BkauditError`` on failure).

    Example:
        >>> ControlClient("127.0.0.1:1").address
        '127.0.0.1:1'
        >>> ControlClient("nonsense")
        Traceback (most recent call last):
        ...
        core.errors.ConfigError: control address must be host:port, not 'nonsense'
    """

    def __init__(self, address: str, *, timeout_s: float = 60.0) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"control address must be host:port, not {address!r}")
        self.address = address
        self._host, self._port = host, int(port)
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        connection = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
        try:
            data = json.dumps(body).encode("utf-8") if body is not None else None
            headers = {"Content-Type": "application/json"} if data is not None else {}
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        except (ConnectionRefusedError, ConnectionResetError):
            raise SimulatorError(f"{NOT_RUNNING}: nothing answers at {self.address}") from None
        except TimeoutError:
            raise SimulatorError(
                f"the simulator at {self.address} did not answer in {self.timeout_s:g} s"
            ) from None
        except OSError as err:
            raise SimulatorError(
                f"cannot reach the simulator at {self.address}: {err.strerror or err}"
            ) from None
        finally:
            connection.close()
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise SimulatorError(f"{self.address} does not speak the simulator's control protocol") from None
        if not isinstance(doc, dict) or "ok" not in doc:
            raise SimulatorError(f"{self.address} does not speak the simulator's control protocol")
        if not doc["ok"]:
            raise SimulatorError(str(doc.get("error") or "the simulator refused the request"))
        return doc.get("result")

    def status(self) -> Any:
        """The simulator's status."""
        return self._request("GET", "/status")

    def action(self, name: str, args: Mapping[str, Any] | None = None) -> Any:
        """Run one action; returns ``{"action": name, "result": ...}``."""
        return self._request("POST", "/action", {"action": name, "args": dict(args or {})})

    def truth(self, parameters: Mapping[str, Any] | None = None) -> Any:
        """The ground truth now."""
        return self._request("POST", "/truth", {"parameters": dict(parameters or {})})

    def shutdown(self) -> Any:
        """Ask the simulator to stop."""
        return self._request("POST", "/shutdown", {})


def find_simulator(state_dir: str | Path, control: str | None = None) -> ControlClient:
    """A client for ``control``, or for the simulator recorded in ``state_dir``; one clear error if none.

    Example:
        >>> find_simulator("/nonexistent-state-dir")
        Traceback (most recent call last):
        ...
        bkaudit.sim.errors.SimulatorError: no simulator is running (start one with `bkaudit sim up`)
    """
    if control:
        return ControlClient(control)
    state = read_state(state_dir)
    if state is None:
        raise SimulatorError(NOT_RUNNING)
    return ControlClient(state.control)
