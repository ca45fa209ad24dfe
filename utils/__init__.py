"""Course machinery: what builds, grades, loads, measures and serves the course's code.

utils/ sits above solutions/ and below chapters/ and benchmarks/ (pyproject.toml's import-linter
contracts): it imports solutions, never benchmarks or tests. A flat package on purpose: learners'
saved notebooks import these modules by name, so they stay where they are. Who each one serves:

Models and conversion (notebooks, tests, benchmarks)
    models.py          the one loader of every model (shipped, hub, local) and the grading reference
    convert.py         weights and configs between the course's models and HF's (GPT-2, Llama)
    paths.py           where models, the corpus and the caches are on disk (no heavy imports)
    corpus.py          the Shakespeare corpus: fetched, cleaned, split, cached (chapters 2 and 5)
    tokenizer.py       byte-level BPE tokenizers in HF format (chapter 2, `course train`)
    recipe.py          `course train`: the recipe that produces the shipped models (chapter 2)
    tiny_model.py      a tiny random GPT-2 for the machinery's own tests
Grading (pytest, `course grade`, a notebook's `check(...)`)
    grading.py         the `impl` seam (notebooks, solutions, stubs); the one call into learner code
    cells.py           notebook cells as the grader sees them: names, running one, a place in it
    sandbox.py         learner code run in a forked child, where it cannot take the grader down
    check.py           `check(...)` and `course grade`: graded tests run in this process, reported
    display.py         what the learner reads: verdicts and solutions, in a notebook or a terminal
    hf_oracles.py      HF ground truths shared by the graded tests and chapter 3's cells
    pytest_options.py  the grader's options (--impl, --must-fail, --mutants, --runslow), a plugin
    kernel_compile.py  chapter 10's kernels compiled for a GPU, without one (tests, benchmarks/sass)
The notebook build (`course build`)
    chapters.py        a chapter source (chapters/NN_name.py) read into its cells
    build.py           learner (stub) and teacher notebooks from chapters/ and solutions/
    colab.py           every notebook's first cell: on Colab, fetch and install the course
Measurements (chapters' timing cells, benchmarks/, the tests' time limits)
    timing.py          timing on a shared machine; time limits stretched by COURSE_TIME_SCALE
    speed.py           speculative and lookahead decoding's costs and predicted speed-up (ch. 6)
    serving.py         a trace of arriving requests served two ways, as a user feels it (ch. 8)
    records.py         the one writer of benchmarks/results/*.json: machine, median rate, verdict
The server
    server.py          `course serve`: chapter 8's engine behind OpenAI's completions API
Plots
    plots.py           the course's figures, one function per kind, called by chapter cells
The command line and JupyterLab
    cli.py             `course`: build, grade, reset, solution, export, corpus, train, serve, update
    update.py          `course update`: a clone brought to its newest commit, no notebook lost
    renames.py         the notebooks the course renamed (read by `course update` and `course grade`)
    export.py          `course export`: a notebook, outputs and all, as one offline HTML page
    lab_contents.py    JupyterLab's contents manager: a notebook just opened is not "modified"
    lab-overrides.json, jupyter_server_config.json: JupyterLab's settings (`make lab-settings`)
The Makefile (`make test`)
    lanes.py           commands side by side, each one's output whole, failing if any fails
    offline.py         a command run with the network blocked

This module itself: the repository's folders (REPO_ROOT, CHAPTERS_DIR, NOTEBOOKS_DIR, TESTS_DIR).
"""

import os
import sys
from pathlib import Path

# nbformat, which the course imports nearly everywhere, validates with jsonschema, and jsonschema
# checks the "iri" string format with rfc3987-syntax when that is installed (Jupyter installs
# it); importing it builds an Earley parser, about 1.7 s at every start of a kernel, a grader or
# a `course` command. No schema the course reads uses that format: leaving the module out makes
# jsonschema skip that one check, and nothing else changes.
sys.modules.setdefault("rfc3987_syntax", None)

REPO_ROOT = Path(__file__).resolve().parents[1]
CHAPTERS_DIR = REPO_ROOT / "chapters"
# The learner's notebooks; COURSE_NOTEBOOKS_DIR points the grader elsewhere (used by tests).
NOTEBOOKS_DIR = Path(os.environ.get("COURSE_NOTEBOOKS_DIR", REPO_ROOT / "notebooks"))
TESTS_DIR = REPO_ROOT / "tests"
