"""Pictures of runs (matplotlib, an optional dependency: pip install mpiring[plot])."""

from __future__ import annotations

from typing import Any

from mpiring.training.errors import TrainingError

_COLORS = {"ddp": "#4c72b0", "zero1": "#dd8452", "zero2": "#55a868", "zero3": "#c44e52"}
_STYLES = {"ddp": "-", "zero1": "--", "zero2": "-.", "zero3": ":"}


def pyplot() -> Any:
    """matplotlib.pyplot without a display, or a TrainingError saying how to get it."""
    try:
        import matplotlib
    except ImportError:
        raise TrainingError("plotting needs matplotlib: pip install matplotlib (or mpiring[plot])") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _loss_axes(ax: Any, reports: list[dict[str, Any]]) -> None:
    for r in reports:
        name = r["strategy"]
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], _STYLES.get(name, "-"),
                color=_COLORS.get(name), label=f"{name} ({r['world_size']} ranks)", linewidth=1.5)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats per character)")
    ax.grid(alpha=0.3)
    ax.legend()


def plot_run(report: dict[str, Any], path: str) -> None:
    """One run's loss curve."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    _loss_axes(ax, [report])
    ax.set_title(f"{report['strategy']} on {report['world_size']} ranks, {report['param_count']:,} parameters")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_strategies(reports: list[dict[str, Any]], path: str) -> None:
    """Loss curves of several strategies, their measured memory per rank as stacked bars and,
    when there are --overlap runs among the reports, where a step's time goes."""
    plt = pyplot()
    blocking = [r for r in reports if not r.get("overlap")] or reports
    timed = len(blocking) < len(reports)
    fig, axes = plt.subplots(1, 3 if timed else 2, figsize=(17 if timed else 12, 4.5),
                             gridspec_kw={"width_ratios": [3, 2, 2] if timed else [3, 2]})
    left, right = axes[0], axes[1]
    _loss_axes(left, blocking)
    n = blocking[0]["world_size"]
    left.set_title(f"same math: the curves coincide ({n} ranks, {blocking[0]['param_count']:,} parameters)")
    names = [r["strategy"] for r in blocking]
    bottom = [0.0] * len(blocking)
    for kind, color in (("params", "#4c72b0"), ("grads", "#55a868"), ("optimizer", "#dd8452")):
        heights = [r["memory_bytes_per_rank"][kind] / 1e6 for r in blocking]
        right.bar(names, heights, bottom=bottom, color=color, label=kind)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    transient = [(r["peak_bytes_per_rank"] - r["model_state_bytes_per_rank"]) / 1e6 for r in blocking]
    right.bar(names, transient, bottom=bottom, color="none", edgecolor="#555555", hatch="//",
              label="gathered / in flight (peak)")
    for x, r in enumerate(blocking):
        top = r["peak_bytes_per_rank"] / 1e6
        right.annotate(f"{r['model_state_ratio_to_ddp']:.2f}x\n({r['expected_ratio_to_ddp']:.2f})", (x, top),
                       ha="center", va="bottom", fontsize=9)
    right.set_ylabel("MB per rank")
    right.set_title("model state per rank: measured x DDP (theory)")
    right.set_ylim(0, 1.3 * max(r["peak_bytes_per_rank"] for r in blocking) / 1e6)
    right.legend(loc="upper right", fontsize=8)
    if timed:
        _time_axes(axes[2], reports)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _time_axes(ax: Any, reports: list[dict[str, Any]]) -> None:
    """Per strategy, blocking and overlapped: compute + communication waited on, per step, with
    the share of communication that was in flight behind compute written above."""
    labels = [r["strategy"] + ("\noverlap" if r.get("overlap") else "") for r in reports]
    order = sorted(range(len(reports)), key=lambda i: (reports[i]["strategy"], bool(reports[i].get("overlap"))))
    labels = [labels[i] for i in order]
    ordered = [reports[i] for i in order]
    per_step = [max(r["steps_run"], 1) / 1e3 for r in ordered]  # seconds -> ms per step
    compute = [r["compute_seconds"] / s for r, s in zip(ordered, per_step, strict=True)]
    waited = [r["comm_seconds"] / s for r, s in zip(ordered, per_step, strict=True)]
    ax.bar(labels, compute, color="#8c8c8c", label="compute")
    ax.bar(labels, waited, bottom=compute, color="#c44e52", label="communication waited on")
    for x, r in enumerate(ordered):
        if r.get("overlap"):
            ax.annotate(f"{r['hidden_share']:.0%}\nhidden", (x, compute[x] + waited[x]), ha="center",
                        va="bottom", fontsize=8)
    ax.set_ylabel("ms per step (slowest rank)")
    ax.set_title("step time: compute and communication")
    ax.set_ylim(0, 1.3 * max(c + w for c, w in zip(compute, waited, strict=True)))
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(loc="upper left", fontsize=8)
