"""The bookie-side agent (`bkaudit agent`): a DbLedgerStorage bookie's RocksDB indexes over gRPC."""
