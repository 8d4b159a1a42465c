"""Methods written out from a table, as MPICH generates its entry points: the nonblocking and
persistent forms of `Communicator`'s collectives and of the drop-in's uppercase ones take their
blocking form's parameters, and differ only in the one call their body makes; a forward (the
uppercase methods of `Communicator` and of mpiring.dropin's `Intracomm`) takes the parameters
of the method it calls.

    Communicator.allreduce(self, x, op="sum", *, out=None, ...)         written by hand
      -> iallreduce(self, x, op=..., *, out=..., ...):     return self._engine.start("allreduce", x, out, op, ...)
      -> allreduce_init(...):                               return self._engine.persistent("allreduce", ...)
    BufferAPI.Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM)             from buffer_api.DROPIN
      -> Communicator.Iallreduce(...):                      return self._buffers.Iallreduce(sendbuf, recvbuf, op)

The source of each method is written out and compiled, so that a call binds its arguments as
fast as a hand-written method; `inspect.signature` and the API reference show its parameters.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any


def method(owner: type, name: str, parameters: Sequence[inspect.Parameter], body: str, doc: str,
           returns: Any, module: str, names: dict[str, Any] | None = None) -> Callable[..., Any]:
    """A function `name(self, <parameters>)` whose body is `body` (which may name the parameters,
    `self` and the objects in `names`), documented by `doc`, for the class `owner` of module
    `module`. Each line of a body of several lines but the first starts with the function's
    indentation, four spaces."""
    defaults = {f"_default_{p.name}": p.default for p in parameters if p.default is not p.empty}
    listed, keyword_only = ["self"], False
    for p in parameters:
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            listed.append("*")
            keyword_only = True
        listed.append(p.name if p.default is p.empty else f"{p.name}=_default_{p.name}")
    namespace: dict[str, Any] = {**defaults, **(names or {})}
    exec(f"def {name}({', '.join(listed)}):\n    {body}\n", namespace)  # noqa: S102 - built from signatures here
    function = namespace[name]
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    function.__signature__ = inspect.Signature([self_parameter, *parameters], return_annotation=returns)
    function.__qualname__ = f"{owner.__name__}.{name}"
    function.__module__ = module
    function.__doc__ = doc
    return function


def parameters_of(function: Callable[..., Any]) -> list[inspect.Parameter]:
    """A method's parameters after `self`."""
    return list(inspect.signature(function).parameters.values())[1:]


def arguments_of(parameters: Sequence[inspect.Parameter]) -> str:
    """The arguments that pass `parameters` on as they were given: `a, b, c=c` (keyword-only by name)."""
    return ", ".join(f"{p.name}={p.name}" if p.kind is p.KEYWORD_ONLY else p.name for p in parameters)


def forward(owner: type, function: Callable[..., Any], held: str, module: str) -> Callable[..., Any]:
    """`owner`'s method of `function`'s name, signature and docstring, which calls the method of
    that name of the object in `self.<held>`."""
    name, parameters = function.__name__, parameters_of(function)
    return method(owner, name, parameters, f"return self.{held}.{name}({arguments_of(parameters)})",
                  function.__doc__ or "", inspect.signature(function).return_annotation, module)


def add_variants(owner: type, names: Sequence[str], notes: dict[str, str]) -> None:
    """Give `owner` `i<name>` and `<name>_init` for each blocking method `name`: its parameters,
    handed to the engine's `start` or `persistent` (`notes`: what a variant's docstring adds)."""
    for name in names:
        parameters = parameters_of(getattr(owner, name))
        given = {p.name for p in parameters}
        counts = ("(send_counts, recv_counts)" if "send_counts" in given else "counts" if "counts" in given
                  else "None")
        arguments = [repr(name), *(a if a in given else "None" for a in ("x", "out", "op", "root")), counts,
                     "algorithm", "timeout"]
        for kind, method_name, form, returns in (("start", f"i{name}", "Nonblocking", "CollectiveRequest"),
                                                 ("persistent", f"{name}_init", "Persistent", "PersistentRequest")):
            note = notes.get(method_name)
            setattr(owner, method_name, method(owner, method_name, parameters,
                                               f"return self._engine.{kind}({', '.join(arguments)})",
                                               f"{form} `{name}`." + (f" {note}" if note else ""), returns,
                                               owner.__module__))
