"""The shipped test harness: real embedded services for tests, with fault injection.

Like kazoo's ``testing`` module, this is part of the package so that our tests and anyone extending bkaudit
can start the same embedded ZooKeeper and broker, isolate each test (a ZooKeeper chroot, unique topics) and
inject faults: :meth:`ServiceHarness.expire_session`, :meth:`ServiceHarness.restart_zookeeper`,
:meth:`ServiceHarness.stop_broker`. The pytest fixtures live in :mod:`bkaudit.testing.pytest_plugin`.

Example:
    >>> from bkaudit.testing import ServiceHarness
    >>> ServiceHarness.__name__
    'ServiceHarness'
"""

from bkaudit.testing.harness import ServiceHarness

__all__ = ["ServiceHarness"]
