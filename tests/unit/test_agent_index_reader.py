"""The agent's index reader cleans up after itself when it cannot open a bookie's databases."""

from __future__ import annotations

import tempfile

import pytest

from connectors.agent.index import DbStorageIndexReader
from core.errors import ServiceError


def test_a_reader_that_cannot_open_its_databases_leaves_no_view_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the reader makes its own view root
    with pytest.raises(ServiceError, match="not a RocksDB"):
        DbStorageIndexReader([tmp_path / "no-such-bookie"])
    assert list(tmp_path.glob("bkaudit-agent-*")) == []
