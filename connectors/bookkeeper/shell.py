"""BookKeeper's own shell (``org.apache.bookkeeper.bookie.BookieShell``), run and parsed.

The commands print through their loggers; a log4j2 configuration sends those lines, bare, to stdout and
everything else (WARN and above) to stderr. The parsers turn ``listbookies`` and ``ledgermetadata`` output
into plain data to compare with bkaudit's.

Example:
    >>> parse_listbookies("ReadWrite Bookies :\\nBookieID:127.0.0.2:4000, IP:127.0.0.2, Port:4000, H:h")
    {'ReadWrite': ['127.0.0.2:4000']}
"""

from __future__ import annotations

import base64
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connectors.bookkeeper.bookie import JVM_OPENS, java_binary, render_conf
from core.errors import ServiceError

SHELL_CLASS = "org.apache.bookkeeper.bookie.BookieShell"

_SHELL_LOG4J2 = """\
status = error
appender.out.type = Console
appender.out.name = Out
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = %m%n
appender.err.type = Console
appender.err.name = Err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %-5p %c{1}: %m%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = Err
logger.cmd.name = org.apache.bookkeeper.tools.cli.commands
logger.cmd.level = INFO
logger.cmd.additivity = false
logger.cmd.appenderRef.out.ref = Out
logger.shell.name = org.apache.bookkeeper.bookie.BookieShell
logger.shell.level = INFO
logger.shell.additivity = false
logger.shell.appenderRef.out.ref = Out
"""

_BOOKIE_LINE = re.compile(r"^BookieID:(\S+?), IP:")
_METADATA = re.compile(r"^LedgerMetadata\{(.*)\}$")
_PASSWORD = re.compile(r"password=[^,}\s]*")


def parse_listbookies(output: str) -> dict[str, list[str]]:
    """``listbookies`` output → ``{"ReadWrite"|"Readonly"|"All": [bookie ids]}`` (sections that printed).

    Example:
        >>> parse_listbookies("Readonly Bookies :\\nBookieID:b1:1, IP:b1, Port:1, Hostname:b1")
        {'Readonly': ['b1:1']}
    """
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output.splitlines():
        line = line.strip()
        if line.endswith("Bookies :"):
            current = sections.setdefault(line.split()[0], [])
        elif (match := _BOOKIE_LINE.match(line)) and current is not None:
            current.append(match.group(1))
    return sections


def _split_top(text: str) -> list[str]:
    """Split ``a=1, b={x=[1, 2]}`` at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for position, char in enumerate(text):
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:position].strip())
            start = position + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def parse_ledger_metadata(output: str) -> dict[str, Any]:
    """``ledgermetadata -l ID`` output → a dict (ensembles as ``{first_entry: [ids]}``, custom metadata as
    bytes, the password dropped).

    Example:
        >>> text = ("ledgerID: 7\\nLedgerMetadata{formatVersion=3, ensembleSize=2, writeQuorumSize=2, "
        ...         "ackQuorumSize=1, state=OPEN, digestType=CRC32C, password=base64:eA==, "
        ...         "ensembles={0=[b1:1, b2:2]}, customMetadata={application=base64:cHVsc2Fy}}")
        >>> meta = parse_ledger_metadata(text)
        >>> meta["ledger_id"], meta["state"], meta["ensembles"], meta["custom_metadata"]
        (7, 'OPEN', {0: ['b1:1', 'b2:2']}, {'application': b'pulsar'})
    """
    try:
        result = _metadata_lines(output)
    except (ValueError, IndexError) as err:  # a bad number or bad base64: output we do not understand
        reason = type(err).__name__
        shown = _shown(output)
        raise ServiceError(f"ledgermetadata printed what bkaudit cannot read ({reason}): {shown}") from None
    if "state" not in result:
        raise ServiceError(f"ledgermetadata printed no metadata: {_shown(output)}")
    return result


def _shown(output: str) -> str:
    """The start of the shell's output for an error line, with the ledger password (which it prints) cut."""
    return repr(_PASSWORD.sub("password=<redacted>", output.strip())[:300])


def _metadata_lines(output: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("ledgerID:"):
            result["ledger_id"] = int(line.split(":", 1)[1])
        elif match := _METADATA.match(line):
            result.update(_metadata_fields(match.group(1)))
    return result


def _metadata_fields(body: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for part in _split_top(body):
        key, _, value = part.partition("=")
        if key == "password":
            continue
        if key == "ensembles":
            fields["ensembles"] = {
                int(first): [bookie.strip() for bookie in bookies.split(",") if bookie.strip()]
                for first, bookies in re.findall(r"(\d+)=\[([^\]]*)\]", value)
            }
        elif key == "customMetadata":
            items = _split_top(value.strip()[1:-1])
            fields["custom_metadata"] = {
                name: base64.b64decode(encoded, validate=True)
                for name, _, encoded in (item.partition("=base64:") for item in items)
            }
        else:
            fields[_snake(key)] = int(value) if re.fullmatch(r"-?\d+", value) else value
    return fields


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda match: "_" + match.group(1).lower(), name)


@dataclass
class BookKeeperShell:
    """Runs ``BookieShell`` commands against one cluster (``service_uri``) with a deadline.

    Example:
        >>> BookKeeperShell(Path("/tmp/s"), "zk+hierarchical://127.0.0.1:1/ledgers", "").conf_file.name
        'shell.conf'
    """

    state_dir: Path
    service_uri: str
    classpath: str
    java_bin: str = "java"
    timeout: float = 60.0
    #: More JVM options (ZooKeeper's client TLS on a secured cluster).
    jvm_options: tuple[str, ...] = ()

    @property
    def conf_file(self) -> Path:
        return Path(self.state_dir) / "shell.conf"

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``BookieShell -conf shell.conf ARGS``; a non-zero exit (with ``check``) is a ServiceError."""
        state = Path(self.state_dir)
        state.mkdir(parents=True, exist_ok=True)
        self.conf_file.write_text(render_conf({"metadataServiceUri": self.service_uri, "zkTimeout": 10000}))
        log4j = state / "shell-log4j2.properties"
        log4j.write_text(_SHELL_LOG4J2)
        argv = [
            java_binary(self.java_bin),
            "-Xmx128m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            *JVM_OPENS,
            *self.jvm_options,
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            self.classpath,
            SHELL_CLASS,
            "-conf",
            str(self.conf_file),
            *args,
        ]
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise ServiceError(
                f"bookkeeper shell {' '.join(args)}: no answer in {self.timeout:.0f} s"
            ) from None
        if check and done.returncode != 0:
            problem = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
            raise ServiceError(f"bookkeeper shell {' '.join(args)}: exit {done.returncode}: {problem[0]}")
        return done

    def list_bookies(self, *, read_only: bool = False) -> list[str]:
        """``listbookies -rw`` (or ``-ro``): the bookie ids BookKeeper lists, sorted."""
        done = self.run("listbookies", "-ro" if read_only else "-rw", check=False)
        sections = parse_listbookies(done.stdout)
        return sorted(sections.get("Readonly" if read_only else "ReadWrite", []))

    def ledger_metadata(self, ledger_id: int) -> dict[str, Any]:
        """``ledgermetadata -l ID``, parsed (see :func:`parse_ledger_metadata`)."""
        return parse_ledger_metadata(self.run("ledgermetadata", "-l", str(ledger_id)).stdout)

    def init_new_cluster(self) -> None:
        """``initnewcluster``: creates the ledgers root, ``available``, ``readonly``, ``INSTANCEID`` and
        ``LAYOUT`` (the root's parent must exist)."""
        self.run("initnewcluster")
