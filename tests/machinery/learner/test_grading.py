"""Grading survives anything a notebook cell does, names the cause, and grades every other
exercise as it deserves. (That pristine notebooks fail every test as 'not implemented' is
`make test`'s `--impl stubs --must-fail` run, for every chapter.)

Each broken notebook below is a teacher build (the solutions pasted in) with faults planted in
some exercises. Faults in one notebook sit in different exercises, so one grading run checks
several of them; each run must finish within twice the clean run plus 30 s. Every time limit
here is an idle machine's, stretched by COURSE_TIME_SCALE (utils/timing.patient).
"""

import os
import re
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET

import nbformat
import pytest

from utils import REPO_ROOT
from utils.build import build_notebook
from utils.chapters import read_chapter
from utils.timing import patient

CHAPTER = "01_transformer"
BUDGET_S = 4.0  # per graded test, idle machine: plenty for chapter 1's tests on the solutions


def run_graded(tmp_path, notebook, chapter=CHAPTER, *extra, budget_s=BUDGET_S):
    """Grade `notebook` in a subprocess: ({test id: (exercise, outcome, message)}, seconds).
    `budget_s`: per graded test, on an idle machine."""
    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    nbformat.write(notebook, nb_dir / f"{chapter}.ipynb")
    xml = tmp_path / "results.xml"
    env = {
        **os.environ,
        "COURSE_NOTEBOOKS_DIR": str(nb_dir),
        "COURSE_CELL_TIMEOUT": str(patient(2)),
        "COURSE_TEST_BUDGET": str(patient(budget_s)),
    }
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/graded", "-q", "-m", f"chapter_{chapter[:2]}",
         "--impl", "notebooks", f"--junitxml={xml}", *extra],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    elapsed = time.monotonic() - start
    assert xml.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    results = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        outcome = "passed" if failure is None else "failed"
        message = "" if failure is None else (failure.get("message") or "") + (failure.text or "")
        results[case.get("name")] = (props.get("exercise"), outcome, message)
    assert results, "no graded test ran:\n" + done.stdout[-3000:]
    return results, elapsed


def by_exercise(results):
    grouped = {}
    for exercise, outcome, message in results.values():
        grouped.setdefault(exercise, []).append((outcome, message))
    return grouped


def cell(nb, exercise):
    return next(c for c in nb.cells if c.metadata.get("exercise") == exercise)


def in_method(nb, exercise, method, *lines):
    """Insert `lines` as the first statements of `method` in an exercise cell."""
    source = cell(nb, exercise).source.splitlines()
    i = next(i for i, line in enumerate(source) if line.lstrip().startswith(f"def {method}("))
    while not source[i].rstrip().endswith(":"):
        i += 1
    indent = " " * (len(source[i + 1]) - len(source[i + 1].lstrip()))
    source[i + 1 : i + 1] = [indent + line for line in lines]
    cell(nb, exercise).source = "\n".join(source)


def assert_graded(grouped, failures: dict[str, str], chapter=CHAPTER):
    """Exercises in `failures` fail (the tests that reach the fault), each message containing
    the needle; every other exercise passes every test."""
    for exercise, needle in failures.items():
        failed = [m for o, m in grouped[exercise] if o == "failed"]
        assert failed, (exercise, grouped[exercise])
        assert all(needle in m for m in failed), (exercise, needle, failed[0][:400])
    for ex in read_chapter(chapter).exercises:
        if ex.name not in failures:
            assert all(o == "passed" for o, _ in grouped[ex.name]), (ex.name, grouped[ex.name])


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """The solutions pasted into chapter 1: every test passes; the time is the yardstick."""
    results, elapsed = run_graded(tmp_path_factory.mktemp("clean"), build_notebook(CHAPTER, True))
    return results, elapsed


def test_pasting_the_solutions_passes(clean_run):
    results, _ = clean_run
    assert {k: v for k, v in results.items() if v[1] != "passed"} == {}


def faults_inside_methods():
    """Chapter 1 with a fault planted inside five exercises and two cells that read others."""
    nb = build_notebook(CHAPTER, teacher=True)
    # an infinite loop, nested in a loop body, inside a function
    cell(nb, "token_strings").source = textwrap.dedent("""\
        def token_strings(tokenizer, text):
            pieces = []
            for i in tokenizer.encode(text, add_special_tokens=False):
                if i >= 0:
                    while True:
                        pass
            return pieces
        """)
    in_method(nb, "transformer", "forward", "while True:", "    pass")  # loops inside a method
    in_method(nb, "attention", "forward", "import sys", "sys.exit()")
    in_method(nb, "mlp", "forward", "raise NotImplementedError()")  # block uses the reference
    cell(nb, "embed").source += "\n\ntorch = None\n"  # a clobbered setup name
    # a helper in a cell of its own, and a try-out line that reads a demo cell's `cfg`
    ln = cell(nb, "layernorm")
    ln.source = ln.source.replace(
        "residual - residual.mean(dim=-1, keepdim=True)", "centre(residual)"
    )
    nb.cells.insert(
        nb.cells.index(ln),
        nbformat.v4.new_code_cell("def centre(x):\n    return x - x.mean(dim=-1, keepdim=True)"),
    )
    cell(nb, "block").source += "\n\nprint(TransformerBlock(cfg))\n"
    return nb


FAULTS_INSIDE_METHODS = {
    "token_strings": "an infinite loop in `token_strings` (the `token_strings` cell, line 5)",
    "transformer": "`Unembed.forward` (the `transformer` cell",
    "attention": "`sys.exit()` (or `exit()`) called in `Attention.forward` (the `attention` cell",
    "mlp": "not implemented yet",
    "embed": "the `embed` cell rebinds `torch` (defined by the setup cell) to None",
}


@pytest.fixture(scope="module")
def forked_faults(tmp_path_factory):
    return run_graded(tmp_path_factory.mktemp("forked"), faults_inside_methods())


def test_faults_inside_methods_fail_only_their_exercise(forked_faults, clean_run):
    results, elapsed = forked_faults
    assert_graded(by_exercise(results), FAULTS_INSIDE_METHODS)
    assert elapsed <= 2 * clean_run[1] + patient(30), (elapsed, clean_run[1])


def test_graded_in_this_process_as_in_a_child(tmp_path, forked_faults, monkeypatch):
    """Where the grader cannot fork (CUDA initialised in it: a GPU notebook's kernel; or
    Windows) the tests run in its own process. The same faults get the same verdict for every
    test, so the grader undoes what each test bound (the reference standing in for `mlp`,
    a looping method replaced) before the next one."""
    monkeypatch.setenv("COURSE_NO_FORK", "1")
    # The exercises where something is undone between tests: a looping method replaced
    # (transformer), the reference standing in (mlp, and block, which calls it), an exit
    # (attention). The other exercises' verdicts do not depend on the process (and make test's
    # stub run grades every test in its own process).
    undone = ("transformer", "mlp", "block", "attention")
    results, _ = run_graded(tmp_path, faults_inside_methods(), CHAPTER, "-m",
                            f"chapter_{CHAPTER[:2]} and ({' or '.join(undone)})")  # fmt: skip
    grouped = by_exercise(results)
    assert set(grouped) == set(undone), sorted(grouped)
    for exercise in undone:
        needle = FAULTS_INSIDE_METHODS.get(exercise)
        failed = [m for o, m in grouped[exercise] if o == "failed"]
        if needle is None:
            assert not failed, (exercise, failed[:1])
        else:
            assert failed and all(needle in m for m in failed), (exercise, needle, failed[:1])
    forked = {test: outcome for test, (ex, outcome, _) in forked_faults[0].items() if ex in undone}
    assert {test: outcome for test, (_, outcome, _) in results.items()} == forked


def test_faults_at_the_top_level_of_cells_fail_only_their_exercise(tmp_path, clean_run):
    nb = build_notebook(CHAPTER, teacher=True)
    in_method(nb, "layernorm", "forward", "while True:", "    pass")  # ten tests call it
    cell(nb, "token_strings").source = "import sys\nsys.exit()\n" + cell(nb, "token_strings").source
    cell(nb, "embed").source = "import os\nos._exit(1)\n" + cell(nb, "embed").source
    cell(nb, "mlp").source += "\n\ndef broken(:\n    pass\n"
    cell(nb, "attention").source += "\n\nwhile True:\n    pass\n"
    in_method(nb, "transformer", "forward", "import os", "os._exit(1)")
    nb.cells.remove(cell(nb, "block"))

    results, elapsed = run_graded(tmp_path, nb)
    assert_graded(
        by_exercise(results),
        {
            "layernorm": "`LayerNorm.forward` (the `layernorm` cell, line",
            "token_strings": "`sys.exit()` (or `exit()`) called in the `token_strings` cell, "
            "line 2",
            "embed": "`os._exit()` called in the `embed` cell, line 2",
            "mlp": "SyntaxError in the `mlp` cell",
            "attention": "the `attention` cell, line",
            "transformer": "`os._exit()` called in `Unembed.forward`",
            "block": "has no cell",
        },
    )
    assert elapsed <= 2 * clean_run[1] + patient(30), (elapsed, clean_run[1])


def test_a_loop_deep_in_a_sampling_loop_fails_only_its_exercise(tmp_path):
    nb = build_notebook("03_sampling", teacher=True)
    sample = cell(nb, "sample").source.splitlines()
    i = next(i for i, line in enumerate(sample) if line.lstrip().startswith("for "))
    indent = " " * (len(sample[i + 1]) - len(sample[i + 1].lstrip()))
    loop = ["if True:", "    while True:", "        x = 1"]
    sample[i + 1 : i + 1] = [indent + line for line in loop]
    cell(nb, "sample").source = "\n".join(sample)
    results, _ = run_graded(tmp_path, nb, "03_sampling")
    assert_graded(by_exercise(results), {"sample": "an infinite loop in"}, "03_sampling")


LIVE_SCRIPT = """
import sys, time
import nbformat
from utils.check import check

# Run the notebook's cells as a kernel would (but not its check cells), then check.
nb = nbformat.read(sys.argv[1], as_version=4)
ns = {"__name__": "__main__", "In": []}
for cell in nb.cells:
    if cell.cell_type != "code" or cell.source.startswith("check("):
        continue
    ns["In"].append(cell.source)
    try:
        exec(compile(cell.source, f"<ipython-input-{len(ns['In'])}>", "exec"), ns)
    except Exception:
        pass  # demo cells that use what is broken
for exercise in ["attention", "block", "transformer", "embed", "layernorm"]:
    start = time.monotonic()
    check(exercise, ns)
    print(f"[{exercise} took {time.monotonic() - start:.1f} s]")
"""


@pytest.mark.timeout(360)  # longer than the subprocess's own limit, at every COURSE_TIME_SCALE
def test_live_check_names_the_cause_and_agrees_with_pytest(tmp_path):
    nb = build_notebook(CHAPTER, teacher=True)
    in_method(nb, "attention", "forward", "while True:", "    pass")
    in_method(nb, "mlp", "forward", "raise NotImplementedError()")
    cell(nb, "embed").source += "\n\ntorch = None\n"
    nbformat.write(nb, tmp_path / "live.ipynb")
    budget_s = patient(BUDGET_S)
    env = {**os.environ, "COURSE_TEST_BUDGET": str(budget_s), "COLUMNS": "300"}
    done = subprocess.run(
        [sys.executable, "-c", LIVE_SCRIPT, str(tmp_path / "live.ipynb")], cwd=REPO_ROOT,
        env=env, capture_output=True, text=True, timeout=patient(300),
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out[-2000:] + done.stderr[-3000:]
    assert "[red]" not in out, "rich markup printed literally"
    assert re.search(r"✗ attention: \d+ of \d+ tests? failed", out), out
    assert "an infinite loop in `Attention.forward` (the `attention` cell" in out, out
    assert "✓ block: all 2 tests passed" in out, out
    assert "stood in for `embed`, `attention`, `mlp`" in out, out
    assert "✓ transformer: all 5 tests passed" in out, out
    assert "✗ embed" in out and "the `embed` cell rebinds `torch`" in out, out
    assert "✓ layernorm" in out, out
    took = {line.split()[0][1:]: float(line.split()[2]) for line in out.splitlines()
            if line.startswith("[") and line.endswith("s]")}  # fmt: skip
    assert took["attention"] < budget_s + patient(10), took
    assert took["transformer"] < budget_s, "the loop found by check('attention') is known"


def test_course_grade_survives_os_exit(tmp_path):
    nb = build_notebook(CHAPTER, teacher=True)
    in_method(nb, "mlp", "forward", "import os", "os._exit(1)")
    nbformat.write(nb, tmp_path / f"{CHAPTER}.ipynb")
    env = {**os.environ, "COURSE_NOTEBOOKS_DIR": str(tmp_path), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "utils.cli", "grade", "1"], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 1
    assert "6 of 7 exercises pass" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "os._exit()" in done.stdout


@pytest.mark.parametrize("name", ["Attention", "LayerNorm"])
def test_impl_explains_a_missing_object(name):
    from utils.grading import ExerciseUnavailable, impl_from_live

    impl = impl_from_live({}, CHAPTER)
    with pytest.raises(ExerciseUnavailable, match="run the cell"):
        getattr(impl, name)


def test_a_stand_in_calls_the_learners_later_exercise(tmp_path):
    # forward_with_cache hands padded batches to positions_and_allowed, a later exercise. When
    # forward_with_cache is broken and the reference stands in, positions_and_allowed's tests
    # must still grade the learner's positions_and_allowed, not the reference's.
    nb = build_notebook("04_kv_cache", teacher=True)
    in_method(nb, "forward_with_cache", "forward_with_cache", "raise RuntimeError('broken')")
    source = cell(nb, "positions_and_allowed").source
    clamped = "positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, -n_new:]"
    assert clamped in source
    # Padding at position 3 instead of 0: only what padding computes shows it (end to end).
    cell(nb, "positions_and_allowed").source = source.replace(
        clamped, clamped + "\n    positions = positions + 3 * ~mask[:, -n_new:]"
    )
    results, _ = run_graded(
        tmp_path, nb, "04_kv_cache", "-m", "forward_with_cache or positions_and_allowed"
    )
    by_test = {name.split("[")[0]: (o, m) for name, (_, o, m) in results.items()}
    assert by_test["test_empty_cache_gives_the_uncached_logits"][0] == "failed"
    outcome, message = by_test["test_padding_positions_see_only_their_own_key"]
    assert outcome == "failed", message
    assert "stood in for what is broken: `forward_with_cache`" in message, message
    assert by_test["test_positions_count_real_tokens"][0] == "passed"


@pytest.mark.timeout(360)  # longer than the subprocess's own limit, at every COURSE_TIME_SCALE
def test_pytest_shows_a_wrong_exercise_as_the_tutor_wrote_it(tmp_path):
    """`pytest -m layernorm` on a wrong LayerNorm: each failure starts with the test's own
    sentence and shows where, without fixture dumps (`impl = Impl(...`) or tensor reprs."""
    nb = build_notebook(CHAPTER, True)
    ln = cell(nb, "layernorm")
    ln.source = ln.source.replace("+ self.cfg.layer_norm_eps).sqrt()", ").sqrt() + 1e-5")
    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    nbformat.write(nb, nb_dir / f"{CHAPTER}.ipynb")
    env = {**os.environ, "COURSE_NOTEBOOKS_DIR": str(nb_dir), "COLUMNS": "100"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "layernorm"], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=patient(300),
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    assert "Is your epsilon outside the sqrt? It is added to the variance" in out, out
    assert "Impl(" not in out and "tensor(" not in out and "where False" not in out, out
    assert "AssertionError:" not in out, "the test's sentence, not the exception's name"
    assert len(out.splitlines()) < 60, out


def test_a_test_run_in_this_process_leaves_the_namespace_as_it_found_it(monkeypatch):
    """What a graded test binds in the learner's namespace (the reference standing in for a
    broken exercise, a looping method made to fail at once) is undone after it, when it ran in
    this process: in a GPU notebook that namespace is the learner's own."""
    from utils.grading import Impl, run_graded_test

    monkeypatch.setenv("COURSE_NO_FORK", "1")

    class Unembed:
        def forward(self):
            return "the learner's"

    def learners_mlp():
        raise NotImplementedError

    ns = {"MLP": learners_mlp, "Unembed": Unembed, "kept": 1}
    impl = Impl(source="a test", chapter=CHAPTER, namespace=ns, isolated=True)
    impl.broken["mlp"] = "your `mlp` exercise is not implemented yet"
    impl.hung[("Unembed", "forward")] = "an infinite loop in `Unembed.forward`?"
    seen = {}

    def call():
        seen["MLP"], seen["forward"] = ns["MLP"], ns["Unembed"].forward

    verdict = run_graded_test(impl, "transformer", call, str)
    assert verdict.passed, verdict.message
    assert seen["MLP"] is not learners_mlp and seen["forward"] is not Unembed.forward
    assert ns == {"MLP": learners_mlp, "Unembed": Unembed, "kept": 1}
    assert "forward" in vars(Unembed) and Unembed().forward() == "the learner's"


def test_a_given_check_refusing_a_callers_arguments_blames_the_caller(tmp_path):
    """Chapter 4's cached beams that rebuild a full cache on top of itself: the given
    `start_forward` check inside the learner's (correct) `forward_with_cache` refuses the
    arguments. The caller passed them: the reference must not stand in for
    `forward_with_cache`, and the message must not say it is broken."""
    nb = build_notebook("04_kv_cache", teacher=True)
    rebuild = "logits, cache = forward_with_cache(self.model, self.tokens[:, -n_ctx:])"
    assert rebuild in cell(nb, "cached_beams").source
    cell(nb, "cached_beams").source = cell(nb, "cached_beams").source.replace(
        rebuild, rebuild[:-1] + ", cache)"
    )
    results, _ = run_graded(tmp_path, nb, "04_kv_cache", "-m", "cached_beams", budget_s=60)
    failed = [m for _, outcome, m in results.values() if outcome == "failed"]
    assert failed and all("would pass n_ctx" in m for m in failed), failed
    assert not any("stood in" in m for m in failed), failed[0][-600:]


def test_what_the_graded_cells_print_is_not_shown_with_a_failure(capsys):
    """Grading runs the cells that define names (a demo that prints, say): their output is not
    the learner's failure, and pytest would show it under "Captured stdout setup"."""
    from utils.grading import impl_from_notebook

    nb = build_notebook(CHAPTER, teacher=True)
    cell(nb, "mlp").source += "\n\nprint('a demo line')\n"
    impl = impl_from_notebook(nb, CHAPTER, source="a test")
    assert "MLP" in impl.namespace
    captured = capsys.readouterr()
    assert "a demo line" not in captured.out + captured.err


def test_a_test_that_runs_out_of_time_in_given_code_does_not_blame_the_learner(tmp_path):
    """A busy machine can stop a test while the course's own code runs (seen under load in
    chapter 6). The message says so; it must not call given code "a cell of yours", nor make
    the given function fail at once in later tests."""
    nb = build_notebook("04_kv_cache", teacher=True)
    given = next(c for c in nb.cells if c.source.startswith("def start_forward("))
    given.source = given.source.replace("    cfg = model.cfg\n", "    while True:\n        pass\n")
    results, _ = run_graded(
        tmp_path, nb, "04_kv_cache", "-m", "forward_with_cache", "-k", "empty_cache or match_hf",
        budget_s=2,
    )  # fmt: skip
    messages = [m for _, outcome, m in results.values() if outcome == "failed"]
    assert len(messages) == 2, messages
    for message in messages:
        assert "inside the course's own code" in message, message[:400]
        assert "the given cell `def start_forward(`" in message and "a cell of yours" not in message


def test_a_test_whose_process_crashes_on_memory_is_told_about_masks():
    """An unmasked tl.load past the end of a row can crash the interpreter's process: the
    learner must read about the mask, not "does your code end the process?"."""
    import signal

    from utils import sandbox
    from utils.grading import unfinished_message

    if sandbox.runs_in_process():
        pytest.skip("graded calls run in this process here: a crash would end the test run")

    def crash():
        os.kill(os.getpid(), signal.SIGSEGV)

    outcome = sandbox.call_isolated(crash, lambda err: {}, 10)
    assert outcome.kind == "died" and "SIGSEGV" in outcome.detail, outcome
    message = unfinished_message(outcome)
    assert "tl.load" in message and "mask" in message, message
    hang = sandbox.Outcome("killed", detail="stuck for 20 s, inside a library call")
    assert "end the process" in unfinished_message(hang)


def test_a_given_cell_is_named_by_its_first_line_of_code_not_its_decorator():
    """Many given cells start with `@dataclass`: naming them by it would name them all alike."""
    from utils.grading import _first_line

    assert _first_line("# the plan\n@dataclass\nclass SchedulerOutput:\n    x: int") == (
        "class SchedulerOutput:"
    )
    assert _first_line("def prepare_inputs(\n    scheduled,\n):") == "def prepare_inputs("


def test_only_the_blank_cells_raise_counts_as_not_implemented():
    """PyTorch raises NotImplementedError with words of its own where code reads a meta
    tensor's values (.tolist()): a slip to explain, not a blank cell."""
    from utils.grading import is_not_implemented

    assert is_not_implemented(NotImplementedError())
    assert is_not_implemented(NotImplementedError("attend still raises NotImplementedError"))
    assert not is_not_implemented(NotImplementedError("Cannot copy out of meta tensor; no data!"))
    try:
        try:
            raise NotImplementedError()
        except NotImplementedError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert is_not_implemented(outer)
