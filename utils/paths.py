"""Where the course keeps its models on disk: the shipped ones in the repository, and what it
builds or fetches (the corpus, the tiny test model) in a cache outside it.

A module of its own, with no heavy imports, so that the corpus, the training recipe and the
loaders can all find these folders without importing one another.
"""

from __future__ import annotations

import os
from pathlib import Path

from utils import REPO_ROOT

MODELS_DIR = REPO_ROOT / "models"  # the course's shipped models, HF GPT-2 format


def cache_dir() -> Path:
    """Where the course caches what it builds or fetches: $COURSE_CACHE, else the user's cache
    folder ($XDG_CACHE_HOME or ~/.cache) under transformer-course/. Never inside the repo."""
    if "COURSE_CACHE" in os.environ:
        return Path(os.environ["COURSE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "transformer-course"
