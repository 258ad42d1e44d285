"""Talking to bookies over BookKeeper's v3 wire protocol, for probing. Three modules:

- :mod:`connectors.bookie.frames`: pure codec, length-prefixed protobuf frames, request/response builders and
  strict parsers (bad bytes raise :class:`~core.errors.FormatError`, nothing else);
- :mod:`connectors.bookie.client`: the asyncio :class:`~connectors.bookie.client.BookieClient` the streaming
  job uses to ask bookies for their entry lists (``GET_LIST_OF_ENTRIES_OF_LEDGER``) or single entries
  (``READ_ENTRY``), with typed results, plus blocking wrappers for Spark ``foreachBatch`` code;
- :mod:`connectors.bookie.server`: the simulator's bookie, serving an
  :class:`~connectors.bookie.server.EntryStore` with injectable faults (silent, slow, ENOLEDGER, error status,
  refusing connections).

Example:
    >>> from connectors.bookie.frames import encode_frame, list_entries_request
    >>> encode_frame(list_entries_request(ledger_id=5, txn_id=1)).hex()
    '0000000d0a060803100b1801e206020805'
"""
