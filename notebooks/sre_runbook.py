# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # SRE runbook: what is at risk right now, why, and since when
#
# Reads the auditor's Delta tables (no Spark: DuckDB through Arrow, `connectors.delta.queries`) and answers,
# in order:
#
# 1. **What is firing now**: open alerts per kind and severity, the critical ones listed.
# 2. **The dead bookie**: the most recently lost bookie, the ledgers whose metadata names it, which of them
#    are at risk now and which were flagged while it was gone.
# 3. **Since when**: under-replicated (and unrecoverable) ledgers over time, from the `violations` history.
# 4. **Where**: violations per rack and kind; placement violations per rack now.
# 5. **The incident**: every alert transition around the bookie's loss, on one timeline.
#
# Each plot is shown inline (in Jupyter) and saved as a PNG under `output_dir` (always, headless too).
# Parameters are in the next cell (tagged `parameters`):
# `lakehouse = None` means the demo's tables, `<lakehouse_root>/demo` (`BKAUDIT_LAKEHOUSE_ROOT`, default
# `lakehouse/`). Run it after `make demo` from the repository root:
#
#     .venv/bin/jupytext --to ipynb --execute --run-path . notebooks/sre_runbook.py   # writes the .ipynb
#     .venv/bin/python notebooks/sre_runbook.py                                        # or as a plain script

# %% tags=["parameters"]
lakehouse = None  # path of the Delta tables; None: <lakehouse_root>/demo
output_dir = "notebook-output/sre_runbook"  # where the PNGs go

# %%
from datetime import timedelta
from pathlib import Path

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import pandas as pd

from connectors.delta.queries import LEDGER_RISK_KINDS, Lakehouse
from core.settings import load_settings

lakehouse_path = Path(lakehouse) if lakehouse is not None else load_settings().lakehouse_root / "demo"
plots = Path(output_dir)
plots.mkdir(parents=True, exist_ok=True)
tables = Lakehouse(lakehouse_path)
pd.set_option("display.width", 160)
pd.set_option("display.max_columns", 20)
pd.set_option("display.max_colwidth", 60)
print(f"lakehouse: {lakehouse_path.resolve()}  (tables: {', '.join(tables.tables())})")
print(f"plots: {plots.resolve()}")


def frame(table):
    """An Arrow answer as a pandas frame (timestamps stay UTC)."""
    return table.to_pandas()


def save(figure, name):
    """Write the figure as PNG under the output dir. It stays open: Jupyter's inline backend shows it at
    the end of the cell (and closes it then); matplotlib picks a non-GUI backend by itself when there is no
    display, so a headless run only writes the files."""
    path = plots / f"{name}.png"
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"saved {path}")
    return path


def time_axis(figure, axes):
    """Readable time ticks whatever the span (seconds of a demo, weeks of history)."""
    locator = mdates.AutoDateLocator()
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def nothing_to_plot(axes, text):
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, fontsize=12)
    axes.set_axis_off()


# %% [markdown]
# ## 1. What is firing now

# %%
by_kind = frame(tables.open_alerts(group_by=["kind", "severity"]))
print(by_kind.to_string(index=False) if len(by_kind) else "no open alerts")
critical = frame(tables.open_alerts(severity="critical"))
print(f"\ncritical alerts: {len(critical)}")
if len(critical):
    print(critical[["kind", "entity", "bookies", "pulsar_topic", "since"]].to_string(index=False))

colors = {"critical": "#c0392b", "warning": "#e67e22", "info": "#2980b9"}
figure, axes = plt.subplots(figsize=(8, 3.5))
if len(by_kind):
    axes.barh(by_kind["kind"], by_kind["alerts"], color=[colors.get(s, "grey") for s in by_kind["severity"]])
    axes.invert_yaxis()
    axes.set_xlabel("open alerts")
    axes.set_title("Open alerts by kind (colour: severity)")
else:
    nothing_to_plot(axes, "no open alerts")
save(figure, "open_alerts_by_kind")

# %% [markdown]
# ## 2. The dead bookie
#
# The bookie of the most recent `BOOKIE_LOST` transition (open or not): its status now, the ledgers whose
# metadata names it (through the bookie → ledger index), which are under-replicated now, and which were
# flagged while it was lost (from the `violations` history).

# %%
losses = frame(tables.violations(kinds=["BOOKIE_LOST"]))
dead_bookie = None
if len(losses):
    last = losses.iloc[-1]
    dead_bookie = last["bookies"][0]
    print(f"last lost bookie: {dead_bookie} ({last['state']} at {last['detected_at']})")
else:
    print("no bookie has been lost in the recorded history")

if dead_bookie is not None:
    status = frame(tables.bookies()).set_index("bookie_id").loc[[dead_bookie]]
    print(
        status[["status", "lost", "missing_since", "flaps", "rack", "ledgers", "at_risk_ledgers"]].to_string()
    )
    on_bookie = frame(tables.ledgers(bookie=dead_bookie))
    at_risk_now = frame(tables.under_replicated(bookie=dead_bookie))
    flagged = frame(tables.violations(bookie=dead_bookie, kinds=list(LEDGER_RISK_KINDS), state="firing"))
    print(f"\nledgers whose metadata names {dead_bookie}: {len(on_bookie)}")
    print(f"under-replicated or unrecoverable now because of it: {len(at_risk_now)}")
    print(f"flagged while it was lost: {flagged['ledger_id'].nunique() if len(flagged) else 0}")
    if len(on_bookie):
        columns = ["ledger_id", "state", "ensemble_size", "write_quorum", "pulsar_topic", "open_alerts"]
        print(on_bookie[columns].head(30).to_string(index=False))
        if len(on_bookie) > 30:
            print(f"... and {len(on_bookie) - 30} more (tables.ledgers(bookie=...) has them all)")

figure, axes = plt.subplots(figsize=(8, 3.5))
if dead_bookie is not None and len(on_bookie):
    topics = on_bookie.assign(topic=on_bookie["pulsar_topic"].fillna("(not Pulsar)"))
    per_topic = topics.groupby("topic").size().sort_values(ascending=False).head(15)  # the 15 largest
    was_flagged = set(flagged["ledger_id"]) if len(flagged) else set()
    flagged_per_topic = (
        topics[topics["ledger_id"].isin(was_flagged)]
        .groupby("topic")
        .size()
        .reindex(per_topic.index, fill_value=0)
    )
    axes.barh(per_topic.index, per_topic.values, color="#95a5a6", label="ledgers naming it")
    axes.barh(flagged_per_topic.index, flagged_per_topic.values, color="#e67e22", label="flagged while lost")
    axes.set_xlabel("ledgers")
    axes.set_title(f"Ledgers of {dead_bookie} per Pulsar topic")
    axes.legend(loc="lower right")
else:
    nothing_to_plot(axes, "no lost bookie, or it holds no ledger")
save(figure, "dead_bookie_ledgers")

# %% [markdown]
# ## 3. Since when: ledgers at risk over time
#
# A step function from the `violations` history: each firing adds one, each resolution removes one; the
# last value holds until the latest transition the auditor recorded (of any kind).

# %%
over_time = frame(tables.open_alerts_over_time(kinds=list(LEDGER_RISK_KINDS)))
latest = frame(tables.violations(group_by=["state"]))["last"].max()
figure, axes = plt.subplots(figsize=(9, 3.5))
if len(over_time):
    for kind, steps in over_time.groupby("kind"):
        times = [*steps["detected_at"], max(latest, steps["detected_at"].max())]
        counts = [*steps["open_alerts"], steps["open_alerts"].iloc[-1]]
        axes.step(times, counts, where="post", label=kind, linewidth=2)
    axes.set_ylabel("open alerts")
    axes.set_title("Under-replicated / unrecoverable ledgers over time")
    axes.legend()
    time_axis(figure, axes)
    print(over_time.tail(20).to_string(index=False))
else:
    nothing_to_plot(axes, "no ledger has been at risk")
save(figure, "under_replicated_over_time")

# %% [markdown]
# ## 4. Where: violations per rack and kind
#
# Every alert that fired, counted once per rack of the bookies it names (a ledger alert names its lost
# bookies, a placement alert its whole ensemble); then the placement violations open now, per rack.

# %%
by_rack = frame(tables.violations(group_by=["rack", "kind"], state="firing"))
print(
    by_rack[["rack", "kind", "alerts", "first", "last"]].head(30).to_string(index=False)
    if len(by_rack)
    else "none"
)
placement = frame(tables.placement())
print("\nplacement violations open now, per rack:")
print(placement.to_string(index=False) if len(placement) else "none")

figure, axes = plt.subplots(figsize=(9, 4))
if len(by_rack):
    pivot = by_rack.pivot_table(index="rack", columns="kind", values="alerts", aggfunc="sum", fill_value=0)
    pivot.plot.bar(stacked=True, ax=axes, rot=0)
    axes.set_ylabel("alerts fired")
    axes.set_title("Alerts fired per rack and kind")
    axes.legend(fontsize=8)
else:
    nothing_to_plot(axes, "no alert has fired")
save(figure, "violations_by_rack_kind")

# %% [markdown]
# ## 5. The incident: every alert transition around the bookie's loss
#
# From one minute before the last `BOOKIE_LOST` to one minute after its resolution (or now).

# %%
if dead_bookie is not None:
    lost_rows = losses[losses["bookies"].map(lambda b: dead_bookie in list(b))]
    fired = lost_rows[lost_rows["state"] == "firing"]["detected_at"].max()
    after = lost_rows[(lost_rows["state"] == "resolved") & (lost_rows["detected_at"] >= fired)]["detected_at"]
    start = fired - timedelta(minutes=1)
    end = (after.min() if len(after) else pd.Timestamp.now(tz="UTC")) + timedelta(minutes=1)
    window = frame(tables.violations(since=start.to_pydatetime(), until=end.to_pydatetime(), limit=None))
else:
    window = frame(tables.violations(limit=200))
print(f"transitions in the window: {len(window)}")
if len(window):
    counted = window.groupby(["kind", "state"]).size().rename("transitions").reset_index()
    print(counted.to_string(index=False))

figure, axes = plt.subplots(figsize=(10, 4))
if len(window):
    kinds = sorted(window["kind"].unique())
    rows = {kind: index for index, kind in enumerate(kinds)}
    for state, marker, color in (("firing", "^", "#c0392b"), ("resolved", "v", "#27ae60")):
        part = window[window["state"] == state]
        axes.scatter(
            part["detected_at"], part["kind"].map(rows), marker=marker, color=color, label=state, s=40
        )
    axes.set_yticks(range(len(kinds)), kinds)
    axes.set_title("Alert transitions around the incident")
    axes.legend()
    time_axis(figure, axes)
else:
    nothing_to_plot(axes, "no alert transition recorded")
save(figure, "alert_timeline")

# %% [markdown]
# ## 6. Bookies now

# %%
print(frame(tables.bookies()).drop(columns=["updated_at"]).to_string(index=False))
tables.close()
