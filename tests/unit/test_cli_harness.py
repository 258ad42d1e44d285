"""The in-process CLI runner (the ``cli`` fixture) behaves like a command's own process."""

from __future__ import annotations

import json
import os


def test_a_command_run_in_process_leaves_the_environment_as_it_found_it(cli):
    # --set and --dev put settings in the environment, as they do for the command's own process; a later
    # test in the same worker must not inherit them (a Kafka client told to speak TLS to a plaintext broker
    # retried for minutes there).
    before = dict(os.environ)
    result = cli("--set", "kafka.bootstrap_servers=k9:9092", "config", "show", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["kafka"]["bootstrap_servers"] == "k9:9092"
    assert dict(os.environ) == before
