"""Notebook cells as the grader sees them: what a cell defines and uses, how to run one without
letting it take the grader down, and how to name a place in it the way Jupyter shows it.

Each cell is compiled under a file name that is its label and a run number ("<the `mlp` cell
#3>"), with its source registered in `linecache`, so tracebacks show the learner's own lines,
numbered from 1 within the cell, as Jupyter numbers them. The number keeps two runs of a cell
apart: code that reads its own source back (inspect.getsource, which Triton's `@triton.jit`
does) must find the version it was compiled from, not a later notebook's edit of the same cell.
"""

from __future__ import annotations

import ast
import itertools
import linecache
import symtable
import traceback
from dataclasses import dataclass

from utils.sandbox import Hang, exit_description, guarded, kind_of

_RUNS = itertools.count(1)


def python_source(cell_source: str) -> str:
    """Drop IPython-only lines (%magics, !shell) that plain Python cannot compile; keep the line
    count, so that line numbers stay those of the cell."""
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in cell_source.splitlines()
    )


def register_source(filename: str, source: str) -> None:
    """Let tracebacks (and pytest) show the lines of code compiled under `filename`."""
    lines = [line + "\n" for line in source.splitlines()]
    linecache.cache[filename] = (len(source), None, lines, filename)


@dataclass(frozen=True)
class Names:
    bound: frozenset[str]  # names the cell binds at its top level (assignments, defs, imports)
    free: frozenset[str]  # global names the cell (or any function in it) reads but not binds
    free_at_top: frozenset[str]  # those of them read at the top level, as the cell runs


def cell_names(cell_source: str) -> Names | None:
    """What a cell binds and what it needs from other cells; None if it does not compile."""
    try:
        table = symtable.symtable(python_source(cell_source), "<cell>", "exec")
    except SyntaxError:
        return None
    bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    free: set[str] = set()
    stack = [table]
    while stack:
        scope = stack.pop()
        for sym in scope.get_symbols():
            if scope is table:
                if sym.is_referenced() and sym.get_name() not in bound:
                    free.add(sym.get_name())
            elif sym.is_global() and sym.is_referenced():
                free.add(sym.get_name())
        stack.extend(scope.get_children())
    at_top = {s.get_name() for s in table.get_symbols() if s.is_referenced()} - bound
    return Names(frozenset(bound), frozenset(free - bound), frozenset(at_top))


def raises_not_implemented(node: ast.AST | None) -> bool:
    """Whether `node` is a `raise NotImplementedError` (or `...()`): the blank exercise's line."""
    if not isinstance(node, ast.Raise) or node.exc is None:
        return False
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def defined_by(cell_source: str) -> frozenset[str]:
    names = cell_names(cell_source)
    return names.bound if names else frozenset()


def innermost_line(err: BaseException, filename: str) -> int | None:
    """The line of `filename` (a cell) that was running when `err` was raised, innermost."""
    line = None
    for frame in traceback.extract_tb(err.__traceback__):
        if frame.filename == filename:
            line = frame.lineno
    return line


def run_cell(source: str, namespace: dict, label: str, budget_s: float) -> str | None:
    """Execute one cell under `label` ("the `mlp` cell"); None, or a sentence saying what went
    wrong and where. Exits and infinite loops are stopped here, not in the grader."""
    filename = f"<{label} #{next(_RUNS)}>"
    source = python_source(source)
    register_source(filename, source)
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as err:
        return f"{type(err).__name__} in {label}, line {err.lineno}: {err.msg}"
    try:
        with guarded(budget_s):
            exec(code, namespace)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001 - a cell may raise anything, SystemExit too
        line = innermost_line(err, filename)
        where = f"{label}, line {line}" if line else label
        kind = kind_of(err)
        if isinstance(err, Hang):
            return f"{where} did not finish within {budget_s:.0f} s: an infinite loop?"
        if kind == "exit":
            return f"{exit_description(err)} in {where}"
        message = f"{where} raised {type(err).__name__}: {err}"
        if isinstance(err, NameError):
            message += f". {name_error_hint(err)}"
        return message
    return None


def name_error_hint(err: NameError, live: bool = False) -> str:
    if isinstance(err, UnboundLocalError):  # a local read before it is set: not a missing cell
        return (
            "A variable of the function is read before the line that sets it: set it first "
            "(or, if you meant a global, do not assign to that name in the function)"
        )
    name = getattr(err, "name", None) or "it"
    if live:
        return (
            f"`{name}` is not defined in this kernel: run the cell that defines it, then this "
            "check again (`course grade` and `pytest` read your saved notebook and run that cell "
            "themselves, so they can pass where this check fails)"
        )
    return (
        f"Grading runs the setup cells, the exercise cells and the cells that define names they "
        f"use; none of them defines `{name}`. Define it in the exercise's cell, or in a cell of "
        "its own before it"
    )
