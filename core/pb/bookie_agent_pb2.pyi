from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListEntriesRequest(_message.Message):
    __slots__ = ("ledger_ids",)
    LEDGER_IDS_FIELD_NUMBER: _ClassVar[int]
    ledger_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ledger_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class LedgerEntries(_message.Message):
    __slots__ = ("ledger_id", "holding", "first", "last", "fenced")
    class Holding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        HOLDING_UNSPECIFIED: _ClassVar[LedgerEntries.Holding]
        HOLDS: _ClassVar[LedgerEntries.Holding]
        NO_LEDGER: _ClassVar[LedgerEntries.Holding]
        IN_LIMBO: _ClassVar[LedgerEntries.Holding]
    HOLDING_UNSPECIFIED: LedgerEntries.Holding
    HOLDS: LedgerEntries.Holding
    NO_LEDGER: LedgerEntries.Holding
    IN_LIMBO: LedgerEntries.Holding
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDING_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    holding: LedgerEntries.Holding
    first: _containers.RepeatedScalarFieldContainer[int]
    last: _containers.RepeatedScalarFieldContainer[int]
    fenced: bool
    def __init__(self, ledger_id: _Optional[int] = ..., holding: _Optional[_Union[LedgerEntries.Holding, str]] = ..., first: _Optional[_Iterable[int]] = ..., last: _Optional[_Iterable[int]] = ..., fenced: _Optional[bool] = ...) -> None: ...

class ListEntriesResponse(_message.Message):
    __slots__ = ("ledgers",)
    LEDGERS_FIELD_NUMBER: _ClassVar[int]
    ledgers: _containers.RepeatedCompositeFieldContainer[LedgerEntries]
    def __init__(self, ledgers: _Optional[_Iterable[_Union[LedgerEntries, _Mapping]]] = ...) -> None: ...

class ListLedgersRequest(_message.Message):
    __slots__ = ("after_ledger_id", "limit")
    AFTER_LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    after_ledger_id: int
    limit: int
    def __init__(self, after_ledger_id: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListLedgersResponse(_message.Message):
    __slots__ = ("ledger_ids", "more")
    LEDGER_IDS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    ledger_ids: _containers.RepeatedScalarFieldContainer[int]
    more: bool
    def __init__(self, ledger_ids: _Optional[_Iterable[int]] = ..., more: _Optional[bool] = ...) -> None: ...
