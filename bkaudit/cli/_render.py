"""Arrow tables as command output: aligned text for terminals, one JSON array, or CSV with a header.

Values print the same way in every format: timestamps as RFC 3339 UTC with milliseconds (as in the alert
stream), dates as ``YYYY-MM-DD``. Lists are JSON in CSV and comma-joined in the text table, where long cells
are cut at :data:`MAX_CELL` characters (``…``); JSON and CSV are never cut.

Example:
    >>> import io, pyarrow as pa
    >>> out = io.StringIO()
    >>> render(pa.table({"ledger_id": [7, 12], "bookies": [["b1", "b2"], []]}), "table", out)
    >>> print(out.getvalue(), end="")
    ledger_id  bookies
    ---------  -------
            7  b1,b2
           12
"""

from __future__ import annotations

import base64
import csv
import json
import re
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import IO, Any

import pyarrow as pa

from connectors.delta.queries import naive_utc

FORMATS = ("table", "json", "csv")
MAX_CELL = 60


def plain(value: Any) -> Any:
    """A JSON-ready value: timestamps as RFC 3339 UTC (milliseconds), dates ISO, bytes base64.

    Example:
        >>> plain(datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=UTC))
        '2024-05-01T12:00:00.250Z'
        >>> plain({"a": [date(2024, 5, 1)]})
        {'a': ['2024-05-01']}
    """
    if isinstance(value, datetime):
        moment = value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _rfc3339(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"  # naive UTC here


def _nested(kind: pa.DataType) -> bool:
    return pa.types.is_nested(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def _json_cell(kind: pa.DataType) -> Callable[[Any], Any]:
    if pa.types.is_timestamp(kind):
        return lambda v: None if v is None else _rfc3339(v)
    if pa.types.is_date(kind) or _nested(kind):
        return plain
    return lambda v: v


def _csv_cell(kind: pa.DataType) -> Callable[[Any], str]:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return lambda v: "" if v is None else v
    if pa.types.is_boolean(kind):
        return lambda v: "" if v is None else ("true" if v else "false")
    if pa.types.is_timestamp(kind):
        return lambda v: "" if v is None else _rfc3339(v)
    if _nested(kind) or pa.types.is_date(kind):
        return lambda v: "" if v is None else _csv_text(plain(v))
    return lambda v: "" if v is None else str(v)


def _csv_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _text_cell(value: Any) -> str:
    value = plain(value)
    if value is None:
        text = ""
    elif isinstance(value, list):
        text = ",".join(_text_cell(v) for v in value)
    elif isinstance(value, dict):
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    elif isinstance(value, bool):
        text = "true" if value else "false"
    else:
        text = str(value)
    return _fit(text)


def _fit(text: str) -> str:
    text = " ".join(text.split()) if any(c in text for c in "\n\r\t") else text  # one line per row
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _table_cell(kind: pa.DataType) -> Callable[[Any], str]:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return lambda v: "" if v is None else _fit(v)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return lambda v: "" if v is None else str(v)
    if pa.types.is_timestamp(kind):
        return lambda v: "" if v is None else _rfc3339(v)
    return _text_cell


def _numeric(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


#: Keys of an alert's ``detail`` whose values are epoch milliseconds (the alert stream keeps them so).
_TIME_KEY = re.compile(r"(^|_)(since|ctime|time|at)(_ms)?$")
_EPOCH_MS = range(10**11, 10**14)  # 1973 .. 5138: a number there under a time key is a time


def _readable_detail(text: str | None) -> str | None:
    """A ``detail`` JSON text with its epoch-millisecond times as RFC 3339 (for people; nested too).

    Example:
        >>> _readable_detail('{"missing_since": 1795683373768, "rounds": 2}')
        '{"missing_since": "2026-11-26T08:56:13.768Z", "rounds": 2}'
    """
    if not text:
        return text
    try:
        document = json.loads(text)
    except ValueError:
        return text

    def convert(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: convert(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [convert(v, key) for v in value]
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and value in _EPOCH_MS
            and _TIME_KEY.search(key)
        ):
            return plain(datetime.fromtimestamp(value / 1000, UTC))
        return value

    return json.dumps(convert(document), ensure_ascii=False)


def readable_times(table: pa.Table) -> pa.Table:
    """``table`` with the epoch-millisecond times inside its ``detail`` column as RFC 3339 (the table view;
    JSON and CSV keep the values as the alert stream has them).

    Example:
        >>> readable_times(pa.table({"detail": ['{"missing_since": 0}']})).column("detail").to_pylist()
        ['{"missing_since": 0}']
    """
    if "detail" not in table.column_names or not pa.types.is_string(table.schema.field("detail").type):
        return table
    details = [_readable_detail(value) for value in table.column("detail").to_pylist()]
    return table.set_column(table.column_names.index("detail"), "detail", pa.array(details, pa.string()))


def write_aligned(names: list[str], cells: list[list[str]], right: list[bool], out: IO[str]) -> None:
    """Rows of text cells under a header and a rule, columns padded (``right``: right-aligned).

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> write_aligned(["bookie", "ledgers"], [["b1", "7"]], [False, True], out)
        >>> print(out.getvalue(), end="")
        bookie  ledgers
        ------  -------
        b1            7
    """
    widths = [max([len(name), *(len(line[i]) for line in cells)]) for i, name in enumerate(names)]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)]
        return "  ".join(parts).rstrip()

    out.write(line(names) + "\n")
    out.write(line(["-" * w for w in widths]) + "\n")
    for values in cells:
        out.write(line(values) + "\n")
    if not cells:
        out.write("(no rows)\n")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_row(value: Any) -> bool:
    return isinstance(value, dict) and not any(isinstance(v, dict) for v in value.values())


def _rows_table(rows: list[dict[str, Any]], out: IO[str]) -> None:
    names = list(dict.fromkeys(key for row in rows for key in row))
    cells = [[_text_cell(row.get(name)) for name in names] for row in rows]
    right = [all(_number(row.get(name)) or row.get(name) is None for row in rows) for name in names]
    write_aligned(names, cells, right, out)


def render_document(document: dict[str, Any], out: IO[str]) -> None:
    """A state report (a JSON object) for people: its plain values as ``key: value`` lines, and each list of
    objects, or object of objects, as a table under its key.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> services = {"kafka": {"running": True, "pid": 7}, "zookeeper": {"running": False, "pid": None}}
        >>> render_document({**services, "state_dir": "/tmp/s"}, out)
        >>> print(out.getvalue(), end="")
        name       running  pid
        ---------  -------  ---
        kafka      true       7
        zookeeper  false
        state_dir: /tmp/s
    """
    grouped = {key: value for key, value in document.items() if value and _is_row(value)}
    if grouped:
        rows = [{"name": name, **values} for name, values in grouped.items()]
        _rows_table(rows, out)
    for key, value in document.items():
        if key in grouped:
            continue
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            out.write(f"{key}:\n")
            _rows_table(value, out)
        else:
            out.write(f"{key}: {_text_cell(value) if value not in (None, [], {}) else '-'}\n")
    out.flush()


def render(table: pa.Table, fmt: str, out: IO[str]) -> None:
    """Write ``table`` to ``out`` as ``table`` (aligned text), ``json`` (one array) or ``csv``.

    Example:
        >>> import io, pyarrow as pa
        >>> out = io.StringIO()
        >>> render(pa.table({"kind": ["BOOKIE_LOST"], "alerts": [1]}), "json", out)
        >>> out.getvalue()
        '[{"kind": "BOOKIE_LOST", "alerts": 1}]\\n'
    """
    table = naive_utc(table)
    names, kinds = table.column_names, [field.type for field in table.schema]
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    if fmt == "json":
        converted = [list(map(_json_cell(kind), values)) for kind, values in zip(kinds, columns, strict=True)]
        rows = [dict(zip(names, values, strict=True)) for values in zip(*converted, strict=True)]
        out.write(json.dumps(rows, ensure_ascii=False) + "\n")
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        converted = [list(map(_csv_cell(kind), values)) for kind, values in zip(kinds, columns, strict=True)]
        writer.writerows(zip(*converted, strict=True))
    elif fmt == "table":
        converted = [
            list(map(_table_cell(kind), values)) for kind, values in zip(kinds, columns, strict=True)
        ]
        cells = [list(row) for row in zip(*converted, strict=True)]
        write_aligned(list(names), cells, [_numeric(kind) for kind in kinds], out)
    else:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    out.flush()
