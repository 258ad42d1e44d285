"""A real Apache BookKeeper 4.17 cluster on loopback (bookie processes, BookKeeper's shell, its Java client).

Example:
    >>> from connectors.bookkeeper import RealBookKeeperCluster
    >>> RealBookKeeperCluster("/tmp/x", "127.0.0.1:2181", prefix="/bk").ledgers_root
    '/bk/ledgers'
"""

from connectors.bookkeeper.bookie import RealBookie
from connectors.bookkeeper.cluster import RealBookKeeperCluster
from connectors.bookkeeper.shell import BookKeeperShell, parse_ledger_metadata, parse_listbookies
from connectors.bookkeeper.tls import BookKeeperTls

__all__ = [
    "BookKeeperShell",
    "BookKeeperTls",
    "RealBookKeeperCluster",
    "RealBookie",
    "parse_ledger_metadata",
    "parse_listbookies",
]
