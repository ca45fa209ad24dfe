"""The first cell of every notebook: on Google Colab, it fetches and installs the course.

A notebook opened in Colab (from the README's link) arrives alone, without the repository it
belongs to: no `solutions`, no `utils`, no model. Its first cell clones the repository, checks
out the commit that built this very notebook, installs the course into the running kernel and
fetches the corpus (what `make lab` does), and moves into the clone's notebooks/ folder.
Anywhere else the cell returns at once: it runs only where `google.colab` is imported, or when
COURSE_SETUP_FROM names a repository to clone (a path or URL; the course's own test of this cell
uses it, since no Colab is to be had here).

"This very notebook": the build stamps each notebook with a digest of its other cells, and the
cell looks for the newest commit whose copy of the notebook has that digest. A digest of the
content, not a commit hash: a notebook cannot contain the hash of the commit that contains it.

The functions below are the cell's code: `course build` copies their source into the cell, so
they import what they need themselves and use nothing else from this package.
"""

from __future__ import annotations

import inspect
import tomllib

from utils import REPO_ROOT

CELL_ID_SUFFIX = "colab"
TITLE = "# @title On Google Colab, run this cell first: it installs the course (elsewhere: nothing)"


def cells_digest(cells: list) -> str:
    """sha256 of the cells' types and sources, this cell left out (it holds the digest)."""
    import hashlib

    digest = hashlib.sha256()
    for cell in cells:
        if "colab" in cell.get("metadata", {}).get("tags", []):
            continue
        source = cell["source"]
        text = source if isinstance(source, str) else "".join(source)
        digest.update(f"{cell['cell_type']}\n{text}\0".encode())
    return digest.hexdigest()


def setup_course(repository: str, notebook: str, digest: str) -> None:
    """Clone the course, check out the commit that built `notebook` (its cells' digest is
    `digest`), install it into this kernel and fetch its corpus. Only on Colab."""
    import importlib.metadata
    import json
    import os
    import subprocess
    import sys

    source = os.environ.get("COURSE_SETUP_FROM") or repository
    if "google.colab" not in sys.modules and "COURSE_SETUP_FROM" not in os.environ:
        return
    if not source:
        raise ValueError(
            "COURSE_REPOSITORY is empty: set it to the address of the course's repository (the "
            "GitHub page you opened this notebook from, https://github.com/<owner>/<name>) and "
            "run this cell again"
        )
    home = os.path.join(os.path.expanduser("~"), "transformer-course")

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", home, *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    if not os.path.isdir(os.path.join(home, ".git")):
        print(f"cloning {source} into {home}")
        subprocess.run(["git", "clone", "--quiet", source, home], check=True)
    tip = git("rev-parse", "origin/HEAD")

    def digest_at(commit: str) -> str | None:
        try:
            return cells_digest(json.loads(git("show", f"{commit}:{notebook}"))["cells"])
        except (RuntimeError, ValueError, KeyError):
            return None

    # The newest commit with this notebook: the tip if it has it, else the last commit that
    # wrote it (commits that wrote the notebook, newest first, on every branch).
    commit = tip if digest_at(tip) == digest else None
    if commit is None:
        written = git("log", "--all", "--format=%H", "--", notebook).split()
        commit = next((c for c in written if digest_at(c) == digest), None)
    if commit is None:
        print(
            f"no commit of {source} built this notebook (a notebook from another copy of the "
            f"course?): using its newest commit, {tip[:12]}, whose notebooks may differ"
        )
        commit = tip
    if git("rev-parse", "HEAD") != commit:
        git("checkout", "--quiet", commit)

    # Install into this kernel. pip may upgrade a package this kernel has imported already;
    # the old version then stays in memory, and only a restart loads the new one.
    def versions() -> dict[str, str]:
        """The installed version of every distribution this kernel has imported from."""
        owners = importlib.metadata.packages_distributions()
        imported = {name.partition(".")[0] for name in list(sys.modules)}
        return {
            dist: importlib.metadata.version(dist)
            for name in imported
            for dist in owners.get(name, [])
        }

    before = versions()
    print(f"installing the course at commit {commit[:12]} (a minute or two)")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-e", home], check=True)
    if home not in sys.path:
        sys.path.insert(0, home)  # pip's editable install is seen by new processes only
    subprocess.run([sys.executable, "-m", "utils.cli", "corpus"], cwd=home, check=True)
    changed = sorted(n for n, v in versions().items() if before.get(n, v) != v)
    os.chdir(os.path.join(home, "notebooks"))
    if changed:
        print(
            f"pip changed {', '.join(changed)}, which this session had imported already: "
            "restart the session (Runtime > Restart session), then run the notebook from the top"
        )
    print(f"the course is ready: {home} at {commit[:12]}")


def repository() -> str:
    """The course's public repository, as pyproject.toml records it ([project.urls])."""
    with open(REPO_ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return project.get("urls", {}).get("Repository", "")


def cell_source(notebook: str, digest: str) -> str:
    """The first cell of `notebook` (a path inside the repository), its cells' digest given."""
    functions = "\n\n".join(inspect.getsource(f) for f in (cells_digest, setup_course))
    return (
        f"{TITLE}\n"
        f'COURSE_REPOSITORY = {repository()!r}  # @param {{type: "string"}}\n\n\n'
        f"{functions}\n\n"
        f"setup_course(COURSE_REPOSITORY, {notebook!r}, {digest!r})\n"
        "del cells_digest, setup_course\n"
    )
