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
    """Loss curves of several strategies, and their measured memory per rank as stacked bars."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    _loss_axes(left, reports)
    n = reports[0]["world_size"]
    left.set_title(f"same math: the curves coincide ({n} ranks, {reports[0]['param_count']:,} parameters)")
    names = [r["strategy"] for r in reports]
    bottom = [0.0] * len(reports)
    for kind, color in (("params", "#4c72b0"), ("grads", "#55a868"), ("optimizer", "#dd8452")):
        heights = [r["memory_bytes_per_rank"][kind] / 1e6 for r in reports]
        right.bar(names, heights, bottom=bottom, color=color, label=kind)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    transient = [(r["peak_bytes_per_rank"] - r["model_state_bytes_per_rank"]) / 1e6 for r in reports]
    right.bar(names, transient, bottom=bottom, color="none", edgecolor="#555555", hatch="//",
              label="transient peak")
    for x, r in enumerate(reports):
        top = r["peak_bytes_per_rank"] / 1e6
        right.annotate(f"{r['model_state_ratio_to_ddp']:.2f}x\n({r['expected_ratio_to_ddp']:.2f})", (x, top),
                       ha="center", va="bottom", fontsize=9)
    right.set_ylabel("MB per rank")
    right.set_title("model state per rank: measured x DDP (theory)")
    right.set_ylim(0, 1.3 * max(r["peak_bytes_per_rank"] for r in reports) / 1e6)
    right.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
