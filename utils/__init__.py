"""Course machinery: model loading, notebook build, grading, command line."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CHAPTERS_DIR = REPO_ROOT / "chapters"
# The learner's notebooks; COURSE_NOTEBOOKS_DIR points the grader elsewhere (used by tests).
NOTEBOOKS_DIR = Path(os.environ.get("COURSE_NOTEBOOKS_DIR", REPO_ROOT / "notebooks"))
TESTS_DIR = REPO_ROOT / "tests"
