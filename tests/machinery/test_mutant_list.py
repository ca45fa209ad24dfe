"""The curated mutants (tests/machinery/mutants/) each say what the learner must be told: the
words that `pytest tests/graded --mutants` then looks for in the message that kills it."""

from tests.machinery.mutants import all_mutants


def test_every_mutant_declares_what_its_message_must_say():
    silent = sorted(m_id for m_id, m in all_mutants().items() if not m.says)
    assert not silent, f"mutants without says=(...): {silent}"
    blank = sorted(m_id for m_id, m in all_mutants().items() if any(not w.strip() for w in m.says))
    assert not blank, f"mutants with an empty word in says: {blank}"


def test_a_mutants_first_test_is_a_graded_test_of_its_exercise():
    # `try_first` only reorders; a misspelt name would silently reorder nothing.
    import importlib
    import pkgutil

    import pytest

    import tests.graded as graded

    pytest.importorskip("triton")  # chapter 8's graded tests, where every try_first is today

    marked: dict[str, set[str]] = {}  # test function name -> the exercises it is marked with
    for info in pkgutil.iter_modules(graded.__path__):
        if not info.name.startswith("test_"):
            continue
        try:
            module = importlib.import_module(f"tests.graded.{info.name}")
        except BaseException:  # a module that skips itself (chapter 8 without Triton)
            continue
        for name, function in vars(module).items():
            if name.startswith("test_") and callable(function):
                marks = {m.name for m in getattr(function, "pytestmark", [])}
                marked[name] = marks
    for m_id, mutant in all_mutants().items():
        if mutant.try_first:
            assert mutant.exercise in marked.get(mutant.try_first, set()), (
                f"{m_id}: try_first={mutant.try_first!r} is no graded test of {mutant.exercise}"
            )
