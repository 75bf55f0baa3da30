"""A report to look at: one self-contained HTML file plus a PNG per plot, from the lake's tables.

Each task type is judged on its own (never one aggregate reward): rewards by domain and by task
type, pass rate over time, the length mix against the inference profile's targets, staleness,
dead letters by reason, and throughput and end-to-end delay over time. Only the small columns are
read (never the token lists), so a report of a large table costs little memory.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only

import matplotlib.pyplot as plt
import polars as pl
from matplotlib.figure import Figure

from consumers.exceptions import AnalyticsError
from consumers.sql import existing_tables, scan_table
from schemas.profile import WorkloadProfile, load_profile

TOP_DOMAINS = 30
"""Domains shown in the per-domain plot: the most frequent ones (the rest are summed in the table)."""

_TRAJECTORY_COLUMNS = [
    "domain",
    "task_type",
    "reward",
    "verifier_status",
    "length",
    "bucket",
    "policy_version",
    "group_id",
    "created_at",
    "ingested_at",
]


@dataclass
class Report:
    """Where the report went and what it covered."""

    html_path: Path
    images: list[Path] = field(default_factory=list)
    rows: int = 0
    dead_letters: int = 0
    table_version: int | None = None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready summary."""
        return {
            "html": str(self.html_path),
            "images": [str(p) for p in self.images],
            "rows": self.rows,
            "dead_letters": self.dead_letters,
            "table_version": self.table_version,
        }


def build_report(
    lake_dir: Path | str,
    out_dir: Path | str,
    *,
    profile: WorkloadProfile | None = None,
    progress: Callable[[str], None] = lambda _: None,
    storage_options: Mapping[str, str] | None = None,
) -> Report:
    """Read the lake's tables (a directory or object-store URI) and write report.html and one PNG
    per plot into `out_dir`."""
    present = existing_tables(lake_dir, storage_options=storage_options)
    if "trajectories" not in present:
        raise AnalyticsError(f"no trajectories table under {lake_dir}: run `rollstream process` first")
    profile = profile or load_profile()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = (
        scan_table(lake_dir, "trajectories", storage_options=storage_options)
        .select(_TRAJECTORY_COLUMNS)
        .collect()
    )
    letters = (
        scan_table(lake_dir, "dead_letters", storage_options=storage_options)
        .select("reason", "error_type", "failed_at")
        .collect()
        if "dead_letters" in present
        else pl.DataFrame(schema={"reason": pl.String, "error_type": pl.String, "failed_at": pl.Datetime})
    )
    from deltalake import DeltaTable

    from consumers.sql import table_location

    version = DeltaTable(
        table_location(lake_dir, "trajectories"), storage_options=dict(storage_options or {}) or None
    ).version()
    report = Report(out / "report.html", rows=rows.height, dead_letters=letters.height, table_version=version)
    plots: list[tuple[str, str, Figure]] = []
    for title, caption, make in (
        ("Reward by task type", "mean reward and pass rate per task type", _by_task_type),
        ("Reward by domain", f"mean reward of the {TOP_DOMAINS} largest domains", _by_domain),
        ("Pass rate over time", "share of ok verdicts over ingestion time, by task type", _pass_rate),
        ("Length mix against the profile", f"profile {profile.id}", lambda f: _length_mix(f, profile)),
        (
            "Reward by policy version",
            "the mean of per-group mean rewards of the groups each policy version generated, with its "
            "standard error (a group's samples are correlated)",
            _by_version,
        ),
        ("Staleness", "policy versions behind the newest in the table", _staleness),
        (
            "Throughput and delay",
            "rows into Delta over time; the p99 delay from the rollout worker's created_at to the row "
            "(consumer lag in time; meaningless for a fleet that stamps a simulated clock)",
            _throughput,
        ),
    ):
        progress(f"plotting {title.lower()}")
        plots.append((title, caption, make(rows)))
    plots.append(("Dead letters by reason", f"{letters.height} dead letters", _dead_letters(letters)))
    sections = []
    for i, (title, caption, figure) in enumerate(plots, start=1):
        png = out / f"{i:02d}_{_slug(title)}.png"
        figure.savefig(png, dpi=110, bbox_inches="tight")
        plt.close(figure)
        report.images.append(png)
        encoded = base64.b64encode(png.read_bytes()).decode()
        sections.append(
            f"<section><h2>{html.escape(title)}</h2><p>{html.escape(caption)}</p>"
            f'<img alt="{html.escape(title)}" src="data:image/png;base64,{encoded}"></section>'
        )
    report.html_path.write_text(_page(lake_dir, report, _summary_table(rows, letters), sections))
    return report


_BINS = (("1s", 1), ("10s", 10), ("1m", 60), ("10m", 600), ("1h", 3600), ("6h", 21600), ("1d", 86400))


def _time_bin(stamps: pl.Series) -> str:
    """The bin width that gives at most about 60 bins over the span of `stamps`."""
    if stamps.is_empty():
        return "1m"
    span = (stamps.max() - stamps.min()).total_seconds()  # type: ignore[operator,union-attr]
    for width, seconds in _BINS:
        if span / seconds <= 60:
            return width
    return _BINS[-1][0]


def _slug(title: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in title.lower()).strip("_")


def _figure(title: str) -> tuple[Figure, plt.Axes]:
    figure, axes = plt.subplots(figsize=(9, 4.5))
    axes.set_title(title)
    return figure, axes


def _empty(axes: plt.Axes) -> None:
    axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)


def _by_task_type(rows: pl.DataFrame) -> Figure:
    stats = (
        rows.group_by("task_type")
        .agg(
            pl.col("reward").mean().alias("reward"), (pl.col("verifier_status") == "ok").mean().alias("pass")
        )
        .sort("task_type")
    )
    figure, axes = _figure("reward and pass rate by task type")
    x = range(stats.height)
    axes.bar([i - 0.2 for i in x], stats["reward"].to_list(), width=0.4, label="mean reward")
    axes.bar([i + 0.2 for i in x], stats["pass"].to_list(), width=0.4, label="pass rate (ok)")
    axes.set_xticks(list(x), stats["task_type"].to_list())
    axes.legend()
    return figure


def _by_domain(rows: pl.DataFrame) -> Figure:
    stats = (
        rows.group_by("domain")
        .agg(pl.len().alias("n"), pl.col("reward").mean().alias("reward"))
        .sort("n", descending=True)
        .head(TOP_DOMAINS)
        .sort("domain")
    )
    figure, axes = _figure(f"mean reward, {min(TOP_DOMAINS, stats.height)} largest domains")
    axes.barh(stats["domain"].to_list(), stats["reward"].to_list())
    axes.tick_params(axis="y", labelsize=6)
    figure.set_figheight(max(4.5, 0.18 * stats.height))
    return figure


def _pass_rate(rows: pl.DataFrame) -> Figure:
    figure, axes = _figure("pass rate over time")
    if rows.is_empty():
        _empty(axes)
        return figure
    series = (
        rows.with_columns(pl.col("ingested_at").dt.truncate(_time_bin(rows["ingested_at"])).alias("minute"))
        .group_by("minute", "task_type")
        .agg((pl.col("verifier_status") == "ok").mean().alias("pass"))
        .sort("minute")
    )
    for task_type in sorted(series["task_type"].unique().to_list()):
        part = series.filter(pl.col("task_type") == task_type)
        axes.plot(part["minute"].to_list(), part["pass"].to_list(), marker=".", label=task_type)
    axes.set_ylim(0, 1)
    axes.legend()
    figure.autofmt_xdate()
    return figure


def _length_mix(rows: pl.DataFrame, profile: WorkloadProfile) -> Figure:
    figure, axes = _figure("bucket mix: delivered to the table against the profile's targets")
    counts = dict(rows.group_by("bucket").len().iter_rows())
    total = sum(counts.values()) or 1
    names = list(profile.names) + sorted(set(counts) - set(profile.names))
    x = range(len(names))
    axes.bar([i - 0.2 for i in x], [counts.get(n, 0) / total for n in names], width=0.4, label="table")
    axes.bar([i + 0.2 for i in x], [profile.targets.get(n, 0.0) for n in names], width=0.4, label="target")
    axes.set_xticks(list(x), names)
    axes.set_ylabel("share")
    distance = profile.distance(counts) if counts else 1.0
    axes.legend(title=f"TV distance {distance:.3f}")
    return figure


def _by_version(rows: pl.DataFrame) -> Figure:
    figure, axes = _figure("training reward by policy version")
    if rows.is_empty():
        _empty(axes)
        return figure
    stats = (
        rows.group_by("group_id")
        .agg(pl.col("policy_version").min(), pl.col("reward").mean())
        .group_by("policy_version")
        .agg(pl.col("reward").mean().alias("mean"), pl.col("reward").std().alias("std"), pl.len().alias("n"))
        .sort("policy_version")
    )
    se = [
        0.0 if n < 2 or std is None else std / n**0.5 for std, n in zip(stats["std"], stats["n"], strict=True)
    ]
    axes.errorbar(stats["policy_version"].to_list(), stats["mean"].to_list(), yerr=se, marker="o", capsize=3)
    axes.set_xlabel("policy version")
    axes.set_ylabel("mean reward per group")
    return figure


def _staleness(rows: pl.DataFrame) -> Figure:
    figure, axes = _figure("policy versions behind the newest")
    if rows.is_empty():
        _empty(axes)
        return figure
    newest = int(rows["policy_version"].max())  # type: ignore[arg-type]
    lag = (newest - rows["policy_version"]).to_list()
    axes.hist(lag, bins=min(50, max(1, len(set(lag)))))
    axes.set_xlabel("versions behind")
    axes.set_ylabel("rows")
    return figure


def _throughput(rows: pl.DataFrame) -> Figure:
    width = _time_bin(rows["ingested_at"])
    figure, axes = _figure(f"rows per {width} into Delta, and the p99 delay from created_at to ingestion")
    if rows.is_empty():
        _empty(axes)
        return figure
    per_minute = (
        rows.with_columns(
            pl.col("ingested_at").dt.truncate(width).alias("minute"),
            ((pl.col("ingested_at") - pl.col("created_at")).dt.total_milliseconds() / 1000).alias("delay"),
        )
        .group_by("minute")
        .agg(pl.len().alias("rows"), pl.col("delay").quantile(0.99).alias("p99"))
        .sort("minute")
    )
    axes.plot(per_minute["minute"].to_list(), per_minute["rows"].to_list(), marker=".")
    axes.set_ylabel(f"rows per {width}")
    figure.autofmt_xdate()
    delay_axes = axes.twinx()
    delay_axes.plot(per_minute["minute"].to_list(), per_minute["p99"].to_list(), color="tab:red", marker="x")
    delay_axes.set_ylabel("p99 delay (s)", color="tab:red")
    return figure


def _dead_letters(letters: pl.DataFrame) -> Figure:
    figure, axes = _figure("dead letters by error type")
    if letters.is_empty():
        _empty(axes)
        return figure
    counts = letters.group_by("error_type").len().sort("len")
    axes.barh(counts["error_type"].to_list(), counts["len"].to_list())
    return figure


def _summary_table(rows: pl.DataFrame, letters: pl.DataFrame) -> str:
    stats = (
        rows.group_by("task_type")
        .agg(
            pl.len().alias("rows"),
            pl.col("domain").n_unique().alias("domains"),
            pl.col("reward").mean().alias("mean_reward"),
            (pl.col("verifier_status") == "ok").mean().alias("pass_rate"),
            pl.col("length").median().alias("median_length"),
        )
        .sort("task_type")
    )
    head = "".join(f"<th>{html.escape(c)}</th>" for c in stats.columns)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{v:.3f}</td>" if isinstance(v, float) else f"<td>{v}</td>" for v in row)
        + "</tr>"
        for row in stats.iter_rows()
    )
    reasons = "".join(
        f"<tr><td>{html.escape(str(t))}</td><td>{n}</td></tr>"
        for t, n in letters.group_by("error_type").len().sort("len", descending=True).iter_rows()
    )
    return (
        f"<table><tr>{head}</tr>{body}</table>"
        f"<h3>Dead letters</h3><table><tr><th>error type</th><th>count</th></tr>{reasons}</table>"
    )


def _page(lake_dir: Path | str, report: Report, summary: str, sections: list[str]) -> str:
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rollstream report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}
img {{ max-width: 100%; }}
section {{ margin-top: 2em; }}
</style></head><body>
<h1>rollstream report</h1>
<p>Lake <code>{html.escape(str(lake_dir))}</code>, trajectories version {report.table_version}:
{report.rows} rows, {report.dead_letters} dead letters. Generated {generated}.</p>
{summary}
{"".join(sections)}
</body></html>
"""
