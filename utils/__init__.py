"""Course machinery: model loading, notebook build, grading, command line."""

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
