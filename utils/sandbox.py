"""Run learner code where it cannot take the grader down: one forked child process per call.

The grader (pytest, `course grade`, a notebook's `check(...)`) keeps everything it has loaded:
models, fixtures, the learner's namespace. For each call into learner code it forks; the child
inherits all of that for free (copy-on-write), runs the call under a time budget and sends back
a picklable summary. Whatever the learner's code does there, the grader survives:

    an infinite loop       SIGALRM in the child raises `Hang` where the code is stuck, so the
                           summary can say where; a child stuck inside C code is killed
    sys.exit(), exit()     SystemExit is caught in the child and summarised like an error
    os._exit(), os.abort() replaced in the child by functions that raise `ExitCalled`
    anything else fatal    the child dies; the parent reports how (exit code or signal)
    in-place changes       to shared models, tensors or globals stay in the child

Where a child cannot do the work, calls run in this process under the same summary rules; the
grader then undoes the names it bound for the test (utils/grading.py, `_prepared`), but an
in-place change to a shared object stays:
    no `os.fork`           Windows: an infinite loop is then stopped by pytest-timeout only
    CUDA available         a child forked after its parent used CUDA, or only asked whether it
                           is available, cannot use it ("Cannot re-initialize CUDA in forked
                           subprocess", seen on an H100). SIGALRM still stops a loop in Python
                           code
    COURSE_NO_FORK=1       the same, for the machinery tests of this path on a CPU
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import select
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CAN_FORK = hasattr(os, "fork")
GRACE_S = 3.0  # after the budget: time for the child to report where it was stuck


class Hang(BaseException):
    """Raised inside the child when its time budget runs out (a BaseException, so that an
    `except Exception` in learner code cannot swallow it)."""


class ExitCalled(BaseException):
    """os._exit() or os.abort() called by code running in the child."""

    def __init__(self, how: str):
        super().__init__(how)
        self.how = how


@dataclass
class Outcome:
    """What happened to one isolated call."""

    kind: str  # "ok", "error" (an exception), "hang", "exit", "died", "killed"
    value: Any = None  # fn's return value ("ok"), or summarise(exception) for error/hang/exit
    stdout: str = ""
    stderr: str = ""
    detail: str = ""  # for "died" / "killed": how the child ended


def kind_of(err: BaseException) -> str:
    if isinstance(err, Hang):
        return "hang"
    if isinstance(err, SystemExit | ExitCalled):
        return "exit"
    return "error"


def exit_description(err: BaseException) -> str:
    """'`sys.exit()` called', '`os._exit()` called' for an exit exception."""
    if isinstance(err, ExitCalled):
        return f"`{err.how}` called"
    return "`sys.exit()` (or `exit()`) called"


def _raise_exit(how: str) -> Callable[..., Any]:
    def fake_exit(*_args, **_kwargs):
        raise ExitCalled(how)

    return fake_exit


def _on_alarm(signum, frame):
    raise Hang()


@contextlib.contextmanager
def guarded(budget_s: float | None):
    """In this process: turn exits into exceptions and, in the main thread, a budget overrun
    into `Hang`. Used in the child, and around loading notebook cells."""
    saved = os._exit, os.abort
    os._exit, os.abort = _raise_exit("os._exit()"), _raise_exit("os.abort()")
    # Signals reach the main thread only; setitimer does not exist on Windows.
    use_alarm = (
        budget_s is not None
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    previous = None
    if use_alarm:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        outer, _ = signal.setitimer(signal.ITIMER_REAL, budget_s)
        start = time.monotonic()
    try:
        yield
    finally:
        os._exit, os.abort = saved
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if outer > 0:  # an outer timer (pytest-timeout) was running: give it back
                signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3))


def cuda_available() -> bool:
    """Would a forked child be refused CUDA? PyTorch refuses it in a child forked after this
    process initialised CUDA (PyTorch's documented rule) or merely asked whether CUDA is
    available (importing the course asks; seen on an H100, torch 2.11), so: wherever CUDA is
    available."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available()


def runs_in_process() -> bool:
    """Where `call_isolated` runs calls in this process instead of a forked child."""
    return not CAN_FORK or cuda_available() or os.environ.get("COURSE_NO_FORK") == "1"


def _single_threaded_torch() -> None:
    # OpenMP's thread pool does not survive fork: the child's first parallel op would wait for
    # threads that do not exist. One thread is also what small graded inputs want.
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _run_here(fn, summarise, budget_s) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            with guarded(budget_s):
                value = fn()
            outcome = Outcome("ok", value)
        except BaseException as exc:  # noqa: BLE001 - learner code may raise anything
            if isinstance(exc, KeyboardInterrupt):
                raise
            outcome = Outcome(kind_of(exc), summarise(exc))
    outcome.stdout, outcome.stderr = out.getvalue(), err.getvalue()
    return outcome


def call_isolated(
    fn: Callable[[], Any],
    summarise: Callable[[BaseException], Any],
    budget_s: float,
) -> Outcome:
    """Run `fn()` in a forked child with `budget_s` seconds; `summarise(exception)` runs in the
    child on any exception (Hang, SystemExit and ExitCalled included) and must return something
    picklable. Returns the Outcome; never raises because of what `fn` did."""
    if runs_in_process():
        return _run_here(fn, summarise, budget_s)
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, use of fork()"
        pid = os.fork()
    if pid == 0:  # the child: never returns
        real_exit = os._exit
        os.close(read_fd)
        status = 0
        try:
            _single_threaded_torch()
            outcome = _run_here(fn, summarise, budget_s)
            try:
                payload = pickle.dumps(outcome)
            except Exception as exc:  # noqa: BLE001
                payload = pickle.dumps(
                    Outcome("error", summarise(TypeError(f"result cannot be sent back: {exc}")))
                )
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(payload)
        except BaseException:  # noqa: BLE001 - nothing may escape a forked child
            status = 70
        finally:
            real_exit(status)
    os.close(write_fd)
    return _collect(pid, read_fd, budget_s + GRACE_S)


def _collect(pid: int, read_fd: int, limit_s: float) -> Outcome:
    chunks: list[bytes] = []
    deadline = time.monotonic() + limit_s
    killed = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                killed = True
                break
            ready, _, _ = select.select([read_fd], [], [], left)
            if ready:
                chunk = os.read(read_fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    except BaseException:  # Ctrl-C in the grader: take the child down with us
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    if killed:
        return Outcome("killed", detail=f"stuck for {limit_s:.0f} s, inside a library call")
    if chunks:
        try:
            return pickle.loads(b"".join(chunks))
        except Exception:  # noqa: BLE001 - a child cut off while writing
            pass
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return Outcome("died", detail=f"the process was killed by {name}")
    return Outcome(
        "died", detail=f"the process ended with exit code {os.waitstatus_to_exitcode(status)}"
    )
