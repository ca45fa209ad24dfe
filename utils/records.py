"""The one writer of benchmark records (`benchmarks/results/*.json`), and what every record says
the same way: the machine it ran on, a rate from the median of timed runs (and the run whose
figure is the median), a goal's verdict.

Each benchmark prints one JSON object, its result (`emit`); with `--record PATH` it also writes
the record a reader quotes (`record`): the command that ran, the machine (described by
`machine`, plus what only the person running it knows: `--machine-note "idle, load 0.4"`), the
date, the commit of the code, and the result. Chapters, the README's tests and the benchmarks'
own tests read the records' keys (`result`, `machine`, `date`, `code`; each result's `goals`,
every verdict with its `met`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from utils import REPO_ROOT


def machine(device=None) -> dict:
    """The machine a result was measured on, one shape for every benchmark: the processor, the
    platform, CPUs, Python, torch and its intra-op threads, and the device (`"cpu"`, or the
    GPU's name and compute capability when `device` is a CUDA device)."""
    import torch

    described = {
        "processor": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": "cpu",
    }
    if device is not None and str(device).startswith("cuda"):
        described["device"] = torch.cuda.get_device_name(device)
        described["compute_capability"] = list(torch.cuda.get_device_capability(device))
    return described


def rate(count: float, seconds: list[float], digits: int | None = 1) -> float:
    """`count` things (tokens, positions) per second of the median of timed runs' `seconds`,
    to `digits` decimals (None: unrounded)."""
    per_s = count / statistics.median(seconds)
    return per_s if digits is None else round(per_s, digits)


def us_each(seconds: list[float], count: float, digits: int | None = 1) -> float:
    """Microseconds per thing (a token, a step) of the median of timed runs' `seconds`, to
    `digits` decimals (None: unrounded)."""
    us = 1e6 * statistics.median(seconds) / count
    return us if digits is None else round(us, digits)


def median_run(runs: list, key: Callable):
    """The run whose `key` is the median of the runs' (of an even count, the upper of the two
    in the middle): the run a record reports in full."""
    return sorted(runs, key=key)[len(runs) // 2]


def verdict(met: bool | None, **measured) -> dict:
    """A goal's verdict as every record writes it: what was measured (the fields given, in
    their order) and `met` (None where it could not be measured here)."""
    return {**measured, "met": met}


def goal(what: str, measured: float | None, target: float, at_least: bool) -> dict:
    """A goal with a numeric target: what is measured, the value, the target, and whether it is
    met (None when it could not be measured here)."""
    met = None if measured is None else (measured >= target if at_least else measured <= target)
    return verdict(met, what=what, measured=measured, target=target)


def add_record_options(parser: argparse.ArgumentParser) -> None:
    """`--record PATH` and `--machine-note TEXT`, the options of every benchmark."""
    parser.add_argument(
        "--record", metavar="PATH", default=None,
        help="also write the result as a record here (benchmarks/results/NAME.json)",
    )  # fmt: skip
    parser.add_argument(
        "--machine-note", metavar="TEXT", default=None,
        help="with --record: what the record says of the machine beyond what it can see "
        "(idle or shared, its load average)",
    )  # fmt: skip


def command() -> str:
    """The command line that is running, as a reader would type it from the repository."""
    script = Path(sys.argv[0]).resolve()
    if script.is_relative_to(REPO_ROOT):
        script = script.relative_to(REPO_ROOT)
    return shlex.join(["python", str(script), *sys.argv[1:]])


def code_version() -> str:
    """The commit the code is at ("commit abc1234"; "+ changes" when the tree differs)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown (not a git checkout)"
    changed = git("status", "--porcelain", "--untracked-files=no")
    return f"commit {commit}" + (" + uncommitted changes" if changed else "")


def describe(result: dict, note: str | None = None) -> str:
    """The record's `machine`: the result's own `machine` (or one described now) in words,
    then the note."""
    m = result.get("machine") if isinstance(result.get("machine"), dict) else machine()
    words = (
        f"{m['processor']} ({m['cpus']} CPUs), {m['platform']}, Python {m['python']}, torch "
        f"{m['torch']}, {m['torch_threads']} PyTorch thread"
        + ("s" if m["torch_threads"] != 1 else "")
        + ("" if m["device"] == "cpu" else f", {m['device']}")
    )
    return f"{words}; {note}" if note else words


def record(result: dict, note: str | None = None) -> dict:
    """The record of a result: the command, the machine, the date, the code, the result."""
    return {
        "command": command(),
        "machine": describe(result, note),
        "date": datetime.date.today().isoformat(),
        "code": code_version(),
        "result": result,
    }


def emit(result: dict, args: argparse.Namespace | None = None) -> None:
    """Print the result as one JSON object; with `--record PATH`, also write its record."""
    print(json.dumps(result, indent=2))
    path = getattr(args, "record", None)
    if path:
        written = record(result, getattr(args, "machine_note", None))
        Path(path).write_text(json.dumps(written, indent=2, ensure_ascii=False) + "\n")
        print(f"recorded in {path}", file=sys.stderr)
