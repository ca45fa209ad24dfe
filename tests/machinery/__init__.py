"""Tests of the course itself (the autograder's own tests are in tests/graded/).

One folder per kind of test; `make test`'s lanes name the folders:

    learner/     the learner's seat: each chapter's notebook run in a Jupyter kernel, grading of
                 broken notebooks, the `course` command, Triton's mode, the Colab cell's install
                 (online) and chapter 1 in JupyterLab in a real browser
    compile/     chapter 10's kernels compiled for a GPU, and their machine code read (no GPU)
    benchmarks/  benchmarks/*.py smoke-run on tiny settings, their JSON checked (the CUDA-only
                 one must refuse a machine without CUDA)
    checks/      the graded tests and the given code checked: bad arguments refused, the
                 classic mistakes caught, the explainer, the mutant list's words
    models/      the corpus and a short training run, the shipped models, loading and
                 conversion, the grading reference, the architecture registry, and chapters 3
                 to 6's generators on both architectures, against HF
    engine/      chapter 8's engine and `course serve`, and chapter 9's constraints in both
    tools/       the build and the names its cells use, export, update, JupyterLab's settings,
                 what check() prints, plots, records, timing, the layers, the README's figures
    mutants/     not tests: the learner-style mutants that `pytest tests/graded --mutants` grades

Helpers that tests share live in tests/support.py, the one public support module; fixtures
the machinery's tests share, in conftest.py here.
"""
