"""The SRE runbook notebook (notebooks/sre_runbook.py) executed headless on a real demo run's tables.

jupytext reads the percent-format script into a notebook, the parameters are injected after the cell tagged
``parameters`` (papermill's convention), nbclient runs every cell in a fresh kernel: any cell error fails
the test. Then the PNGs must exist and hold a real plot, and what the notebook printed about the dead bookie
must agree with the simulator's ground truth.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import DemoRun

pytestmark = pytest.mark.integration

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "sre_runbook.py"
PLOTS = (
    "open_alerts_by_kind",
    "dead_bookie_ledgers",
    "under_replicated_over_time",
    "violations_by_rack_kind",
    "alert_timeline",
)


def execute(notebook: Path, parameters: dict[str, str], cwd: Path):
    import jupytext
    import nbformat
    from nbclient import NotebookClient

    nb = jupytext.read(notebook)
    tagged = [i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    source = "\n".join(f"{name} = {value!r}" for name, value in parameters.items())
    nb.cells.insert(
        tagged[0] + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    )
    NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    ).execute()
    return nb


def printed(nb) -> str:
    return "".join(
        output.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream"
    )


def test_the_runbook_runs_headless_and_draws_every_plot(demo_run: DemoRun, tmp_path):
    import matplotlib.image

    out = tmp_path / "plots"
    nb = execute(NOTEBOOK, {"lakehouse": str(demo_run.lakehouse), "output_dir": str(out)}, cwd=tmp_path)
    for name in PLOTS:
        path = out / f"{name}.png"
        assert path.is_file() and path.stat().st_size > 10_000, name
        pixels = matplotlib.image.imread(path)
        assert pixels.shape[0] >= 300 and pixels.shape[1] >= 600, (name, pixels.shape)
        assert pixels.std() > 0.05, f"{name} is blank"  # bars, steps or markers, not one colour
    shown = [
        output
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    ]
    assert len(shown) == len(PLOTS), "every plot is shown inline in Jupyter, not only saved"
    text = printed(nb)
    dead = demo_run.summary["story"]["dead_bookie"]
    while_dead = demo_run.summary["ground_truth_ids"]["while_dead_bookie_was_lost"]
    flagged = {
        int(i)
        for kind in ("LEDGER_UNDER_REPLICATED", "LEDGER_UNRECOVERABLE")
        for i in while_dead.get(kind, [])
    }
    assert f"last lost bookie: {dead}" in text, text
    assert f"ledgers whose metadata names {dead}: {len(flagged)}" in text, text
    assert f"flagged while it was lost: {len(flagged)}" in text, text
    assert "under-replicated or unrecoverable now because of it: 0" in text, text  # it came back
