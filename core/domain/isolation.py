"""Pulsar's bookie isolation config in a ledger's custom metadata: which affinity groups may hold it.

A namespace with a bookie-affinity isolation policy makes Pulsar's managed ledger put the custom metadata
key ``EnsemblePlacementPolicyConfig`` on every ledger it creates. The value is the UTF-8 JSON Pulsar's
``EnsemblePlacementPolicyConfig.encode`` writes (Jackson, pretty-printed): the policy class by name and its
properties, here the primary groups (``isolationBookieGroups``) and the secondary ones
(``secondaryIsolationBookieGroups``), each one comma-separated string::

    {
      "policyClass" : "org.apache.pulsar.bookie.rackawareness.IsolatedBookieEnsemblePlacementPolicy",
      "properties" : {
        "isolationBookieGroups" : "orders",
        "secondaryIsolationBookieGroups" : "shared"
      }
    }

Read as Pulsar reads it (``IsolatedBookieEnsemblePlacementPolicy.getIsolationGroup``): bytes that are not
UTF-8 are replaced (Java's ``new String``), fields other than these are ignored, a property that is a list
is joined with commas, a missing or null property is no group, and the groups are Java's
``String.split(",")`` of the string (no trimming; trailing empty names dropped). A config of another policy
class is no isolation config. Anything else that does not decode raises :class:`~core.errors.FormatError`.

Example:
    >>> value = encode_isolation_config(IsolationGroups(("orders",), ("shared",)))
    >>> decode_isolation_config(value)
    IsolationGroups(primary=('orders',), secondary=('shared',))
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from core.errors import FormatError

#: The custom-metadata key (``EnsemblePlacementPolicyConfig.ENSEMBLE_PLACEMENT_POLICY_CONFIG``).
ISOLATION_METADATA_KEY = "EnsemblePlacementPolicyConfig"
#: The policy class whose properties name affinity groups.
ISOLATED_POLICY_CLASS = "org.apache.pulsar.bookie.rackawareness.IsolatedBookieEnsemblePlacementPolicy"
PRIMARY_GROUPS_PROPERTY = "isolationBookieGroups"
SECONDARY_GROUPS_PROPERTY = "secondaryIsolationBookieGroups"


@dataclass(frozen=True)
class IsolationGroups:
    """A ledger's affinity groups: ``primary`` first, ``secondary`` only when the primary lack bookies.

    Example:
        >>> IsolationGroups(("a", "b")).names()
        'a,b'
    """

    primary: tuple[str, ...]
    secondary: tuple[str, ...] = ()

    def names(self) -> str:
        """The primary groups as Pulsar's property holds them (comma-separated).

        Example:
            >>> IsolationGroups(("x",), ("y",)).names()
            'x'
        """
        return ",".join(self.primary)


def _java_split(text: str) -> tuple[str, ...]:
    """``text.split(",")`` as Java does it: trailing empty strings dropped; ``""`` is no group.

    Example:
        >>> _java_split("a,,b,,"), _java_split(""), _java_split(" a")
        (('a', '', 'b'), (), (' a',))
    """
    parts = text.split(",")
    while parts and parts[-1] == "":
        parts.pop()
    return tuple(parts)


def _as_string(value: Any, name: str) -> str:
    """Pulsar's ``castToString`` of a property: null → empty, a list joined with commas, else its text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if not all(isinstance(item, str) for item in value):
            raise FormatError(f"isolation config: {name} lists a value that is not a string")
        return ",".join(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise FormatError(f"isolation config: {name} must be a string or a list, got {type(value).__name__}")


def decode_isolation_config(value: bytes) -> IsolationGroups | None:
    """The groups of an ``EnsemblePlacementPolicyConfig`` value; None for another policy class.

    Example:
        >>> raw = b'{"policyClass": "x.Other", "properties": {}}'
        >>> decode_isolation_config(raw) is None
        True
        >>> decode_isolation_config(b"[]")
        Traceback (most recent call last):
        ...
        core.errors.FormatError: isolation config: must be a JSON object, got list
    """
    text = bytes(value).decode("utf-8", errors="replace")
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as err:
        reason = err.msg if isinstance(err, json.JSONDecodeError) else type(err).__name__
        raise FormatError(f"isolation config: not JSON ({reason})") from None
    if not isinstance(document, dict):
        raise FormatError(f"isolation config: must be a JSON object, got {type(document).__name__}")
    policy_class = document.get("policyClass")
    if not isinstance(policy_class, str):
        raise FormatError("isolation config: policyClass must be a class name")
    if policy_class != ISOLATED_POLICY_CLASS:
        return None
    properties = document.get("properties", {})
    if not isinstance(properties, dict):
        raise FormatError("isolation config: properties must be a JSON object")
    primary = _as_string(properties.get(PRIMARY_GROUPS_PROPERTY), PRIMARY_GROUPS_PROPERTY)
    secondary = _as_string(properties.get(SECONDARY_GROUPS_PROPERTY), SECONDARY_GROUPS_PROPERTY)
    return IsolationGroups(_java_split(primary), _java_split(secondary))


def encode_isolation_config(groups: IsolationGroups) -> bytes:
    """The value Pulsar writes for ``groups`` (Jackson's default pretty printer).

    Example:
        >>> encode_isolation_config(IsolationGroups(("g",))).decode().splitlines()[-3:]
        ['    "isolationBookieGroups" : "g"', '  }', '}']
    """
    properties = {PRIMARY_GROUPS_PROPERTY: ",".join(groups.primary)}
    if groups.secondary:
        properties[SECONDARY_GROUPS_PROPERTY] = ",".join(groups.secondary)
    document = {"policyClass": ISOLATED_POLICY_CLASS, "properties": properties}
    return json.dumps(document, indent=2, separators=(",", " : ")).encode("utf-8")


@dataclass(frozen=True)
class IsolationConfig:
    """What a ledger's custom metadata says about isolation: its ``groups`` (None: not isolated), or why
    its value does not decode (``error``; then it is not judged, as a bad ``pulsar/managed-ledger`` value
    is no topic).

    Example:
        >>> isolation_config_of([("EnsemblePlacementPolicyConfig", b"nope")]).error
        'isolation config: not JSON (Expecting value)'
    """

    groups: IsolationGroups | None = None
    error: str | None = None


def isolation_config_of(custom_metadata: Iterable[tuple[str, bytes]]) -> IsolationConfig:
    """The isolation config of a ledger's custom metadata pairs (the last value of the key wins, as
    BookKeeper reads custom metadata into a map).

    Example:
        >>> value = encode_isolation_config(IsolationGroups(("g1",)))
        >>> isolation_config_of([("application", b"pulsar"), (ISOLATION_METADATA_KEY, value)]).groups.primary
        ('g1',)
        >>> isolation_config_of([]) == IsolationConfig()
        True
    """
    found: bytes | None = None
    for key, value in custom_metadata:
        if key == ISOLATION_METADATA_KEY:
            found = value
    return IsolationConfig() if found is None else _decoded(bytes(found))


@functools.lru_cache(maxsize=1024)  # pure, and a cluster's ledgers share a handful of configs
def _decoded(value: bytes) -> IsolationConfig:
    try:
        return IsolationConfig(decode_isolation_config(value))
    except FormatError as err:
        return IsolationConfig(error=str(err))
