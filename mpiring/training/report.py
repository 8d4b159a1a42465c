"""The end of a run: measurements combined over ranks, the theory beside them, a table, JSON.

Theory, for P parameters of b bytes, K optimizer values per parameter, N ranks:

    model state per rank     ddp (2+K) P b    zero1 (2 + K/N) P b    zero2 (1 + (1+K)/N) P b
                             zero3 (2+K)/N P b  (+ one layer in flight)
    sent per rank per step   ddp, zero1, zero2: 2(N-1)/N P b        zero3: 3(N-1)/N P b

For fp32 SGD with momentum (b=4, K=1) the ratios to DDP are the ZeRO paper's (8+4/N)/12,
(4+8/N)/12 and (12/N)/12.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy

from mpiring.training.trainer import TrainResult

_PER_RANK = ("model_state", "peak", "peak_transient", "params", "grads", "optimizer")


def expected_ratio(strategy: str, world_size: int, slots: int) -> float:
    """Persistent model state per rank relative to DDP's, by the formulas above."""
    n, k = world_size, slots
    held = {"ddp": 2 + k, "zero1": 2 + k / n, "zero2": 1 + (1 + k) / n, "zero3": (2 + k) / n}[strategy]
    return held / (2 + k)


def traffic_factor(strategy: str, world_size: int) -> tuple[float, str]:
    """Bytes each rank sends per step, in model sizes, and the formula as text."""
    n = world_size
    if strategy == "zero3":
        return 3 * (n - 1) / n, "3(N-1)/N"
    return 2 * (n - 1) / n, "2(N-1)/N"


def summarize(result: TrainResult, comm: Any) -> dict[str, Any]:
    """Collective: the run's report (the same dict on every rank): the keys of --report."""
    config, strategy = result.config, result.strategy
    mine = [float(result.memory[key]) for key in _PER_RANK]
    mine += [float(result.bytes_sent), result.step_seconds, result.comm_seconds, result.hidden_seconds]
    highest = comm.allreduce(numpy.array(mine), op="max")
    total = comm.allreduce(numpy.array(mine), op="sum")
    most = dict(zip(_PER_RANK, (int(v) for v in highest[: len(_PER_RANK)]), strict=True))
    n, steps_run = comm.size, result.steps_run
    itemsize = strategy.dtype.itemsize
    model_bytes = strategy.model.param_count * itemsize
    ddp_state = (2 + strategy.optimizer.slots) * model_bytes
    factor, formula = traffic_factor(config.strategy, n)
    # Time: the slowest rank's (every rank waits for it); communication: the mean over ranks.
    seconds, waited, hidden = highest[-3], total[-2] / n, total[-1] / n
    return {
        "strategy": config.strategy, "model_kind": config.model, "overlap": config.overlap,
        "world_size": n, "steps": len(result.losses), "dtype": config.dtype,
        "device": config.device, "batch_size": config.examples, "tokens_per_step": result.predictions,
        "seed": config.seed,
        "lr": config.learning_rate, "momentum": config.momentum,
        "model": strategy.model.config.as_dict(), "param_count": strategy.model.param_count,
        "losses": result.losses, "final_loss": result.losses[-1] if result.losses else None,
        "steps_run": steps_run, "resumed_from_step": result.start_step,
        "model_state_bytes_per_rank": most["model_state"],
        "peak_bytes_per_rank": most["peak"],
        "transient_peak_bytes_per_rank": most["peak_transient"],
        "memory_bytes_per_rank": {kind: most[kind] for kind in ("params", "grads", "optimizer")},
        "ddp_model_state_bytes_per_rank": ddp_state,
        "model_state_ratio_to_ddp": most["model_state"] / ddp_state,
        "expected_ratio_to_ddp": expected_ratio(config.strategy, n, strategy.optimizer.slots),
        "model_bytes": model_bytes,
        "bytes_sent_per_rank": total[-4] / n / steps_run if steps_run else 0.0,
        "bytes_sent_per_rank_theory": factor * model_bytes,
        "traffic_formula": f"{formula} x model bytes",
        "tokens_per_s": result.predictions * steps_run / seconds if seconds else 0.0,
        "step_seconds": seconds,
        "comm_seconds": waited,
        "hidden_seconds": hidden,
        "compute_seconds": max(seconds - waited, 0.0),
        "hidden_share": hidden / (hidden + waited) if hidden + waited else 0.0,
        "sample": result.sample,
    }


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.3f} MB"


def _render(rows: list[tuple[str, ...]]) -> str:
    """Rows of cells as aligned columns, the first left-aligned, a rule under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True))) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _name(r: dict[str, Any]) -> str:
    return r["strategy"] + (" +overlap" if r.get("overlap") else "")


def format_table(reports: list[dict[str, Any]]) -> str:
    """The summary table, one row per report: loss, throughput, memory and traffic vs theory."""
    rows = [("strategy", "ranks", "final loss", "tokens/s", "state/rank", "vs DDP", "expected",
             "peak/rank", "sent/rank/step", "theory")]
    for r in reports:
        final = "-" if r["final_loss"] is None else f"{r['final_loss']:.4f}"
        rows.append((
            _name(r), str(r["world_size"]), final, f"{r['tokens_per_s']:,.0f}",
            _mb(r["model_state_bytes_per_rank"]), f"{r['model_state_ratio_to_ddp']:.3f}",
            f"{r['expected_ratio_to_ddp']:.3f}", _mb(r["peak_bytes_per_rank"]),
            _mb(r["bytes_sent_per_rank"]), f"{_mb(r['bytes_sent_per_rank_theory'])} "
            f"({r['traffic_formula'].split(' x')[0]})",
        ))
    return _render(rows)


def format_time_table(reports: list[dict[str, Any]]) -> str:
    """Where a step's time goes, per report: compute, communication waited on, and communication
    in flight behind compute (hidden; only nonblocking collectives can hide)."""
    rows = [("strategy", "ranks", "tokens/s", "step ms", "compute ms", "comm waited ms", "comm hidden ms",
             "hidden share")]
    for r in reports:
        steps = max(r["steps_run"], 1)
        rows.append((
            _name(r), str(r["world_size"]), f"{r['tokens_per_s']:,.0f}",
            *(f"{r[key] * 1e3 / steps:.1f}" for key in ("step_seconds", "compute_seconds", "comm_seconds",
                                                        "hidden_seconds")),
            f"{r['hidden_share']:.0%}",
        ))
    return _render(rows)


def format_memory_table(reports: list[dict[str, Any]]) -> str:
    """Model state per rank by kind, its ratio to DDP against ZeRO's formula, and the gathered /
    in-flight buffers at their peak (reported apart: the formulas count persistent state only)."""
    rows = [("strategy", "ranks", "params", "grads", "optimizer", "state", "vs DDP", "formula", "gathered peak")]
    for r in reports:
        kinds = r["memory_bytes_per_rank"]
        rows.append((
            _name(r), str(r["world_size"]), *(_mb(kinds[k]) for k in ("params", "grads", "optimizer")),
            _mb(r["model_state_bytes_per_rank"]), f"{r['model_state_ratio_to_ddp']:.4f}",
            f"{r['expected_ratio_to_ddp']:.4f}", _mb(r["transient_peak_bytes_per_rank"]),
        ))
    return _render(rows)


def format_summary(report: dict[str, Any]) -> str:
    """What rank 0 prints at the end of a run: the tables, what the columns mean, a sample."""
    r = report
    text = [
        "", format_table([r]), "", format_time_table([r]), "", format_memory_table([r]), "",
        f"model: {r['param_count']:,} parameters = {_mb(r['model_bytes'])} in {r['dtype']}; "
        f"DDP holds {_mb(r['ddp_model_state_bytes_per_rank'])} of model state per rank "
        "(parameters, gradients, optimizer state)",
        f"time: {r['step_seconds']:.1f} s in steps = {r['compute_seconds']:.1f} s compute + "
        f"{r['comm_seconds']:.1f} s waiting on collectives; {r['hidden_seconds']:.1f} s of collectives in "
        "flight behind compute (with --overlap)",
    ]
    if r["sample"]:
        text += ["", "sample (the prompt is the text's first characters):", r["sample"]]
    return "\n".join(text)


def write_json(report: dict[str, Any], path: str) -> None:
    """Write the report atomically (a temporary file, then a rename)."""
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(report, handle, indent=1)
        handle.write("\n")
    os.replace(temporary, path)
