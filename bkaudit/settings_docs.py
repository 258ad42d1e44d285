"""The configuration reference (``docs/configuration.md``), generated from the :class:`Settings` model.

Every setting appears with its config-file key, its environment variable, its type and constraints, its
default and its meaning, so the reference cannot drift from the code: a unit test fails when the committed
file differs from what this module renders.

    python -m bkaudit.settings_docs              # rewrite docs/configuration.md
    python -m bkaudit.settings_docs --check      # exit 1 when docs/configuration.md is stale
    python -m bkaudit.settings_docs --effective  # the settings this environment yields, JSON, secrets masked

Example:
    >>> rows = {row.key: row for row in setting_docs()}
    >>> rows["kafka.sasl_password"].env_var, rows["kafka.sasl_password"].default
    ('BKAUDIT_KAFKA__SASL_PASSWORD', 'unset (secret)')
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from bkaudit.settings import CONFIG_FILE_ENV, Settings

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
MASK = "**********"

# Meanings for fields whose ``Field`` has no ``description`` yet. They live here rather than in settings.py
# because that file was being edited by other work when the reference was introduced; moving a text into the
# model's ``description`` is always fine (the model wins), and the test fails for a field documented nowhere.
FALLBACK_DESCRIPTIONS: dict[str, str] = {
    "lakehouse_root": "root directory of the Delta tables (a local or mounted path; see infra/README.md)",
    "checkpoint_root": "Structured Streaming checkpoints; the query's is `<checkpoint_root>/<stream.app_id>`",
    "zookeeper.session_timeout_s": "ZooKeeper session timeout; also the connect wait at start "
    "unless connect_timeout_s is set (at least 10 s)",
    "zookeeper.auth_scheme": "`digest` (username/password), `sasl` (DIGEST-MD5, or GSSAPI without a "
    "username), or none",
    "zookeeper.auth_username": "user of the digest or SASL DIGEST-MD5 authentication",
    "zookeeper.auth_password": "password of the digest or SASL DIGEST-MD5 authentication",
    "kafka.bootstrap_servers": "comma-separated host:port list",
    "kafka.changes_topic": "the watcher's change events (protobuf), read by the job",
    "kafka.alerts_topic": "alert transitions (JSON, interfaces §2)",
    "kafka.feedback_topic": "the job's re-probe results, read back by the job",
    "kafka.security_protocol": "Kafka security protocol of every client",
    "kafka.sasl_mechanism": "SASL mechanism when the protocol is SASL_*",
    "kafka.sasl_username": "SASL user",
    "kafka.sasl_password": "SASL password",
    "kafka.ssl_cafile": "CA bundle to verify the brokers (must exist on every host that runs a client)",
    "kafka.ssl_certfile": "client certificate (mutual TLS)",
    "kafka.ssl_keyfile": "client private key (mutual TLS)",
    "kafka.ssl_password": "password of the client private key",
    "kafka.client_id": "client id the brokers see (quotas, logs)",
    "kafka.request_timeout_ms": "Kafka request timeout",
    "kafka.producer_acks": "producer acks; `all` is what makes a published change durable",
    "kafka.producer_batch_size": "producer batch bytes, librdkafka's `batch.size` (256 KiB: 31 k alerts "
    "produced and acked in ~0.06 s on the embedded broker); 0 = one record per batch (slow; not needed "
    "with single_record_tails)",
    "kafka.producer_linger_ms": "how long the producer waits to fill a batch",
    "kafka.producer_retries": "producer retries (endless by default: a change is never dropped)",
    "kafka.consumer_session_timeout_ms": "consumer group session timeout (short: fast joins on the embedded "
    "broker)",
    "kafka.consumer_heartbeat_interval_ms": "consumer group heartbeat interval",
    "kafka.consumer_max_poll_interval_ms": "consumer max poll interval",
    "kafka.producer_delivery_timeout_ms": "after this, an unacknowledged record counts as failed (the "
    "watcher then republishes a FULL snapshot)",
    "spark.master": "Spark master; under spark-submit set it to the same value as --master",
    "spark.app_name": "Spark application name",
    "spark.ui_enabled": "the Spark UI (port 4040 and up)",
    "spark.shuffle_partitions": "spark.sql.shuffle.partitions; a stateful query keeps the value of its "
    "first start (the checkpoint wins)",
    "spark.driver_memory": "spark.driver.memory; under spark-submit use --driver-memory instead (the JVM is "
    "already running)",
    "spark.num_recent_progress_updates": "progress updates Spark keeps (the metrics listener reads them)",
    "stream.trigger_interval_s": "micro-batch interval (processing time)",
    "stream.max_offsets_per_trigger": "cap on records per micro-batch; bounds batches during a START "
    "snapshot catch-up (unset = everything available)",
    "stream.reprobe_max_delay_s": "upper bound of the doubling re-probe delay",
    "stream.placement_policy": "placement policy to check closed ledgers against",
    "stream.min_racks_per_write_quorum": "rack-aware: racks each write quorum must span "
    "(BookKeeper's minNumRacksPerWriteQuorum)",
    "stream.enforce_min_racks_per_write_quorum": "rack-aware: a write set in the default rack fails "
    "(enforceMinNumRacksPerWriteQuorum)",
    "stream.min_zones_per_write_quorum": "zone-aware: minNumZonesPerWriteQuorum",
    "stream.desired_zones_per_write_quorum": "zone-aware: desiredNumZonesPerWriteQuorum (fewer → MEETS_SOFT)",
    "stream.min_regions_for_durability": "region-aware: reppMinimumRegionsForDurability",
    "stream.probe_concurrency": "bookie probes in flight",
    "stream.scrutiny_max_per_batch": "most scrutiny probes one micro-batch runs",
}

# Which processes read a section (the reader of the reference wants to know where to set it).
SECTION_USERS: dict[str, str] = {
    "": "`cluster`: both processes; the roots: `bkaudit stream`.",
    "dev": "only `bkaudit dev`, `bkaudit demo` and the tests (the embedded services); ignored in production.",
    "zookeeper": "`bkaudit watch` (and `bkaudit sim`).",
    "kafka": "Both processes, and the Spark executors that read the changes topic.",
    "spark": "`bkaudit stream`.",
    "watcher": "`bkaudit watch`.",
    "stream": "`bkaudit stream`.",
}


@dataclass(frozen=True)
class SettingDoc:
    """One leaf setting as the reference shows it."""

    key: str  # config-file key, dotted: "kafka.sasl_password"
    env_var: str  # "BKAUDIT_KAFKA__SASL_PASSWORD"
    type_text: str
    default: str  # rendered for humans; secrets masked
    env_default: str | None  # the default as an environment variable value; None when unset
    description: str
    secret: bool


def _is_model(annotation: Any) -> bool:
    return inspect.isclass(annotation) and issubclass(annotation, BaseModel)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return " or ".join(_type_name(a) for a in members)
    if origin is dict:
        key, value = typing.get_args(annotation)
        return f"map of {_type_name(key)} to {_type_name(value)} (JSON in the environment)"
    if annotation is SecretStr:
        return "secret string"
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _constraints(field: FieldInfo) -> str:
    bounds = (
        (annotated_types.Ge, "ge", "≥"),
        (annotated_types.Gt, "gt", ">"),
        (annotated_types.Le, "le", "≤"),
        (annotated_types.Lt, "lt", "<"),
    )
    parts = []
    for item in field.metadata:
        for kind, attribute, symbol in bounds:
            if isinstance(item, kind):
                parts.append(f"{symbol} {_plain(getattr(item, attribute))}")
    return ", ".join(parts)


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _leaf(path: tuple[str, ...], field: FieldInfo) -> SettingDoc:
    key = ".".join(path)
    annotation = field.annotation
    secret = SecretStr in (annotation, *typing.get_args(annotation))
    default = field.get_default(call_default_factory=True)
    description = field.description or FALLBACK_DESCRIPTIONS.get(key, "")
    type_text = _type_name(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in typing.get_args(
        annotation
    ):
        type_text += ", optional"
    if constraints := _constraints(field):
        type_text += f" ({constraints})"
    if default is None:
        shown = "unset (secret)" if secret else "unset"
    else:
        shown = f"`{_plain(default)}`" if _plain(default) else '`""`'
    return SettingDoc(
        key=key,
        env_var="BKAUDIT_" + "__".join(part.upper() for part in path),
        type_text=type_text,
        default=shown,
        env_default=None if default is None or secret else _plain(default),
        description=description,
        secret=secret,
    )


def setting_docs(model: type[BaseModel] = Settings) -> list[SettingDoc]:
    """Every leaf setting of ``model`` (nested models flattened), in declaration order.

    Example:
        >>> [row.env_var for row in setting_docs()][:2]
        ['BKAUDIT_CLUSTER', 'BKAUDIT_LAKEHOUSE_ROOT']
    """
    rows: list[SettingDoc] = []

    def walk(current: type[BaseModel], prefix: tuple[str, ...]) -> None:
        for name, field in current.model_fields.items():
            if _is_model(field.annotation):
                walk(field.annotation, (*prefix, name))  # type: ignore[arg-type]
            else:
                rows.append(_leaf((*prefix, name), field))

    walk(model, ())
    return rows


def _sections(model: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    nested = [(name, f.annotation) for name, f in model.model_fields.items() if _is_model(f.annotation)]
    return [("", model), *nested]  # type: ignore[list-item]


def _summary(model: type[BaseModel]) -> str:
    """The first paragraph of a model's docstring, on one line."""
    doc = (inspect.getdoc(model) or "").replace("``", "`")  # reST literals in docstrings → Markdown
    return " ".join(doc.split("\n\n")[0].split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def configuration_markdown(model: type[BaseModel] = Settings) -> str:
    """The whole reference as Markdown: how settings are read, then one table per section.

    Example:
        >>> "| `stream.app_id` | `BKAUDIT_STREAM__APP_ID` |" in configuration_markdown()
        True
    """
    rows = setting_docs(model)
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m bkaudit.settings_docs` from `bkaudit/settings.py`; do not edit by",
        "     hand: tests/unit/test_settings_docs.py fails when this file is stale. -->",
        "",
        "Every bkaudit process reads the same settings, in this order of priority: keyword arguments "
        "(tests), `BKAUDIT_*` environment variables, the file named by "
        f"`{CONFIG_FILE_ENV}` (`.toml`, `.yaml`/`.yml` or `.json`), then the defaults below. "
        "Nested settings use `__` in environment variables (`BKAUDIT_KAFKA__BOOTSTRAP_SERVERS`) and a "
        "nested mapping in the file (`kafka: {bootstrap_servers: ...}`). Unknown top-level keys are an "
        "error.",
        "",
        f"Secrets (`secret string`) print as `{MASK}` in every log, `repr` and JSON dump; pass them as "
        "environment variables from a secret store rather than in the config file. "
        "`python -m bkaudit.settings_docs --effective` prints the settings the current environment yields, "
        "secrets masked.",
        "",
        f"{len(rows)} settings.",
        "",
    ]
    for name, section in _sections(model):
        title = "Top level" if not name else f"`{name}`"
        lines += [f"## {title}", "", _summary(section), ""]
        if SECTION_USERS.get(name):
            lines += [f"Read by: {SECTION_USERS[name]}", ""]
        lines += [
            "| Setting | Environment variable | Type | Default | Meaning |",
            "|---|---|---|---|---|",
        ]
        prefix = f"{name}." if name else ""
        for row in rows:
            inside = row.key.startswith(prefix) and "." not in row.key[len(prefix) :]
            if inside:
                lines.append(
                    f"| `{row.key}` | `{row.env_var}` | {_cell(row.type_text)} | {_cell(row.default)} "
                    f"| {_cell(row.description)} |"
                )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def effective_settings_json(settings: Settings) -> str:
    """``settings`` as indented JSON with every secret masked (what a process would run with).

    Example:
        >>> text = effective_settings_json(Settings(kafka={"sasl_password": "s3cret"}))
        >>> "s3cret" in text, json.loads(text)["kafka"]["sasl_password"]
        (False, '**********')
    """
    return json.dumps(settings.model_dump(mode="json"), indent=2, sort_keys=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or ``--check``) the reference, or print the ``--effective`` settings; returns the exit code.

    Example:
        >>> # python -m bkaudit.settings_docs --check   → 0 when docs/configuration.md is current
    """
    parser = argparse.ArgumentParser(
        prog="python -m bkaudit.settings_docs", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("path", nargs="?", type=Path, default=DOC_PATH, help="the reference file to write")
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale, write nothing")
    parser.add_argument("--effective", action="store_true", help="print the settings this environment yields")
    args = parser.parse_args(argv)
    if args.effective:
        from bkaudit.settings import load_settings

        print(effective_settings_json(load_settings()))
        return 0
    text = configuration_markdown()
    if args.check:
        current = args.path.read_text() if args.path.exists() else ""
        if current != text:
            print(f"{args.path} is stale: run `python -m bkaudit.settings_docs`", file=sys.stderr)
            return 1
        return 0
    args.path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
