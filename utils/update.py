"""`course update`: bring a clone of the course to its newest commit without losing a notebook.

Learners work in the committed notebooks, and a plain `git pull` meets their work badly. While a
notebook the new commits change is edited, git refuses to pull ("Your local changes ... would be
overwritten"). Where the course renamed a chapter's notebook (the chapters were renumbered),
git's rename detection does follow a stashed or committed edit to the new name, but every cell's
id changed with the chapter's number, on the line next to the execution count that running a
cell changes: `git stash pop` or a merge after the pull conflicts inside the notebook's JSON, and
the file with git's conflict markers is no longer a notebook Jupyter can open.

`course update` does instead what a careful person does by hand:

1. it checks, changing nothing, that this can be done safely: a git clone on a branch that
   follows the course's, no merge under way, the course's repository reachable (a fetch), no
   commit of the learner's own (the update is a fast-forward), no change outside notebooks/ in
   the way;
2. it copies every notebook the learner changed to notebooks/.backups/ (as `course reset` does);
3. it puts the notebooks the new commits change back to their committed state and
   fast-forwards (`git merge --ff-only` of what it fetched: `git pull --ff-only`);
4. it writes each of the learner's notebooks back under its chapter's current name (the
   RENAMES table of utils/renames.py, as the new commit has it) and prints what went where.

A notebook left under an old name (a Jupyter tab saved after a pull, or a notebook put back by
hand) is carried the same way. `python -m utils.update` prints, for `make lab`, a line for each
notebook found under an old name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from utils import REPO_ROOT
from utils.renames import RENAMES, current_name, old_name_notice, renames_in

NOTEBOOKS = "notebooks"
FETCH_TIMEOUT_S = 300


class Refusal(Exception):
    """The update cannot be done safely; nothing was changed."""


def _git(root: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    # Git's own variables (set inside a hook, say) would point it at another repository; a
    # prompt for a password would hang a command with nobody to answer it.
    away = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")
    env = {k: v for k, v in os.environ.items() if k not in away}
    env.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    # File names as they are, not quoted octal escapes (a notebook named in any language).
    command = ["git", "-c", "core.quotePath=false", *args]
    return subprocess.run(
        command, cwd=root, capture_output=True, text=True, env=env, timeout=timeout
    )


def _out(root: Path, *args: str) -> str:
    done = _git(root, *args)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {_last_line(done)}")
    return done.stdout.strip()


def _lines(root: Path, *args: str) -> list[str]:
    return [line for line in _out(root, *args).splitlines() if line]


def _last_line(done: subprocess.CompletedProcess) -> str:
    """What git said went wrong: its first fatal or error line, else its last line."""
    lines = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith(("fatal:", "error:"))] or lines[-1:]
    return said[0].rstrip(".") if said else f"exit status {done.returncode}"


def _is_notebook(path: str) -> bool:
    """A learner's notebook: notebooks/NAME.ipynb (not a backup, not a checkpoint)."""
    folder, _, name = path.rpartition("/")
    return folder == NOTEBOOKS and name.endswith(".ipynb")


def _stem(path: str) -> str:
    return path.rpartition("/")[2].removesuffix(".ipynb")


@dataclass
class Plan:
    """What an update will do, found without changing anything."""

    root: Path
    branch: str
    upstream: str  # e.g. origin/main
    old: str  # HEAD's commit
    new: str  # the upstream's, as fetched
    renames: dict[str, str]
    changed: dict[str, str] = field(default_factory=dict)  # tracked notebook -> git's letter
    strays: list[str] = field(default_factory=list)  # untracked notebooks the update must carry
    touched: set[str] = field(default_factory=set)  # paths the new commits change

    def in_new(self, path: str) -> bool:
        return _git(self.root, "cat-file", "-e", f"{self.new}:{path}").returncode == 0

    def edited(self, path: str) -> bool:
        """Whether the file at `path` differs from the new commit's."""
        return _git(self.root, "diff", "--quiet", self.new, "--", path).returncode != 0

    def target(self, path: str) -> str:
        return f"{NOTEBOOKS}/{current_name(_stem(path), self.renames)}.ipynb"


def _check_clone(root: Path) -> None:
    done = _git(root, "rev-parse", "--show-toplevel")
    if done.returncode != 0 or Path(done.stdout.strip()).resolve() != root.resolve():
        raise Refusal(
            f"{root} is not a git clone of the course (downloaded as an archive?), and only a "
            "clone can be updated; nothing was changed. Clone the course with `git clone`, then "
            "copy your notebooks into the clone's notebooks/ folder under the same names: "
            "`course update` there carries any old name to its current one"
        )
    busy = [p for p in _lines(root, "ls-files", "--unmerged") if p]
    markers = {"MERGE_HEAD": "a merge", "rebase-merge": "a rebase", "rebase-apply": "a rebase"}
    markers["CHERRY_PICK_HEAD"] = "a cherry-pick"
    under_way = [
        what
        for marker, what in markers.items()
        if (root / _out(root, "rev-parse", "--git-path", marker)).exists()
    ]
    files = sorted({line.split("\t", 1)[-1] for line in busy})
    conflicts = f" (conflicts in {', '.join(files)})" if files else ""
    if under_way:
        raise Refusal(
            f"git is in the middle of {under_way[0]}{conflicts}; nothing was changed. "
            f"`git {under_way[0].split()[-1]} --abort` undoes it; then run `course update` again"
        )
    if files:
        # What a `git stash pop` leaves when it conflicts: the stash itself is kept.
        stashed = _git(root, "stash", "show", "--name-only", "--include-untracked", "stash@{0}")
        mine = [path for path in stashed.stdout.split() if _is_notebook(path)]
        back = (
            f", `git restore --source=stash@{{0}} -- {' '.join(mine)}` writes your stashed "
            "notebooks back under the names they had there, and `course update` then carries "
            "them to their chapters' current names"
            if stashed.returncode == 0 and mine
            else ""
        )
        raise Refusal(
            f"git has unresolved conflicts in {', '.join(files)} (after a `git stash pop` or a "
            f"merge); nothing was changed. `git checkout HEAD -- {' '.join(files)}` puts the "
            "committed version back (after a `git stash pop`, your changes are still in the "
            f"stash: `git stash list`){back}"
        )


def _upstream(root: Path) -> tuple[str, str, str]:
    """(branch, its upstream as git names it, the upstream's remote)."""
    done = _git(root, "symbolic-ref", "--short", "-q", "HEAD")
    if done.returncode != 0:
        raise Refusal(
            "this clone is on no branch (a detached HEAD, after checking out a commit); nothing "
            "was changed. `git switch main` goes back to the course's branch"
        )
    branch = done.stdout.strip()
    done = _git(root, "rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{upstream}")
    if done.returncode != 0:
        raise Refusal(
            f"the branch {branch} follows no branch of the course's repository, so there is "
            "nothing to update it from; nothing was changed. `git branch -u origin/main` makes "
            "it follow the course's main branch"
        )
    remote = _git(root, "config", f"branch.{branch}.remote").stdout.strip() or "origin"
    return branch, done.stdout.strip(), remote


def _fetch(root: Path, remote: str) -> None:
    url = _git(root, "remote", "get-url", remote).stdout.strip() or remote
    try:
        done = _git(root, "fetch", "--quiet", remote, timeout=FETCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise Refusal(
            f"fetching from {remote} ({url}) took over {FETCH_TIMEOUT_S} s; nothing was "
            "changed. Run `course update` again once the network is back"
        ) from None
    if done.returncode != 0:
        raise Refusal(
            f"the course's repository {remote} ({url}) could not be reached: {_last_line(done)}; "
            "nothing was changed. Run `course update` again once the network is back"
        )


def _own_commits(root: Path, branch: str, upstream: str, ahead: int) -> Refusal:
    subjects = _lines(root, "log", "--format=%h %s", f"{upstream}..HEAD")
    shown = "; ".join(f"'{s}'" for s in subjects[:3]) + ("; ..." if len(subjects) > 3 else "")
    keep = "my-work"
    n = 1
    while _git(root, "rev-parse", "--verify", "-q", f"refs/heads/{keep}").returncode == 0:
        n += 1
        keep = f"my-work-{n}"
    base = _out(root, "merge-base", "HEAD", upstream)
    mine = _lines(root, "diff", "--name-only", "--no-renames", base, "HEAD")
    notebooks = [p for p in mine if _is_notebook(p)]
    others = [p for p in mine if not _is_notebook(p)]
    reset_why = (
        "this branch becomes the course's; git refuses, changing nothing, if that would touch "
        "a change you have not committed"
    )
    steps = [
        (f"git branch {keep}", f"your commits stay on the branch {keep}"),
        (f"git reset --keep {upstream}", reset_why),
    ]
    if notebooks:
        restore = f"git restore --source={keep} -- {' '.join(notebooks)}"
        steps.append((restore, "your notebooks back, under the names your commits gave them"))
        steps.append(("course update", "carries each one to its chapter's current name"))
    width = max(len(cmd) for cmd, _ in steps)
    lines = "\n".join(f"    {cmd.ljust(width)}  # {why}" for cmd, why in steps)
    also = (
        f"\nYour commits also change {', '.join(others)}: `git diff {upstream}...{keep}` shows "
        "how, to carry over by hand."
        if others
        else ""
    )
    many = "commit" if ahead == 1 else "commits"
    return Refusal(
        f"the branch {branch} has {ahead} {many} of your own that {upstream} does not have "
        f"({shown}), so it cannot simply move to the course's newest commit, and a merge can "
        "conflict inside the notebooks' JSON; nothing was changed. To keep your commits and "
        f"follow the course:\n{lines}{also}"
    )


def plan(root: Path = REPO_ROOT) -> Plan:
    """Check that the update is safe and say what it will do; changes nothing but git's copy
    of the upstream (a fetch). Raises Refusal with the reason in words."""
    root = Path(root)
    if shutil.which("git") is None:
        raise Refusal("git is not installed, and the course updates through git")
    _check_clone(root)
    branch, upstream, remote = _upstream(root)
    _fetch(root, remote)
    old = _out(root, "rev-parse", "HEAD")
    new = _out(root, "rev-parse", "@{upstream}")
    ahead = int(_out(root, "rev-list", "--count", f"{new}..{old}"))
    behind = int(_out(root, "rev-list", "--count", f"{old}..{new}"))
    if ahead and behind:
        raise _own_commits(root, branch, upstream, ahead)
    if not behind:  # nothing new (or only the learner's commits): only strays to carry
        new = old
    shown = _git(root, "show", f"{new}:utils/renames.py")
    renames = renames_in(shown.stdout) if shown.returncode == 0 else {}
    p = Plan(root, branch, upstream, old, new, renames or dict(RENAMES))
    p.touched = set(_lines(root, "diff", "--name-only", "--no-renames", old, new))
    for line in _lines(root, "diff", "--name-status", "--no-renames", "HEAD"):
        letter, path = line.split("\t", 1)
        if _is_notebook(path):
            p.changed[path] = letter[0]
    untracked = _lines(root, "ls-files", "--others", "--exclude-standard")
    for path in untracked:
        if _is_notebook(path) and (_stem(path) in p.renames or path in p.touched):
            p.strays.append(path)
    in_the_way = [
        path
        for path in _lines(root, "diff", "--name-only", "--no-renames", "HEAD")
        if path in p.touched and not _is_notebook(path)
    ] + [path for path in untracked if path in p.touched and not _is_notebook(path)]
    if in_the_way:
        raise Refusal(
            f"the update changes {', '.join(in_the_way)}, which you changed too (outside "
            "notebooks/, where course update keeps nothing aside); nothing was changed. Copy "
            "your version elsewhere, then `git checkout HEAD -- <file>` (or delete the file, if "
            "git does not track it) and run `course update` again"
        )
    return p


def _backup(root: Path, path: str, stamp: str) -> Path:
    backups = root / NOTEBOOKS / ".backups"
    backups.mkdir(exist_ok=True)
    backup = backups / f"{_stem(path)}.{stamp}.ipynb"
    n = 1
    while backup.exists():
        n += 1
        backup = backups / f"{_stem(path)}.{stamp}-{n}.ipynb"
    shutil.copy2(root / path, backup)
    return backup


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def apply(p: Plan, say=print) -> None:
    """Carry out a plan: back up, put back, fast-forward, carry, and say what went where."""
    root = p.root
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # Every notebook of the learner's, kept before anything moves (with no commit to take,
    # only those under an old name move).
    mine = [*sorted(p.changed), *p.strays] if p.old != p.new else p.strays
    kept = {path: _backup(root, path, stamp) for path in mine if (root / path).is_file()}
    if kept:
        names = ", ".join(b.name for b in kept.values())
        say(f"copies of your notebooks are kept in {NOTEBOOKS}/.backups/: {names}")
    # The notebooks the new commits change (and those moving to a new name) go back to their
    # committed state: the fast-forward then has nothing of the learner's in its way.
    moving = [
        path
        for path in [*sorted(p.changed), *p.strays]
        if path in p.touched or p.target(path) != path
    ]
    moving = [path for path in moving if p.old != p.new or path in p.strays]
    for path in moving:
        if p.changed.get(path) in ("M", "D", "T"):
            _out(root, "checkout", "-q", "HEAD", "--", path)
        else:  # untracked, or added to the index only: it is in .backups now
            if p.changed.get(path) == "A":
                _out(root, "rm", "-q", "--cached", "--", path)
            (root / path).unlink()
    if p.old != p.new:
        done = _git(root, "merge", "--ff-only", "--quiet", p.new)
        if done.returncode != 0:
            for path in moving:
                if path in kept:
                    shutil.copy2(kept[path], root / path)
            raise RuntimeError(
                f"the fast-forward to {p.upstream} failed ({_last_line(done)}); your notebooks "
                "are back where they were, and their copies stay in notebooks/.backups/"
            )
        count = _out(root, "rev-list", "--count", f"{p.old}..{p.new}")
        say(f"{p.branch} moved from {p.old[:7]} to {p.new[:7]} ({count} commits of the course's)")
    else:
        say(f"{p.branch} already has {p.upstream}'s newest commit ({p.new[:7]})")
    # Each notebook put aside goes back under its chapter's current name, in place of the fresh
    # one; the learner's edits to a notebook already at that name are never written over.
    claimed: dict[str, str] = {}
    moved: list[tuple[str, str]] = []
    for path in sorted(moving, key=lambda path: (p.target(path) != path, path)):
        target = p.target(path)
        if path not in kept:
            continue  # deleted by the learner: the course's fresh copy stands
        backup = _rel(root, kept[path])
        if not p.in_new(target):
            say(f"{path}: its chapter is no longer in the course; your notebook is in {backup}")
        elif target in claimed:
            say(f"{path}: {target} now holds your {claimed[target]}; this one is in {backup}")
        elif (root / target).exists() and p.edited(target):
            say(
                f"{path}: {target} holds edits of yours too and is left as it is; this one is "
                f"in {backup} (copy the cells you want from one to the other)"
            )
        else:
            shutil.copy2(kept[path], root / target)
            claimed[target] = path
            if target == path:
                say(
                    f"{path}: your notebook, back in place (the course changed it too: "
                    f"`git diff {path}` shows how yours differs from its new version)"
                )
            else:
                say(f"{path} -> {target}: your notebook under its chapter's current name")
                moved.append((path, target))
    for path in sorted(set(p.changed) - set(moving)):
        if p.changed[path] != "D":
            say(f"{path}: your notebook, untouched (the update does not change it)")
    status = _lines(root, "diff", "--name-status", "--no-renames", p.old, p.new, "--", NOTEBOOKS)
    added = {line.split("\t", 1)[1] for line in status if line.startswith("A\t")}
    gone = {line.split("\t", 1)[1] for line in status if line.startswith("D\t")}
    renamed = [(old, p.target(old)) for old in sorted(gone) if p.target(old) in added]
    renamed = [(old, new) for old, new in renamed if new not in claimed]
    if renamed:
        say("renamed by the course: " + ", ".join(f"{old} -> {new}" for old, new in renamed))
    fresh = sorted(path for path in added - {new for _, new in renamed} if path not in claimed)
    fresh = [path for path in fresh if _is_notebook(path)]
    if fresh:
        say(f"new in the course: {', '.join(fresh)}")
    if moved:
        olds = ", ".join(old for old, _ in moved)
        say(
            f"If Jupyter has {olds} open, close that tab without saving: saving would write the "
            "old name back. Open your notebook under its new name instead."
        )


def update(root: Path = REPO_ROOT, say=print) -> int:
    """`course update`: 0 when done (or nothing to do), 1 when refused (nothing changed)."""
    try:
        p = plan(Path(root))
    except Refusal as why:
        print(f"course update: {why}", file=sys.stderr)
        return 1
    if p.old == p.new and not p.strays:
        say(f"{p.branch} already has {p.upstream}'s newest commit ({p.new[:7]}); nothing to do")
        return 0
    apply(p, say=say)
    return 0


def main() -> int:
    """For `make lab`: a line for each notebook found under an old name."""
    from utils import NOTEBOOKS_DIR
    from utils.renames import notebooks_under_old_names

    for path in notebooks_under_old_names(NOTEBOOKS_DIR):
        print(old_name_notice(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
