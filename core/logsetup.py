"""Logging for the long-running commands, with secrets kept out of every record at every level.

Two leaks this closes, both at DEBUG: kazoo logs each ZooKeeper response (a ledger znode's bytes, which
carry the ledger password) and request (an ``Auth`` packet carries the digest credentials), and
a Kafka client may log its configuration (kafka-python's admin client did, password included; librdkafka's
lines reach Python logging through the ``logger`` property, :mod:`connectors.kafka.client_config`).
:class:`SecretFilter` sits on every handler :func:`configure_logging` installs and on the kazoo client
logger of :mod:`connectors.zookeeper.client`; on each record it

- replaces ``bytes`` in the arguments of kazoo's records by their length (znode payloads never reach a
  log; a kazoo record whose text still shows a bytes literal is dropped),
- replaces every registered secret value (the configured Kafka SASL and SSL key passwords, ZooKeeper
  credentials, secret-looking ``kafka.extra_config`` values: every ``SecretStr`` of the settings) and
  any quoted ``...password...`` value or kazoo ``auth='...'`` by ``***``, in the formatted message, the
  exception text and the stack.

Example:
    >>> import logging
    >>> guard = SecretFilter()
    >>> guard.add_secret("s3cret")
    >>> record = logging.LogRecord("kafka.admin.client", logging.DEBUG, __file__, 1,
    ...     "configuration: %s", ({"sasl_plain_password": "s3cret", "other": "x s3cret"},), None)
    >>> guard.filter(record), record.getMessage()
    (True, "configuration: {'sasl_plain_password': '***', 'other': 'x ***'}")
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_KAZOO_SOURCE = f"{os.sep}kazoo{os.sep}"
_BYTES_LITERAL = re.compile(r"""\bb(?:'|")""")
_QUOTED_SECRETS = (
    # kazoo's Auth packet: Auth(auth_type=0, scheme='digest', auth='user:password')
    (re.compile(r"(auth=)'[^']*'"), r"\1'***'"),
    # a client configuration printed as a dict: 'sasl_plain_password': 'value', 'ssl_password': b'...'
    (re.compile(r"""(['"]?\w*password\w*['"]?\s*[:=]\s*)b?(?:'[^']*'|"[^"]*")""", re.IGNORECASE), r"\1'***'"),
)


def _without_bytes(value: Any) -> Any:
    """``value`` with every ``bytes`` inside tuples and lists replaced by ``<N bytes>``.

    Example:
        >>> _without_bytes((b"pw", [1, b"xyz"]))
        ('<2 bytes>', [1, '<3 bytes>'])
    """
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes>"
    if isinstance(value, list):
        return [_without_bytes(item) for item in value]
    if isinstance(value, tuple):
        items = [_without_bytes(item) for item in value]
        if hasattr(value, "_fields"):  # kazoo's requests and ZnodeStat are namedtuples
            return type(value)(*items)
        return tuple(items)
    return value


class SecretFilter(logging.Filter):
    """Redacts secrets from records (never drops a record for that), drops kazoo records showing bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def add_secret(self, secret: str | None) -> None:
        """Redact ``secret`` from every later record (empty and ``None`` are ignored)."""
        if secret:
            self.secrets.add(secret)

    def redact(self, text: str) -> str:
        """``text`` with the registered secrets and quoted password values replaced by ``***``."""
        for pattern, replacement in _QUOTED_SECRETS:
            text = pattern.sub(replacement, text)
        for secret in sorted(self.secrets, key=len, reverse=True):  # longest first: "user:pw" before "pw"
            text = text.replace(secret, "***")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        from_kazoo = _KAZOO_SOURCE in record.pathname
        if from_kazoo and record.args:
            record.args = _without_bytes(record.args)
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: let the handler report it as logging does
            return True
        if from_kazoo and _BYTES_LITERAL.search(message):
            return False  # some payload kazoo printed in a shape we do not know: never risk it
        record.msg, record.args = self.redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


#: The one filter instance: secrets registered anywhere are redacted everywhere it is installed.
SECRET_FILTER = SecretFilter()


def secret_values(model: BaseModel) -> list[str]:
    """Every ``SecretStr`` value in ``model`` and its nested sections.

    Example:
        >>> from core.settings import Settings
        >>> secret_values(Settings(kafka={"sasl_password": "k"}, zookeeper={"auth_password": "z"}))
        ['z', 'k']
        >>> secret_values(Settings(kafka={"extra_config": {"sasl.oauthbearer.client.secret": "o",
        ...                                                "linger.ms": "5"}}))
        ['o']
    """
    found: list[str] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, SecretStr):
            found.append(value.get_secret_value())
        elif isinstance(value, dict):  # kafka.extra_config: its secret-looking properties are SecretStr
            found.extend(item.get_secret_value() for item in value.values() if isinstance(item, SecretStr))
        elif isinstance(value, BaseModel):
            found.extend(secret_values(value))
    return [secret for secret in found if secret]


def register_secrets(secrets: Iterable[str] | BaseModel) -> None:
    """Redact these values (or every secret of these settings) from all records from now on."""
    for secret in secret_values(secrets) if isinstance(secrets, BaseModel) else secrets:
        SECRET_FILTER.add_secret(secret)


def configure_logging(level: str | int = "INFO") -> None:
    """Log to stderr at ``level`` with :data:`SECRET_FILTER` on every root handler.

    Like ``basicConfig``, it leaves the level and handlers of a root logger that already has handlers (a
    test runner's, an embedding application's) as they are, but guards those handlers too.

    Example:
        >>> # configure_logging("DEBUG"); register_secrets(load_settings())
    """
    numeric = level if isinstance(level, int) else getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=numeric, format=LOG_FORMAT, stream=sys.stderr)
    for handler in logging.getLogger().handlers:
        if SECRET_FILTER not in handler.filters:
            handler.addFilter(SECRET_FILTER)


#: Top-level packages whose records tell a command's story; everything else is a library's.
OWN_PACKAGES = frozenset({"bkaudit", "connectors", "core", "streaming", "__main__"})
#: librdkafka's lines come through a logger inside ``connectors`` but are a Kafka client's.
CLIENT_LOGGERS = ("connectors.kafka.librdkafka",)

_library_log: Path | None = None
_library_log_lock = threading.Lock()


class OwnRecords(logging.Filter):
    """Passes the records of bkaudit's own loggers, not those of Spark, py4j or the Kafka/ZooKeeper clients.

    Example:
        >>> def record(name):
        ...     return logging.LogRecord(name, logging.WARNING, __file__, 1, "m", None, None)
        >>> [OwnRecords().filter(record(n)) for n in ("streaming.job", "py4j.clientserver", "kazoo.client",
        ...                                            "connectors.kafka.librdkafka")]
        [True, False, False, False]
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith(CLIENT_LOGGERS):
            return False
        return record.name.split(".", 1)[0] in OWN_PACKAGES


def library_log() -> Path | None:
    """The file that library output goes to in this process (None: the console, as with ``--verbose``).

    :func:`streaming.session.build_spark_session` sends the Spark JVM's own output there.

    Example:
        >>> # configure_command_logging("demo", Path(".bkaudit/logs"), level="WARNING", verbose=False)
        >>> # library_log()  → PosixPath('.bkaudit/logs/demo.log')
    """
    with _library_log_lock:
        return _library_log


def configure_command_logging(
    command: str, log_dir: Path, *, level: str | int, verbose: bool, only_on_a_terminal: bool = False
) -> Path | None:
    """Logging of a long-running command (``demo``, ``stream``, ``watch``): bkaudit's own records at
    ``level`` on stderr, every record (INFO and up, or ``level`` when lower) in ``<log_dir>/<command>.log``,
    whose path is printed once on stdout. Everything stays on stderr, as :func:`configure_logging` does, with
    ``verbose``; with ``only_on_a_terminal`` when stderr is not a terminal (a service: journald or the
    container runtime collects it and rotates it); and, after a one-line warning, when ``log_dir`` cannot be
    written (a log file is never a reason not to run).

    Like :func:`configure_logging`, a root logger that already has handlers (a test runner's, an
    embedding application's) is left as it is, apart from the secret filter; then nothing is printed.

    Example:
        >>> # configure_command_logging("stream", settings.log_dir, level="INFO", verbose=False,
        >>> #                           only_on_a_terminal=True)
    """
    global _library_log
    numeric = level if isinstance(level, int) else getattr(logging, level.upper(), logging.INFO)
    root = logging.getLogger()
    if root.handlers or verbose or (only_on_a_terminal and not sys.stderr.isatty()):
        configure_logging(numeric)
        return None
    from core.errors import ConfigError
    from core.localfs import writable_directory

    try:
        writable_directory(log_dir, "log_dir")
    except ConfigError as err:
        configure_logging(numeric)
        logging.getLogger(__name__).warning("%s: library logs stay on the console", err)
        return None
    path = log_dir / f"{command}.log"
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setLevel(min(numeric, logging.INFO))
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(numeric)
    console.addFilter(OwnRecords())
    for handler in (to_file, console):
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        handler.addFilter(SECRET_FILTER)
        root.addHandler(handler)
    root.setLevel(min(numeric, logging.INFO))
    logging.captureWarnings(True)  # warnings of libraries go to the file, not the console
    with _library_log_lock:
        _library_log = path
    sys.stdout.write(
        f"logs of Spark, py4j and the Kafka and ZooKeeper clients: {path} (--verbose shows them)\n"
    )
    sys.stdout.flush()
    return path


@contextlib.contextmanager
def step(log: logging.Logger, what: str) -> Iterator[None]:
    """Log ``what...`` before a wait and ``what: done in X s`` after it, so a long start is never silent.

    Example:
        >>> import io
        >>> handler = logging.StreamHandler(io.StringIO())
        >>> demo = logging.getLogger("bkaudit.step-example"); demo.addHandler(handler)
        >>> demo.setLevel(logging.INFO); demo.propagate = False
        >>> with step(demo, "starting Spark"):
        ...     pass
        >>> handler.stream.getvalue().splitlines()[0]
        'starting Spark...'
    """
    log.info("%s...", what)
    started = time.monotonic()
    yield
    log.info("%s: done in %.1f s", what, time.monotonic() - started)


def configure_progress_logging() -> None:
    """bkaudit's own INFO records (its :func:`step` lines) on stderr as bare messages when stderr is a
    terminal, for a short command whose stdout is its answer (``dev up`` prints JSON there); nothing else is
    shown. A script's stderr keeps only the one-line error of a failure; a root logger that already has
    handlers (a test runner's) is left as it is.

    Example:
        >>> # configure_progress_logging(); DevCluster(settings).up()   → "starting ZooKeeper..." on stderr
    """
    root = logging.getLogger()
    if root.handlers or not sys.stderr.isatty():
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(OwnRecords())
    handler.addFilter(SECRET_FILTER)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
