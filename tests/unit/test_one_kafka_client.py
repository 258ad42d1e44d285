"""bkaudit has one Kafka client, confluent-kafka (librdkafka): no product module imports kafka-python.

kafka-python may still be installed next to bkaudit (the client benchmark compares the two), so the checks
are on what the product imports, not on what is installed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("core", "connectors", "streaming", "bkaudit")
_IMPORTS_KAFKA_PYTHON = re.compile(
    r"^\s*(from\s+kafka(\.\w+)*\s+import|import\s+kafka(\.\w+)*)\b", re.MULTILINE
)


def test_no_product_source_imports_kafka_python():
    offenders = [
        str(path.relative_to(ROOT))
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if _IMPORTS_KAFKA_PYTHON.search(path.read_text())
    ]
    assert offenders == []


def test_importing_every_product_module_loads_no_kafka_python_module():
    script = f"""
import importlib, pkgutil, sys
for package in {PRODUCT!r}:
    root = importlib.import_module(package)
    for module in pkgutil.walk_packages(root.__path__, package + "."):
        if module.name.endswith("__main__"):
            continue
        importlib.import_module(module.name)
loaded = sorted(name for name in sys.modules if name == "kafka" or name.startswith("kafka."))
print(len([n for n in sys.modules if n.startswith({PRODUCT!r})]), loaded)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported, loaded = done.stdout.strip().split(" ", 1)
    assert int(imported) > 50  # the walk really imported the product
    assert loaded == "[]"
    assert (
        "confluent_kafka"
        in subprocess.run(
            [sys.executable, "-c", "import connectors.kafka.publisher, sys; print(sorted(sys.modules))"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout
    )
