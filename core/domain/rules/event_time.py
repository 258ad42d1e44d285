"""Event time bounded against the receiving clock, so one event dated in the future cannot stop the audit.

Spark's watermark only moves forward. A single event dated 2100 (a watcher whose clock jumped, a record
written by hand) would move it to 2100 for good, and every later event would be dropped as late. An event
dated more than the allowed skew ahead of the receiving clock is therefore rejected before the watermark
sees it (the job makes it a dead letter with :func:`future_event_reason` as its reason).

The receiving clock is the earlier of the Kafka record's timestamp and the micro-batch's timestamp
(:func:`receiving_clock_ms`). Both are fixed for a given record and batch (Spark keeps the batch timestamp
in its offset log and reuses it when it replays the batch), so a replay decides exactly as the first run
did. Neither is enough alone: the record timestamp is the producer's clock under ``CreateTime`` (a watcher
whose clock jumps stamps its records with the same wrong time), and the batch timestamp alone would accept
a record that was in the future when it was written once a later replay runs long enough after it.

Example:
    >>> received = receiving_clock_ms(kafka_ms=1_700_000_000_000, batch_ms=1_700_000_005_000)
    >>> future_event_reason(1_700_000_100_000, received, max_skew_s=300) is None
    True
    >>> future_event_reason(4_102_444_800_000, received, max_skew_s=300).split(" (")[0]
    'event time 2100-01-01T00:00:00Z is more than 300 s ahead of the receiving clock 2023-11-14T22:13:20Z'
"""

from __future__ import annotations

from datetime import UTC, datetime


def receiving_clock_ms(kafka_ms: int | None, batch_ms: int | None) -> int | None:
    """When the job received a record: the earlier of its Kafka timestamp and the batch timestamp.

    A missing or negative (Kafka's "no timestamp", -1) value is ignored; ``None`` when neither is known.

    Example:
        >>> receiving_clock_ms(5_000, 9_000), receiving_clock_ms(-1, 9_000), receiving_clock_ms(None, None)
        (5000, 9000, None)
    """
    known = [ms for ms in (kafka_ms, batch_ms) if ms is not None and ms >= 0]
    return min(known) if known else None


def format_utc(ms: int) -> str:
    """Epoch milliseconds as RFC 3339 UTC, with milliseconds only when there are some.

    Example:
        >>> format_utc(4_102_444_800_000), format_utc(1_700_000_000_123)
        ('2100-01-01T00:00:00Z', '2023-11-14T22:13:20.123Z')
    """
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if ms % 1000:
        text += f".{ms % 1000:03d}"
    return text + "Z"


def future_event_reason(event_time_ms: int, received_ms: int | None, max_skew_s: float) -> str | None:
    """Why an event is too far in the future to be admitted, or ``None`` when it is not.

    An event dated exactly ``max_skew_s`` ahead is admitted; with no receiving clock nothing is rejected.

    Example:
        >>> future_event_reason(301_000, 0, max_skew_s=300)[:56]
        'event time 1970-01-01T00:05:01Z is more than 300 s ahead'
        >>> future_event_reason(300_000, 0, max_skew_s=300) is None
        True
    """
    if received_ms is None or event_time_ms - received_ms <= max_skew_s * 1000:
        return None
    return (
        f"event time {format_utc(event_time_ms)} is more than {max_skew_s:g} s ahead of the receiving "
        f"clock {format_utc(received_ms)} (the earlier of the Kafka record time and the batch time)"
    )
