"""spark-submit entry point of ``bkaudit stream`` (spark-submit runs a Python file, not a console script).

Arguments after the file are passed to ``bkaudit stream`` (e.g. ``--available-now``). Settings come from
the ``BKAUDIT_*`` environment and ``BKAUDIT_CONFIG_FILE`` as for every bkaudit process; see
infra/spark/submit.sh and infra/README.md.
"""

from __future__ import annotations

import sys

from bkaudit.cli.main import run

if __name__ == "__main__":
    sys.exit(run(["stream", *sys.argv[1:]]))
