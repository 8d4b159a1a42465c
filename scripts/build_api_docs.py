"""Build the API reference from the docstrings: docs/api-reference.md, and HTML with pdoc.

    python scripts/build_api_docs.py                 # rewrite docs/api-reference.md
    python scripts/build_api_docs.py --check         # fail if it is stale, or a docstring is missing or
                                                     # names something that does not exist (CI)
    python scripts/build_api_docs.py --html DIR      # also the HTML reference of the package, by pdoc
                                                     # (pip install -e '.[docs]'; docs/api-html is ignored)

The Markdown page covers mpiring/__init__.py's exports: Communicator (its attributes, every
collective in its blocking, nonblocking and persistent forms, plan_of, free, and the mpi4py
drop-in's methods), the requests the calls return, every exception with its attributes, the
functions and the ops. It imports mpiring without MPI running a job (a singleton MPI_Init).
"""

from __future__ import annotations

import argparse
import inspect
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mpiring  # noqa: E402
from mpiring import errors, launch  # noqa: E402
from mpiring.buffer_api import Request  # noqa: E402
from mpiring.catalogue import CATALOGUE as COLLECTIVES  # noqa: E402
from mpiring.engine.requests import CollectiveRequest, PersistentRequest  # noqa: E402

PAGE = ROOT / "docs" / "api-reference.md"

# Members whose docstrings live in files the reference cannot vouch for here; their text, until
# the docstrings say it themselves. Anything else without a docstring fails --check.
FALLBACK = {
    "Communicator.rank": "This rank's number in the communicator, 0 to size-1.",
    "Communicator.size": "The number of ranks in the communicator.",
    "Traffic.bytes_sent": "Bytes handed to MPI's sends.",
    "Traffic.bytes_received": "Bytes MPI's receives delivered.",
    "Traffic.messages": "Messages handed to MPI (sends and receives).",
    "Traffic.reset": "Start counting again from zero.",
}
ATTRIBUTES = {  # attributes set in __init__ (not properties): what each holds
    "Communicator.timeout": "The default timeout of this communicator's calls in seconds; None: no limit.",
}
REQUEST_MEMBERS = {
    CollectiveRequest: ["test", "wait", "result", "done"],
    PersistentRequest: ["start", "test", "wait", "result", "free"],
    Request: ["Wait", "Test", "Start", "Free", "Waitall", "Testall", "Startall"],
}
EXCEPTIONS = [errors.MpiringError, errors.ArgumentError, errors.ArgumentTypeError, errors.CommunicationError,
              errors.CollectiveMismatchError, errors.MessageMismatchError, errors.CollectiveTimeout,
              errors.CommunicatorBrokenError, errors.CommunicatorFreedError, errors.ConcurrentUseError,
              errors.RankLostError, errors.CommunicatorRevokedError, launch.LaunchError]
FUNCTIONS = [mpiring.bind_device, mpiring.cuda_aware, mpiring.cuda_awareness, mpiring.empty]


class Missing(Exception):
    pass


def doc(obj: object, name: str, missing: list[str]) -> str:
    text = inspect.getdoc(obj) if obj is not None else None
    if obj is not None and isinstance(obj, property):
        text = inspect.getdoc(obj.fget) or text
    inherited = obj is not None and text == inspect.getdoc(type(obj)) and not isinstance(obj, type)
    if not text or inherited:
        if name in FALLBACK:
            return FALLBACK[name]
        missing.append(name)
        return "(undocumented)"
    return text


def signature(function: object, name: str) -> str:
    try:
        sig = str(inspect.signature(function))
    except (TypeError, ValueError):
        return f"{name}(...)"
    sig = re.sub(r"\bself(, )?", "", sig, count=1).replace("(, ", "(")
    sig = sig.replace("'", "")
    sig = re.sub(r"<mpi4py\.MPI\.Info object at 0x[0-9a-f]+>", "MPI.INFO_NULL", sig)
    sig = re.sub(r"<mpi4py\.MPI\.Op object at 0x[0-9a-f]+>", "MPI.SUM", sig)  # the only Op default
    if " object at 0x" in sig:
        raise ValueError(f"{name}: a default without a stable name: {sig}")
    return f"{name}{sig}"


def block(text: str) -> str:
    """A docstring as Markdown: its paragraphs kept, indented examples as code."""
    out, code = [], []
    for line in text.splitlines():
        if line.startswith("    "):
            code.append(line[4:])
            continue
        if code:
            out += ["", "```python", *code, "```", ""]
            code = []
        out.append(line)
    if code:
        out += ["", "```python", *code, "```"]
    return "\n".join(out).strip()


def member(cls: type, name: str, missing: list[str], title: str | None = None) -> list[str]:
    obj = inspect.getattr_static(cls, name)
    qualified = f"{cls.__name__}.{name}"
    if isinstance(obj, property):
        return [f"#### `{title or name}`", "", block(doc(obj, qualified, missing)), ""]
    function = getattr(cls, name)
    heading = signature(function, name) if callable(function) else name
    return [f"#### `{title or heading}`", "", block(doc(function, qualified, missing)), ""]


def init_attributes(cls: type) -> list[str]:
    """The public attributes an exception's __init__ sets."""
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith("mpiring") and "__init__" in vars(klass):
            source = inspect.getsource(vars(klass)["__init__"])
            for name in re.findall(r"self\.([a-z]\w*)\s*=", source):
                if name not in names:
                    names.append(name)
    return names


ATTRIBUTE_MEANINGS = {
    "collective": "the collective that raised (or `mpiring` for an environment variable)",
    "argument": "the argument (or environment variable) at fault",
    "problem": "what is wrong with it",
    "algorithm": "the algorithm that was running (`auto` before it was chosen)",
    "step": "the step it waited in",
    "waiting_on": "what it still waited for, one string per peer (`receive from rank 1`, ...)",
    "seconds": "the timeout in seconds",
    "notice_from": "the rank whose timeout notice ended this wait, or None when this rank's own deadline came",
    "lost": "the ranks lost, in the communicator's numbers",
    "revoked": "whether the communicator was also revoked",
}


def page(missing: list[str]) -> str:
    C = mpiring.Communicator
    lines = [
        "# API reference",
        "",
        "<!-- Generated by scripts/build_api_docs.py from the docstrings: edit them, not this page. -->",
        "",
        f"mpiring {mpiring.__version__}. Everything `import mpiring` exports; the guide to using it is",
        "[api.md](api.md), and every error case is in [errors.md](errors.md).",
        "",
        "- [Communicator](#communicator): [attributes](#attributes), [blocking collectives](#blocking-collectives),",
        "  [nonblocking](#nonblocking-collectives), [persistent](#persistent-collectives),",
        "  [other methods](#other-methods), [a lost rank](#a-lost-rank), [the mpi4py drop-in](#the-mpi4py-drop-in)",
        "- [Requests](#requests)",
        "- [Exceptions](#exceptions)",
        "- [Functions](#functions), [Traffic](#traffic), [Ops](#ops)",
        "",
        "## Communicator",
        "",
        f"### `mpiring.{signature(C.__init__, 'Communicator')}`",
        "",
        block(doc(C, "Communicator", missing)),
        "",
        "### Attributes",
        "",
    ]
    for name in ("rank", "size", "mpi", "traffic"):
        lines += member(C, name, missing)
    for qualified, text in ATTRIBUTES.items():
        lines += [f"#### `{qualified.split('.')[1]}`", "", text, ""]
    lines += ["### Blocking collectives", ""]
    for name in COLLECTIVES:
        lines += member(C, name, missing)
    lines += ["### Nonblocking collectives", "",
              "Each takes its blocking form's arguments and returns a [CollectiveRequest](#collectiverequest).", ""]
    for name in COLLECTIVES:
        lines += member(C, f"i{name}", missing)
    lines += ["### Persistent collectives", "",
              "Each takes its blocking form's arguments and returns a [PersistentRequest](#persistentrequest).", ""]
    for name in COLLECTIVES:
        lines += member(C, f"{name}_init", missing)
    lines += ["### Other methods", ""]
    for name in ("plan_of", "free"):
        lines += member(C, name, missing)
    lines += ["### A lost rank", "",
              "With survival on (`survive=True` or MPIRING_SURVIVE=1): [lost-rank.md](lost-rank.md).", ""]
    for name in ("survives", "lost", "revoke", "is_revoked", "agree", "shrink", "acknowledge_lost"):
        lines += member(C, name, missing)
    lines += ["### The mpi4py drop-in", "",
              "mpi4py's uppercase buffer API on mpiring's collectives ([dropin.md](dropin.md)); the I-forms and",
              "`*_init` forms return a [Request](#request).", ""]
    uppercase = sorted(name for name in dir(C) if name[:1].isupper())
    lines += ["| method | what it does |", "| --- | --- |"]
    for name in uppercase:
        text = doc(getattr(C, name), f"Communicator.{name}", missing).split("\n\n")[0].replace("\n", " ")
        lines.append(f"| `{signature(getattr(C, name), name)}` | {text.replace('|', '&#124;')} |")
    lines += ["", "## Requests", ""]
    for cls, names in REQUEST_MEMBERS.items():
        lines += [f"### {cls.__name__}", "", block(doc(cls, cls.__name__, missing)), ""]
        for name in names:
            lines += member(cls, name, missing)
    lines += ["## Exceptions", "",
              "Every exception mpiring raises is a `mpiring.MpiringError`; `LaunchError` is",
              "`mpiring.launch.LaunchError`.",
              ""]
    for cls in EXCEPTIONS:
        bases = ", ".join(f"`{base.__name__}`" for base in cls.__bases__)
        lines += [f"### {cls.__name__}", "", f"A subclass of {bases}.", "", block(doc(cls, cls.__name__, missing)), ""]
        attributes = init_attributes(cls)
        if attributes:
            lines += ["| attribute | holds |", "| --- | --- |"]
            for name in attributes:
                if name not in ATTRIBUTE_MEANINGS:
                    missing.append(f"{cls.__name__}.{name} (an attribute: add it to ATTRIBUTE_MEANINGS)")
                lines.append(f"| `{name}` | {ATTRIBUTE_MEANINGS.get(name, '(undocumented)')} |")
            lines.append("")
    lines += ["## Functions", ""]
    for function in FUNCTIONS:
        lines += [f"### `mpiring.{signature(function, function.__name__)}`", "",
                  block(doc(function, function.__name__, missing)), ""]
    lines += ["## Traffic", "", block(doc(mpiring.Traffic, "Traffic", missing)), ""]
    for name in ("bytes_sent", "bytes_received", "messages", "reset"):
        lines += member(mpiring.Traffic, name, missing)
    lines += ["## Ops", "",
              "The `op=` of the reducing collectives, as strings or as these constants:",
              "", "| constant | value |", "| --- | --- |"]
    for name in ("SUM", "PROD", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR"):
        lines.append(f"| `mpiring.{name}` | `{getattr(mpiring, name)!r}` |")
    lines += ["", f"`mpiring.OPS` is the tuple of every op: `{mpiring.OPS!r}`.", ""]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).rstrip() + "\n"


def broken_references(text: str) -> list[str]:
    """Names in backticks that look like the package's (`mpiring.x.y`, `Communicator.x`) and do not exist."""
    broken = []
    for name in sorted(set(re.findall(r"`((?:mpiring|Communicator)\.[A-Za-z_][\w.]*)`", text))):
        parts = name.split(".")
        obj: object = mpiring if parts[0] == "mpiring" else mpiring.Communicator
        for part in parts[1:]:
            if not hasattr(obj, part):
                try:
                    obj = __import__(f"{getattr(obj, '__name__', '')}.{part}", fromlist=["_"])
                    continue
                except ImportError:
                    broken.append(name)
                    break
            obj = getattr(obj, part)
    return broken


def html(directory: str) -> None:
    """The HTML reference of the whole package, by pdoc (docs extra)."""
    command = [sys.executable, "-m", "pdoc", "--docformat", "markdown", "-o", directory, "mpiring",
               "!mpiring.training", "!mpiring.bench", "!mpiring.cluster", "!mpiring.torch", "!mpiring.train",
               "!mpiring.gpu"]
    subprocess.run(command, check=True, cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the page is stale or a docstring is missing")
    parser.add_argument("--html", metavar="DIR", help="also write pdoc's HTML reference to DIR")
    args = parser.parse_args(argv)
    missing: list[str] = []
    text = page(missing)
    problems = [f"no docstring: {name}" for name in missing]
    problems += [f"a docstring names {name}, which does not exist" for name in broken_references(text)]
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            problems.append(f"{PAGE.relative_to(ROOT)} is stale: run python scripts/build_api_docs.py")
    else:
        PAGE.write_text(text)
        print(f"wrote {PAGE.relative_to(ROOT)}")
    if args.html:
        html(args.html)
        print(f"wrote {args.html}/mpiring.html")
    for problem in problems:
        print(f"build_api_docs: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
