"""What the benchmark writes: the aligned table on rank 0 (nccl-tests' layout), CSV, JSON and a
busbw-versus-size plot. The table, the CSV and the JSON carry the same fields (`Result`).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import os
import platform
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from mpi4py import MPI

from mpiring import host_memory
from mpiring.bench import timing
from mpiring.bench.device import Device
from mpiring.bench.harness import Result
from mpiring.bench.options import Options, format_bytes
from mpiring.bench.table import FORMS

FIELDS = [field.name for field in dataclasses.fields(Result)]


def _time(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.1f}" if value < 10_000 else f"{value:.0f}"


def _fixed(digits: int) -> Callable[[Any], str]:
    return lambda value: "-" if value is None else f"{value:.{digits}f}"


@dataclass(frozen=True)
class Column:
    name: str
    unit: str
    field: str
    width: int
    show: Callable[[Any], str] = str


def _timing_columns(prefix: str) -> list[Column]:
    """time avg/min/max, algbw, busbw of mpiring (prefix '') or of native MPI ('native_')."""
    return [
        Column("time", "(us)", f"{prefix}time_us", 8, _time),
        Column("min", "(us)", f"{prefix}time_min_us", 8, _time),
        Column("max", "(us)", f"{prefix}time_max_us", 8, _time),
        Column("algbw", "(GB/s)", f"{prefix}algbw_gbs", 6, _fixed(2)),
        Column("busbw", "(GB/s)", f"{prefix}busbw_gbs", 6, _fixed(2)),
    ]


# (group title, its columns): the table's layout, in order.
GROUPS: list[tuple[str, list[Column]]] = [
    ("", [Column("size", "(B)", "size_bytes", 10), Column("count", "(elements)", "count", 10)]),
    ("mpiring", _timing_columns("")),
    ("native MPI", _timing_columns("native_")),
    ("", [Column("ratio", "nat/ours", "ratio", 8, _fixed(2))]),
    ("ceiling", [Column("time", "(us)", "ceiling_time_us", 8, _time),
                     Column("eff", "(%)", "efficiency_pct", 5, _fixed(0))]),
    ("", [Column("#wrong", "", "wrong", 6)]),
]
_GAP = " "


def table_header() -> str:
    """Three '#' lines: group titles over their columns, column names, units."""
    titles, names, units = ["#"], ["#"], ["#"]
    for title, columns in GROUPS:
        span = sum(c.width for c in columns) + len(_GAP) * (len(columns) - 1)
        titles.append(f" {title} ".center(span, "-") if title else " " * span)
        names.append(_GAP.join(c.name.rjust(c.width) for c in columns))
        units.append(_GAP.join(c.unit.rjust(c.width) for c in columns))
    return "\n".join(_GAP.join(line).rstrip() for line in (titles, names, units))


def table_row(result: Result) -> str:
    cells = [" "]  # under the header's '#'
    for _, columns in GROUPS:
        cells.append(_GAP.join(c.show(getattr(result, c.field)).rjust(c.width) for c in columns))
    return _GAP.join(cells)


def metadata(options: Options, world: MPI.Intracomm, device: Device) -> dict[str, Any]:
    """The run's context: versions, MPI library, machine, flags."""
    import mpi4py
    import numpy

    import mpiring

    return {
        "tool": "mpiring-bench",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), "-m", "mpiring.bench", *sys.argv[1:]]),
        "mpiring": mpiring.__version__,
        "mpi4py": mpi4py.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "mpi_library": mpi_library_name(),
        "mpi_library_version": MPI.Get_library_version().replace("\0", "").strip(),
        "mpi_standard": ".".join(map(str, MPI.Get_version())),
        "ranks": world.Get_size(),
        "hosts": sorted(set(world.allgather(socket.gethostname()))),
        "cpu_model": cpu_model(),
        "nproc": os.cpu_count(),
        # The machine may be shared: how busy it was when this run started (rank 0's view).
        "load_average": list(os.getloadavg()),
        "device": device.name,
        "native_buffers": device.note,
        "host_pages": host_memory.describe(),
        "forms": list(options.forms),
        "statistic": timing.describe(options.iters, options.reps, options.warmup, options.min_batch)
        + (f"; calls cycle through {options.rotate} buffer sets" if options.rotate > 1 else ""),
        "options": {
            key: value.name if key == "dtype" else list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(options).items()
        },
    }


def mpi_library_name() -> str:
    """'MPICH Version: 5.0.2', 'Open MPI v5.0.11': the library's first line, up to any comma."""
    first = MPI.Get_library_version().replace("\0", "").strip().splitlines()[0]
    return " ".join(first.split(",")[0].split())


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def preamble(meta: dict[str, Any]) -> str:
    return "\n".join([
        f"# mpiring-bench  mpiring {meta['mpiring']}  mpi4py {meta['mpi4py']}  numpy {meta['numpy']}  "
        f"python {meta['python']}",
        f"# MPI: {meta['mpi_library']}  ranks {meta['ranks']}  hosts {','.join(meta['hosts'])}  "
        f"cpu {meta['cpu_model']} x{meta['nproc']}",
        f"# {meta['statistic']}",
        f"# host buffers, mpiring's and the MPI library's alike: {meta['host_pages']}",
        "# algbw = S/time, busbw = algbw * bus factor (nccl-tests); ratio = native time / mpiring time "
        "(> 1: mpiring faster);",
        "# ceiling = the messages of mpiring's schedule alone, without its arithmetic (device calls: the "
        "ring's, as bare Sendrecv); eff = ceiling time / mpiring time; #wrong = elements differing from native",
        *(f"# form {name}: {FORMS[name]}" for name in meta["forms"]),
    ])


def block_header(result_like: dict[str, Any], device: Device) -> str:
    """The line that opens one collective x algorithm block of rows."""
    parts = [f"# {result_like['collective']}", f"algorithm {result_like['algorithm']}",
             f"form {result_like['form']}", f"dtype {result_like['dtype']}"]
    if result_like["op"] is not None:
        parts.append(f"op {result_like['op']}")
    if result_like["root"] is not None:
        parts.append(f"root {result_like['root']}")
    if result_like["size_bytes"]:
        parts.append(f"bus factor {result_like['bus_factor']:.3f}")
    parts.append(f"device {device.name} (native: {device.note})")
    return "\n" + "  ".join(parts) + "\n" + table_header()


def write_csv(path: str, results: list[Result]) -> None:
    with open(path, "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=FIELDS)
        writer.writeheader()
        for result in results:
            writer.writerow(dataclasses.asdict(result))


def write_json(path: str, meta: dict[str, Any], results: list[Result]) -> None:
    with open(path, "w") as stream:
        json.dump({"meta": meta, "results": [dataclasses.asdict(r) for r in results]}, stream, indent=1)
        stream.write("\n")


def plot(path: str, meta: dict[str, Any], results: list[Result]) -> None:
    """busbw against size (log x), mpiring's algorithms against native MPI and the ceiling,
    one panel per collective (barrier moves no data and is left out)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here, and none needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    collectives = list(dict.fromkeys(r.collective for r in results if r.size_bytes))
    if not collectives:
        raise ValueError("--plot: nothing to plot (only collectives that move no data were run)")
    columns = min(len(collectives), 4)
    rows = -(-len(collectives) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(max(6.0, 4.2 * columns), 3.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, collectives, strict=False):
        mine = [r for r in results if r.collective == name and r.form == results[0].form]
        for algorithm in dict.fromkeys(r.algorithm for r in mine):
            runs = [r for r in mine if r.algorithm == algorithm]
            ax.plot([r.size_bytes for r in runs], [r.busbw_gbs for r in runs], "o-", ms=3,
                    label=f"mpiring {algorithm}")
        # The native and ceiling runs repeat for every algorithm; show the first algorithm's.
        first = [r for r in mine if r.algorithm == mine[0].algorithm]
        sizes = [r.size_bytes for r in first]
        ax.plot(sizes, [r.native_busbw_gbs for r in first], "s--", ms=3, color="black", label="native MPI")
        ax.plot(sizes, [r.ceiling_busbw_gbs for r in first], ":", color="gray", label="p2p ceiling")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: format_bytes(int(value))))
        ax.set_title(name)
        ax.set_xlabel("size S (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(collectives):]:
        ax.set_visible(False)
    figure.suptitle(f"mpiring vs {meta['mpi_library']}: {meta['ranks']} ranks, "
                    f"{meta['options']['dtype']}, {meta['device']}", fontsize="medium")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def verdicts(results: list[Result]) -> list[str]:
    """One line per collective, algorithm and form: where mpiring beats the MPI library, and by how much."""
    blocks: dict[tuple[str, str, str], list[Result]] = {}
    for result in results:
        blocks.setdefault((result.collective, result.algorithm, result.form), []).append(result)
    lines = []
    for (collective, algorithm, form), rows in blocks.items():
        wins = [r for r in rows if r.ratio >= 1]
        losses = [r for r in rows if r.ratio < 1]
        parts = []
        if wins:
            best = max(wins, key=lambda r: r.ratio)
            parts.append(f"faster at {len(wins)} of {len(rows)} sizes "
                         f"(best {best.ratio:.2f}x at {_size(best.size_bytes)})")
        if losses:
            worst = min(losses, key=lambda r: r.ratio)
            parts.append(f"slower at {len(losses)} of {len(rows)} "
                         f"(worst {1 / worst.ratio:.2f}x slower at {_size(worst.size_bytes)})")
        label = algorithm if form == "best" else f"{algorithm}, {form}"
        lines.append(f"# verdict {collective} ({label}): " + "; ".join(parts))
    return lines


class Reporter:
    """Prints rows as they are measured (rank 0 only) and writes the files at the end."""

    def __init__(self, meta: dict[str, Any], device: Device, stream: TextIO = sys.stdout) -> None:
        self.meta = meta
        self.device = device
        self.stream = stream
        self._block: tuple[str, str, str] | None = None
        self._print(preamble(meta))

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def add(self, result: Result) -> None:
        block = (result.collective, result.algorithm, result.form)
        if block != self._block:
            self._block = block
            self._print(block_header(dataclasses.asdict(result), self.device))
        self._print(table_row(result))

    def finish(self, options: Options, results: list[Result]) -> None:
        self._print("")
        for line in verdicts(results):
            self._print(line)
        wrong = sum(r.wrong for r in results)
        self._print(f"\n# #wrong in all: {wrong} {'OK' if wrong == 0 else 'FAILED'}")
        if options.csv:
            write_csv(options.csv, results)
        if options.json:
            write_json(options.json, self.meta, results)
        if options.plot:
            plot(options.plot, self.meta, results)
        for flag in ("csv", "json", "plot"):
            if getattr(options, flag):
                self._print(f"# wrote {getattr(options, flag)}")
