"""Where the Delta tables live: a local directory or an S3-compatible object store, behind one small API.

A *location* is a string: a local path (``/data/lakehouse``, ``lakehouse``) or an object-store URL
(``s3://bucket/prefix``). The functions here (:func:`join`, :func:`exists`, :func:`list_dirs`,
:func:`read_bytes`, :func:`write_atomic`, :func:`size`, :func:`make_dirs`, :func:`ensure_writable`) do the
same thing on both, so the code above them never calls ``pathlib`` or ``os`` on the lakehouse.

The object store's endpoint, region and credentials come from the ``object_store`` settings.
:func:`configure` puts them in the process's ``AWS_*`` environment variables, which is where delta-rs's
object store, pyarrow's ``S3FileSystem`` and the fold's child process (which inherits them) all read them:
one place sets them, no call site passes credentials along, and nothing logs them.

Example:
    >>> join("s3://bucket/lakehouse", "ledgers")
    's3://bucket/lakehouse/ledgers'
    >>> join("/data/lakehouse/", "ledgers", "_delta_log")
    '/data/lakehouse/ledgers/_delta_log'
    >>> is_remote("s3://bucket/lh"), is_remote("/data/lh")
    (True, False)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from core.errors import ConfigError, ServiceError
from core.localfs import writable_directory

if TYPE_CHECKING:
    from core.settings import Settings

#: The URL schemes served by the object store (S3's API; ``s3a`` is the Hadoop spelling of the same).
REMOTE_SCHEMES = ("s3", "s3a")

#: The environment variables :func:`configure` sets (delta-rs and pyarrow read the same names).
ENV_ENDPOINT = "AWS_ENDPOINT_URL"
ENV_REGION = "AWS_REGION"
ENV_KEY_ID = "AWS_ACCESS_KEY_ID"
ENV_SECRET = "AWS_SECRET_ACCESS_KEY"
ENV_TOKEN = "AWS_SESSION_TOKEN"
ENV_ALLOW_HTTP = "AWS_ALLOW_HTTP"


#: Words of delta-rs's (``object_store``) and pyarrow's (AWS SDK, curl) errors for a store that did not
#: answer: a refused or reset connection, a request that timed out. An HTTP status (403, 404, 412) is one.
UNANSWERED = (
    "error sending request",
    "operation timed out",
    "connection refused",
    "connection reset",
    "network_connection",
    "could not connect",
    "timeout was reached",
    "curlcode: 28",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m|↳")


class ObjectStoreUnreachable(ServiceError):
    """The object store did not answer (after the clients' own retries): the job stops with this one line
    before its batch is committed; a restart replays the batch once the store answers. ``detail`` is what
    failed, shortened, without the advice."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message


def unreachable(error: BaseException) -> ObjectStoreUnreachable | None:
    """The one-line error to stop with when ``error`` (or an error it was raised from) says the object store
    did not answer; None for any other error.

    Example:
        >>> err = OSError("Generic S3 error: Error performing GET http://s3:9000/b/k in 4s, after 10 retries"
        ...               " - HTTP error: error sending request")
        >>> str(unreachable(RuntimeError("the sink failed")) or "")
        ''
        >>> try:
        ...     raise RuntimeError("the sink failed") from err
        ... except RuntimeError as wrapped:
        ...     print(str(unreachable(wrapped)).split(" (")[0])
        the object store did not answer
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, ObjectStoreUnreachable):
            return current
        seen.add(id(current))
        text = " ".join(_ANSI.sub(" ", str(current)).split())
        if any(word in text.lower() for word in UNANSWERED):
            return ObjectStoreUnreachable(unreachable_message(text), _shortened(text))
        current = current.__cause__ or current.__context__
    return None


def unreachable_message(detail: str, environ: Mapping[str, str] | None = None) -> str:
    """The line an outage stops the job with: the endpoint, what failed (shortened), and what to do.

    Example:
        >>> unreachable_message("Generic S3 error: GET http://s3:9000/b/k: error sending request",
        ...                     {"AWS_ENDPOINT_URL": "http://s3:9000"})[:60]
        'the object store did not answer (endpoint http://s3:9000; Ge'
    """
    source = os.environ if environ is None else environ
    endpoint = source.get(ENV_ENDPOINT) or "the AWS default"
    return (
        f"the object store did not answer (endpoint {endpoint}; {_shortened(detail)}): the job stopped "
        "before committing its batch, which a restart replays; start the job again once the store answers "
        "(docs/troubleshooting.md, 'The object store is unreachable')"
    )


def _shortened(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_remote(location: str | Path) -> bool:
    """Whether ``location`` is an object-store URL (``s3://…``) rather than a local path.

    Example:
        >>> is_remote("s3a://b/x"), is_remote(Path("lakehouse"))
        (True, False)
    """
    return isinstance(location, str) and urlparse(location).scheme in REMOTE_SCHEMES


def join(root: str | Path, *parts: str) -> str:
    """``root`` and ``parts`` joined with ``/`` (a URL stays a URL; a local path stays as given).

    Example:
        >>> join("lakehouse", "bookies")
        'lakehouse/bookies'
    """
    if not is_remote(root):
        return str(Path(root, *parts))
    text = str(root).rstrip("/")
    return "/".join([text, *(part.strip("/") for part in parts)])


def configure(
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    session_token: str | None = None,
    allow_http: bool = False,
    environ: os._Environ[str] | dict[str, str] | None = None,
) -> None:
    """Make the object store's settings this process's (and its children's) ``AWS_*`` variables.

    A value not given leaves its variable as the environment has it (an instance role, a web identity
    token, a profile keep working).

    Example:
        >>> env: dict[str, str] = {}
        >>> configure(endpoint_url="http://127.0.0.1:9000", access_key_id="k", secret_access_key="s",
        ...           allow_http=True, environ=env)
        >>> sorted(env)
        ['AWS_ACCESS_KEY_ID', 'AWS_ALLOW_HTTP', 'AWS_ENDPOINT_URL', 'AWS_SECRET_ACCESS_KEY']
    """
    target = os.environ if environ is None else environ
    values = {
        ENV_ENDPOINT: endpoint_url,
        ENV_REGION: region,
        ENV_KEY_ID: access_key_id,
        ENV_SECRET: secret_access_key,
        ENV_TOKEN: session_token,
        ENV_ALLOW_HTTP: "true" if allow_http else None,
    }
    for name, value in values.items():
        if value:
            target[name] = value


def storage_options(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The configured object-store options as delta-rs's ``storage_options`` (for a call that wants them
    explicit; every other call reads the same values from the environment).

    Example:
        >>> storage_options({"AWS_REGION": "eu-west-1", "HOME": "/root"})
        {'AWS_REGION': 'eu-west-1'}
    """
    source = os.environ if environ is None else environ
    names = (ENV_ENDPOINT, ENV_REGION, ENV_KEY_ID, ENV_SECRET, ENV_TOKEN, ENV_ALLOW_HTTP)
    return {name: source[name] for name in names if source.get(name)}


def _s3(environ: Mapping[str, str] | None = None) -> pafs.S3FileSystem:
    """pyarrow's S3 client on the configured endpoint, one per configuration (kept: a checkpoint file is
    written per batch)."""
    return _s3_client(tuple(sorted(storage_options(environ).items())))


@functools.lru_cache(maxsize=8)
def _s3_client(settings: tuple[tuple[str, str], ...]) -> pafs.S3FileSystem:
    """pyarrow's S3 client for ``settings`` (path-style addressing, as MinIO and moto expect)."""
    options = dict(settings)
    endpoint = options.get(ENV_ENDPOINT)
    kwargs: dict[str, object] = {
        "region": options.get(ENV_REGION, "us-east-1"),
        "connect_timeout": 10,
        "request_timeout": 30,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=3),
    }
    if endpoint:
        parsed = urlparse(endpoint)
        kwargs["endpoint_override"] = parsed.netloc or parsed.path
        kwargs["scheme"] = parsed.scheme or "https"
    if options.get(ENV_KEY_ID):
        kwargs["access_key"] = options[ENV_KEY_ID]
        kwargs["secret_key"] = options.get(ENV_SECRET, "")
        if options.get(ENV_TOKEN):
            kwargs["session_token"] = options[ENV_TOKEN]
    return pafs.S3FileSystem(**kwargs)


def filesystem(location: str | Path) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem that serves ``location`` and the path inside it (``bucket/key`` on S3).

    Example:
        >>> fs, inner = filesystem("/tmp/lh")
        >>> type(fs).__name__, inner
        ('LocalFileSystem', '/tmp/lh')
    """
    if not is_remote(location):
        return pafs.LocalFileSystem(), str(Path(location).absolute())
    parsed = urlparse(str(location))
    return _s3(), f"{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")


def exists(location: str | Path) -> bool:
    """Whether a file or directory (on S3: an object or a prefix with objects) is at ``location``.

    Example:
        >>> exists(tempfile.gettempdir()), exists("/nonexistent/x")
        (True, False)
    """
    fs, inner = filesystem(location)
    return fs.get_file_info(inner).type != pafs.FileType.NotFound


def is_dir(location: str | Path) -> bool:
    """Whether ``location`` is a directory (on S3: a prefix that holds objects).

    Example:
        >>> is_dir(tempfile.gettempdir())
        True
    """
    fs, inner = filesystem(location)
    return fs.get_file_info(inner).type == pafs.FileType.Directory


def list_dirs(location: str | Path) -> list[str]:
    """The names of the directories directly under ``location``, sorted (empty when there is none).

    Example:
        >>> root = tempfile.mkdtemp(); (Path(root) / "b").mkdir(); (Path(root) / "a").mkdir()
        >>> list_dirs(root)
        ['a', 'b']
    """
    fs, inner = filesystem(location)
    try:
        infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
    except NotADirectoryError:
        return []
    return sorted(info.base_name for info in infos if info.type == pafs.FileType.Directory)


def read_bytes(location: str | Path) -> bytes:
    """The whole file at ``location``; :class:`FileNotFoundError` when there is none.

    Example:
        >>> path = join(tempfile.mkdtemp(), "x.json"); write_atomic(path, b"{}"); read_bytes(path)
        b'{}'
    """
    fs, inner = filesystem(location)
    with fs.open_input_stream(inner) as stream:
        return bytes(stream.read())


def write_atomic(location: str | Path, data: bytes | pa.Buffer) -> None:
    """Write ``data`` to ``location`` whole or not at all: locally a fsynced temporary file renamed over
    it; on S3 one PUT (an object is replaced atomically).

    Example:
        >>> path = join(tempfile.mkdtemp(), "sub", "x.bin"); write_atomic(path, b"1"); read_bytes(path)
        b'1'
    """
    if is_remote(location):
        fs, inner = filesystem(location)
        with fs.open_output_stream(inner) as stream:
            stream.write(data)
        return
    path = Path(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with partial.open("wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


def delete(location: str | Path) -> None:
    """Remove the file at ``location`` (nothing when there is none).

    Example:
        >>> path = join(tempfile.mkdtemp(), "x"); write_atomic(path, b""); delete(path); exists(path)
        False
    """
    fs, inner = filesystem(location)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(inner)


def size(location: str | Path) -> int:
    """Bytes of every file under ``location`` (0 when nothing is there).

    Example:
        >>> root = tempfile.mkdtemp(); write_atomic(join(root, "a", "b"), b"123"); size(root)
        3
    """
    fs, inner = filesystem(location)
    infos = fs.get_file_info(pafs.FileSelector(inner, recursive=True, allow_not_found=True))
    return sum(info.size or 0 for info in infos if info.type == pafs.FileType.File)


def make_dirs(location: str | Path) -> None:
    """Create the directory ``location`` and its parents (nothing to do on S3, where prefixes are implied).

    Example:
        >>> root = join(tempfile.mkdtemp(), "a", "b"); make_dirs(root); is_dir(root)
        True
    """
    if not is_remote(location):
        Path(location).mkdir(parents=True, exist_ok=True)


def ensure_writable(location: str | Path, setting: str) -> None:
    """Prove ``location`` writable before anything starts, or raise one :class:`ConfigError` naming
    ``setting``: a local directory as :func:`core.localfs.writable_directory` does; on S3 a small object is
    written and removed (a missing bucket, bad credentials or an unreachable endpoint fail here).

    Example:
        >>> blocker = Path(tempfile.mkdtemp()) / "a-file"; _ = blocker.write_text("")
        >>> try:
        ...     ensure_writable(blocker / "lh", "lakehouse_root")
        ... except ConfigError as err:
        ...     print(str(err).split(":")[0])
        lakehouse_root (BKAUDIT_LAKEHOUSE_ROOT) is not a writable directory
    """
    if not is_remote(location):
        writable_directory(Path(location), setting)
        return
    variable = "BKAUDIT_" + setting.upper().replace(".", "__")
    try:
        probe = join(location, f"_bkaudit_probe_{uuid.uuid4().hex}")
        write_atomic(probe, b"")
        delete(probe)
    except (OSError, pa.ArrowException) as err:
        detail = " ".join(str(err).split())[:300]
        raise ConfigError(f"{setting} ({variable}) is not writable: {location}: {detail}") from None


def configure_from(settings: Settings, environ: dict[str, str] | None = None) -> None:
    """:func:`configure` with the ``object_store`` settings (every process that reads or writes the
    lakehouse calls it first).

    Example:
        >>> from core.settings import Settings
        >>> configure_from(Settings())  # nothing configured: the environment is left as it is
    """
    store = settings.object_store
    configure(
        endpoint_url=store.endpoint_url,
        region=store.region if store.lakehouse_url or store.endpoint_url else None,
        access_key_id=store.access_key_id,
        secret_access_key=store.secret_access_key.get_secret_value() if store.secret_access_key else None,
        session_token=store.session_token.get_secret_value() if store.session_token else None,
        allow_http=store.allow_http,
        environ=environ,
    )


def list_files(location: str | Path, *, recursive: bool = False) -> list[str]:
    """The files under ``location`` as paths relative to it (``/``-separated), sorted; empty when there
    is nothing.

    Example:
        >>> root = tempfile.mkdtemp()
        >>> write_atomic(join(root, "d", "x"), b""); write_atomic(join(root, "y"), b"")
        >>> list_files(root), list_files(root, recursive=True)
        (['y'], ['d/x', 'y'])
    """
    fs, inner = filesystem(location)
    try:
        infos = fs.get_file_info(pafs.FileSelector(inner, recursive=recursive, allow_not_found=True))
    except NotADirectoryError:
        return []
    prefix = inner.rstrip("/") + "/"
    return sorted(info.path.removeprefix(prefix) for info in infos if info.type == pafs.FileType.File)


def local_scratch(root: str | Path, name: str) -> Path:
    """A local directory for files that must be on this host's disk (memory-mapped, handed to a child
    process) beside the lakehouse ``root``: ``<root>/<name>`` for a local root, else a folder of the
    system's temporary directory named after the URL. Created if needed.

    Example:
        >>> root = tempfile.mkdtemp(); local_scratch(root, "_fold") == Path(root, "_fold")
        True
        >>> local_scratch("s3://b/lh", "_fold").parent == Path(tempfile.gettempdir())
        True
    """
    if is_remote(root):
        digest = hashlib.sha256(str(root).encode()).hexdigest()[:16]
        place = Path(tempfile.gettempdir()) / f"bkaudit{name}-{digest}"
    else:
        place = Path(root) / name
    place.mkdir(parents=True, exist_ok=True)
    return place


def modified_s(location: str | Path) -> float:
    """When the file at ``location`` was last written, in epoch seconds (S3: the object's LastModified).

    Example:
        >>> path = join(tempfile.mkdtemp(), "x"); write_atomic(path, b""); modified_s(path) > 1.7e9
        True
    """
    fs, inner = filesystem(location)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound or info.mtime is None:
        raise FileNotFoundError(str(location))
    return float(info.mtime.timestamp())
