"""The curated mutants (tests/machinery/mutants/) each say what the learner must be told: the
words that `pytest tests/graded --mutants` then looks for in the message that kills it."""

from tests.machinery.mutants import all_mutants


def test_every_mutant_declares_what_its_message_must_say():
    silent = sorted(m_id for m_id, m in all_mutants().items() if not m.says)
    assert not silent, f"mutants without says=(...): {silent}"
    blank = sorted(m_id for m_id, m in all_mutants().items() if any(not w.strip() for w in m.says))
    assert not blank, f"mutants with an empty word in says: {blank}"
