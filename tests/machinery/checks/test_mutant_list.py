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

    import tests.graded as graded
    from utils.chapters import all_exercises

    marked: dict[str, set[str]] = {}  # test function name -> the exercises it is marked with
    unloaded: set[str] = set()  # the exercises of a module that skipped itself
    for info in pkgutil.iter_modules(graded.__path__):
        if not info.name.startswith("test_"):
            continue
        try:
            module = importlib.import_module(f"tests.graded.{info.name}")
        except BaseException:  # a module that skips itself (chapter 10 without Triton)
            chapter = info.name.removeprefix("test_")[:2]
            unloaded |= {e.name for e in all_exercises() if e.chapter.startswith(chapter)}
            continue
        for name, function in vars(module).items():
            if name.startswith("test_") and callable(function):
                marks = {m.name for m in getattr(function, "pytestmark", [])}
                marked[name] = marks
    checked = [m for m in all_mutants().values() if m.try_first and m.exercise not in unloaded]
    assert checked, "no mutant with a try_first could be checked"
    for m_id, mutant in all_mutants().items():
        if mutant.try_first and mutant.exercise not in unloaded:
            assert mutant.exercise in marked.get(mutant.try_first, set()), (
                f"{m_id}: try_first={mutant.try_first!r} is no graded test of {mutant.exercise}"
            )


def test_a_shared_model_changed_in_place_is_seen():
    """make test runs the mutants in one process; its guard (tests/conftest.py) compares each
    session fixture's fingerprint after every mutant's test. It must see an in-place op, a
    write through `.data` (which bumps no version counter) and a NaN, and only those."""
    import torch

    from tests.conftest import _fingerprint

    model = torch.nn.Linear(3, 2)
    shared = (model, "a tokenizer", {"logits": torch.zeros(4)})
    before = _fingerprint(shared)
    assert _fingerprint(shared) == before
    _ = model.weight * 2, shared[2]["logits"] + 1  # reading is no change
    assert _fingerprint(shared) == before
    with torch.no_grad():
        model.bias.add_(1.0)
    assert _fingerprint(shared) != before
    before = _fingerprint(shared)
    model.weight.data[0, 0] += 1.0
    assert _fingerprint(shared) != before
    shared[2]["logits"][1] = float("nan")
    before = _fingerprint(shared)
    assert _fingerprint(shared) == before, "a NaN must equal itself here"
