"""The report's figures (matplotlib, Agg backend: no display needed). Each function draws one
figure from the DataFrames of frames.py and returns it; axis labels say unit and provenance."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .frames import COLUMNS  # noqa: E402


def label(column: str, what: str | None = None) -> str:
    """An axis label: what it is, its unit and where the number comes from."""
    m = COLUMNS[column]
    return f"{what or column} ({m.unit}, {m.provenance})"


def series_name(row, multi_run: bool, multi_exp: bool) -> str:
    """How an arm is named on a figure: the arm, prefixed with experiment/run when there are several."""
    parts = ([str(row["run"])] if multi_run else []) + ([str(row["experiment"])] if multi_exp else [])
    return " · ".join([*parts, str(row["config"])])


def _series(df):
    multi_run, multi_exp = df["run"].nunique() > 1, df["experiment"].nunique() > 1
    keys = df[["run", "experiment", "config"]].drop_duplicates()
    for _, k in keys.iterrows():
        sel = df[(df["run"] == k["run"]) & (df["experiment"] == k["experiment"]) & (df["config"] == k["config"])]
        yield series_name(k, multi_run, multi_exp), sel


def latency_cdf(steps) -> Figure:
    """Empirical CDF of step latency per arm (executed steps)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, sel in _series(steps[steps["executed"].astype(bool)]):
        lat = sel["latency_ms"].dropna().sort_values().to_numpy()
        if len(lat):
            ax.step(lat, [(i + 1) / len(lat) for i in range(len(lat))], where="post", label=f"{name} (n={len(lat)})")
    ax.set_xscale("log")
    ax.set_xlabel(label("latency_ms", "step latency"))
    ax.set_ylabel("fraction of steps ≤ x (derived)")
    ax.set_title("Step latency CDF per arm")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def kills_and_breaches(tests) -> Figure:
    """OOM kills, hard-limit hits and soft-limit breaches per arm, summed over its traces (the mean
    over its sweep points where it ran at several: an arm no point changes runs at one)."""
    counters = [("oom_kills", "OOM kills"), ("mem_max_events_total", "hard-limit hits (max events)"),
                ("mem_high_events_total", "soft-limit breaches (high events)")]
    names, sums = [], {k: [] for k, _ in counters}
    for name, sel in _series(tests):
        names.append(name)
        for k, _ in counters:
            per_point = sel.groupby("params")[k].sum()
            sums[k].append(round(float(per_point.mean()), 1) if len(per_point) > 1 else int(per_point.sum()))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(counters)
    for i, (k, what) in enumerate(counters):
        xs = [j + (i - (len(counters) - 1) / 2) * width for j in range(len(names))]
        bars = ax.bar(xs, sums[k], width, label=what)
        ax.bar_label(bars, fontsize=7)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("count (recorded by the kernel, summed over traces;\nmean over sweep points)"
                  if tests["params"].nunique() > 1 else "count (recorded by the kernel, summed over traces)")
    ax.set_title("OOM kills and limit breaches per arm")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def memory_vs_limit(steps, trace_id: str, limits: dict[str, dict] | None = None) -> Figure:
    """One trace's per-step memory peak under each arm, the trace's own peak, and each arm's limits
    (`limits`: arm -> Arm.limits, from the experiment config; omitted when unknown)."""
    tr = steps[steps["trace_id"] == trace_id]
    point = ""                           # one seed, and each arm at its first sweep point in the results
    if tr["seed"].nunique() > 1 or tr["params"].nunique() > 1:
        seed = tr["seed"].iloc[0]
        tr = tr[tr["seed"] == seed]
        first = tr.groupby("config", sort=False)["params"].first()     # "" for an arm no point changes
        tr = tr[tr["params"] == tr["config"].map(first)]
        named = sorted({p for p in first if p})
        point = f" (seed {seed}{', ' + ', '.join(named) if named else ''})"
    fig, ax = plt.subplots(figsize=(8, 4))
    wanted = tr.drop_duplicates("step_id").sort_values("step_id")
    if wanted["replayed_peak_mb"].notna().any():
        prov = ",".join(sorted(wanted["profile_source"].dropna().astype(str).unique())) or "unknown"
        ax.bar(wanted["step_id"], wanted["replayed_peak_mb"].fillna(0), color="0.85",
               label=f"trace's peak (MiB, {prov})")
    series = list(_series(tr))
    for i, (name, sel) in enumerate(series):
        sel = sel.sort_values("step_id")
        color = f"C{i}" if len(series) <= 10 else plt.get_cmap("tab20")(i % 20)     # no colour twice
        ax.plot(sel["step_id"], sel["max_rss_mb"], marker=".", color=color, label=f"{name}: measured peak")
        killed = sel[sel["oom_kills"] > 0]
        if len(killed):
            ax.scatter(killed["step_id"], killed["max_rss_mb"], marker="x", s=80, color=color, zorder=5,
                       label=f"{name}: OOM-killed step")
        # a swept arm ran at its point's limits, not the config's: no line rather than a wrong one
        arm_limits = (limits or {}).get(str(sel["config"].iloc[0]), {}) if not sel["params"].iloc[0] else {}
        for key, style in (("memory_max_mb", "--"), ("memory_high_mb", ":")):
            if key in arm_limits:
                ax.axhline(arm_limits[key], linestyle=style, color=color, linewidth=1,
                           label=f"{name}: {key.replace('_mb', '')} {arm_limits[key]:g} MiB (config)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel(label("max_rss_mb", "memory peak"))
    ax.set_title(f"Memory peak vs limit: {trace_id}{point}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


ABLATION_METRICS = (("latency_p95_ms", "p95 latency"), ("oom_kills", "OOM kills"), ("peak_rss_mb", "peak memory"))


def ablation_deltas(deltas) -> Figure:
    """Per sweep value, the change of each metric vs the axis's default value, per arm (`deltas`:
    the frame of frames.ablation_deltas)."""
    fig, axes = plt.subplots(1, len(ABLATION_METRICS), figsize=(4 * len(ABLATION_METRICS), 4), squeeze=False)
    for ax, (metric, what) in zip(axes[0], ABLATION_METRICS):
        sel = deltas[deltas["metric"] == metric]
        labels = [f"{r.axis}={r.value}\n{r.config}" for r in sel.itertuples()]
        colors = ["C3" if d > 0 else "C2" for d in sel["delta"]]
        ax.barh(range(len(sel)), sel["delta"], color=colors)
        ax.set_yticks(range(len(sel)), labels, fontsize=7)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel(f"Δ {what} vs default ({COLUMNS[metric].unit}, derived: mean over traces × seeds)", fontsize=8)
        ax.invert_yaxis()
    fig.suptitle("Ablations: change against each axis's default value")
    fig.tight_layout()
    return fig


def frontier(frame) -> Figure:
    """OOM kills against reserved memory, one line per arm through its sweep points (`frame`: the
    frame of frontier.reservation_frame), each point named by its sweep value. Where the frame holds
    both recorded and 1 Hz-derived profiles (`profiles`), each arm is two series in one colour,
    recorded filled and derived hollow, with an arrow from each derived point to the recorded one of
    the same arm and sweep point: what replaying the recorded profiles changed."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    sel = frame.dropna(subset=["reserved_gib_s", "oom_kills"])
    multi_run, multi_exp = sel["run"].nunique() > 1, sel["experiment"].nunique() > 1
    corpora = sel["profiles"].nunique() > 1
    arms: dict[tuple, int] = {}                    # run, experiment, arm -> its colour and marker
    many = sel.groupby(["run", "experiment", "config"]).ngroups
    labels: dict[tuple, tuple[list, str]] = {}     # one label per spot: the sweep values that land there
    for key, arm in sel.groupby(["run", "experiment", "config", "profiles"], sort=False):
        i = arms.setdefault(key[:3], len(arms))
        arm = arm.sort_values("reserved_gib_s")
        name = series_name(dict(zip(["run", "experiment", "config"], key[:3])), multi_run, multi_exp)
        color = f"C{i}" if many <= 10 else plt.get_cmap("tab20")(i % 20)     # eleven arms: no colour twice
        hollow = corpora and key[3] != "recorded"
        # arms can coincide (static-env and static-toolcall on traces of one tool call at a time):
        # marker, size and dash differ per arm so that a line drawn over another still shows
        ax.plot(arm["reserved_gib_s"], arm["oom_kills"], marker="osD^vP*X"[i % 8], markersize=9 - i % 4 * 1.5,
                linestyle=("-", "--", ":", "-.")[i % 4], color=color, markerfacecolor="none" if hollow else color,
                label=f"{name} ({key[3]})" if corpora else name)
        for r in arm.itertuples():
            names, _ = labels.setdefault((round(r.reserved_gib_s, 1), r.oom_kills), ([], color))
            if r.point not in names and r.point != "-":         # "-": no sweep, nothing to name
                names.append(r.point)
    if corpora:
        for _, pts in sel.groupby(["run", "experiment", "config", "params"], sort=False):
            rec, der = pts[pts["profiles"] == "recorded"], pts[pts["profiles"] != "recorded"]
            if len(rec) == 1 and len(der) == 1:
                ax.annotate("", xy=(rec["reserved_gib_s"].iloc[0], rec["oom_kills"].iloc[0]),
                            xytext=(der["reserved_gib_s"].iloc[0], der["oom_kills"].iloc[0]),
                            arrowprops={"arrowstyle": "->", "color": "grey", "linewidth": 0.7, "alpha": 0.7})
    for (x, y), (names, color) in labels.items():
        if names:
            ax.annotate(",".join(names), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)
    ax.set_xscale("log")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    swept = (sel["point"] != "-").any()
    return _finish(fig, ax, "memory reserved by the arm's limits (GiB·s, derived: over recorded step durations, "
                            "summed over traces)", "OOM kills (count, recorded by the kernel,\nsummed over traces)",
                   "Kills vs reserved memory: " + ("one point per swept limit, per arm" if swept else "per arm")
                   + ("\nfilled: recorded step profiles; hollow: the others (legend); arrows: to recorded"
                      if corpora else ""))


def sampling_peaks(points, missed_mb: float) -> Figure:
    """Each compared step's peak as recorded here (its own cgroup, the kernel's) against the one its
    source derived from ~1 Hz container samples (traces/sampling.py), log-log, y = x drawn; a
    derived peak under 0.1 MiB is drawn at 0.1 (the samples saw nothing)."""
    floor = 0.1
    fig, ax = plt.subplots(figsize=(6.5, 5))
    for kind in sorted({k for _, _, k in points}):
        sel = [(max(d, floor), max(r, floor)) for r, d, k in points if k == kind]
        ax.scatter([x for x, _ in sel], [y for _, y in sel], s=10, alpha=0.6, label=f"{kind} (n={len(sel)})")
    top = max([floor * 10, *(max(r, d) for r, d, _ in points)]) * 1.5
    ax.plot([floor, top], [floor, top], color="grey", linewidth=1, label="recorded = derived")
    ax.axhline(missed_mb, color="red", linewidth=0.8, linestyle=":", label=f"{missed_mb:g} MiB")
    ax.set_xscale("log")
    ax.set_yscale("log")
    return _finish(fig, ax, "step peak from ~1 Hz container samples (MiB over the step's baseline, derived)",
                   "step peak measured here (MiB, the step's cgroup, recorded)", "What 1 Hz sampling hid: step peaks")


def _finish(fig: Figure, ax, xlabel: str, ylabel: str, title: str) -> Figure:
    """Labels, title, a log-friendly grid and the legend beside the axes."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def save(fig: Figure, path) -> None:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
