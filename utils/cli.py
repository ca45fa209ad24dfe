"""`course`: build notebooks, grade, reset or export a notebook, show a solution, serve a model,
update the course."""

from __future__ import annotations

import argparse
import shutil
import sys
import time

from utils import NOTEBOOKS_DIR


def _build(args) -> int:
    from utils.build import build_all, stale_notebooks

    if args.check:
        stale = stale_notebooks()
        for chapter, diff in stale.items():
            print(f"notebooks/{chapter}.ipynb is stale:\n{diff}\n", file=sys.stderr)
        if stale:
            print("Run `course build` and commit the notebooks.", file=sys.stderr)
            return 1
        print("notebooks are up to date")
        return 0
    for path in build_all(args.out, teacher=args.teacher):
        print(f"wrote {path}")
    return 0


def _grade(args) -> int:
    import solutions  # noqa: F401  (first: it decides how Triton runs, before anything imports it)
    from utils.chapters import resolve_chapter
    from utils.check import grade

    chapter = resolve_chapter(args.chapter) if args.chapter else None
    results = grade(impl=args.impl, chapter=chapter).results
    if args.impl == "notebooks":  # a notebook under a chapter's old name is not graded: say so
        from utils.renames import notebooks_under_old_names, old_name_notice

        for path in notebooks_under_old_names(NOTEBOOKS_DIR):
            print(old_name_notice(path))
    return 0 if results and all(r.outcome in ("passed", "skipped") for r in results) else 1


def _reset(args) -> int:
    from utils.build import build_notebook, notebook_path, notebook_text
    from utils.chapters import resolve_chapter

    chapter = resolve_chapter(args.chapter)
    path = notebook_path(chapter)
    fresh = notebook_text(build_notebook(chapter))
    if path.exists() and path.read_text(encoding="utf-8") == fresh:
        print(f"{path} is already fresh: nothing to back up")
        return 0
    if path.exists():
        backups = NOTEBOOKS_DIR / ".backups"
        backups.mkdir(exist_ok=True)
        backup = backups / f"{chapter}.{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
        shutil.copy2(path, backup)
        print(f"your notebook is kept at {backup}")
    path.write_text(fresh, encoding="utf-8")
    print(f"{path} is fresh again")
    where = "It is open in Jupyter now" if _open_in_jupyter(path) else "If it is open in Jupyter"
    print(
        f"{where}: close its tab without saving, or use File > Reload Notebook from Disk. "
        "The open tab still holds your old notebook, and saving it (Ctrl+S, autosave) would "
        "write that back over the reset."
    )
    return 0


def _open_in_jupyter(path) -> bool:
    """Whether a running Jupyter server on this machine has a session open on `path` (asked
    on localhost, with the token the server wrote in its runtime file)."""
    import json
    import urllib.request
    from pathlib import Path

    try:
        from jupyter_server.serverapp import list_running_servers

        for server in list_running_servers():
            request = urllib.request.Request(
                server["url"].rstrip("/") + "/api/sessions",
                headers={"Authorization": f"token {server.get('token', '')}"},
            )
            with urllib.request.urlopen(request, timeout=2) as answer:
                sessions = json.load(answer)
            root = Path(server.get("root_dir") or server.get("notebook_dir") or ".")
            for session in sessions:
                if (root / session.get("path", "")).resolve() == Path(path).resolve():
                    return True
    except Exception:  # no server, an old one, a refused request: the advice stands anyway
        return False
    return False


def _update(args) -> int:
    from utils.update import update

    return update()


def _solution(args) -> int:
    from utils.display import show_solution

    show_solution(args.name)
    return 0


def _export(args) -> int:
    from pathlib import Path

    from utils.build import notebook_path
    from utils.chapters import resolve_chapter
    from utils.export import export_html

    page = export_html(notebook_path(resolve_chapter(args.chapter)), Path(args.out))
    print(f"wrote {page} (open it in a browser; it reads MathJax from the folder beside it)")
    return 0


def _corpus(args) -> int:
    from utils.corpus import fetch_corpus

    print(f"the Shakespeare corpus is cached in {fetch_corpus()}")
    return 0


def _train(args) -> int:
    import json

    from utils.recipe import run

    metrics = run(args.model, out=args.out, n_steps=args.steps)
    keys = ("model", "val_loss_nats_per_token", "val_loss_nats_per_char", "val_bits_per_char",
            "bigram_val_loss_nats_per_char", "wall_time_s")  # fmt: skip
    print(json.dumps({k: metrics[k] for k in keys}, indent=2))
    return 0


def _serve(args) -> int:
    import os

    from utils.server import serve

    # The flag, else the environment (which `ps` does not show to the machine's other users);
    # an empty value is no key.
    api_key = args.api_key or os.environ.get("COURSE_API_KEY") or None
    try:
        serve(args.model, host=args.host, port=args.port, api_key=api_key, threads=args.threads,
              max_concurrent_requests=args.max_concurrent_requests)  # fmt: skip
    except KeyboardInterrupt:  # uvicorn raises Ctrl+C's signal again once it has shut down
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="build notebooks/ from chapters/ and solutions/")
    p.add_argument("--check", action="store_true", help="fail if a notebook is stale")
    p.add_argument("--teacher", action="store_true", help="keep the solutions in the cells")
    p.add_argument("--out", default=None, help="output folder (default: notebooks/)")
    p.set_defaults(func=_build)

    p = sub.add_parser("grade", help="grade your notebooks and print a table")
    p.add_argument("chapter", nargs="?", help="only this chapter (number or name)")
    p.add_argument(
        "--impl",
        default="notebooks",
        choices=("notebooks", "solutions", "stubs"),
        help="what to grade (default: your notebooks)",
    )
    p.set_defaults(func=_grade)

    p = sub.add_parser("reset", help="restore a pristine notebook (yours is backed up)")
    p.add_argument("chapter", help="chapter number or name, e.g. 01")
    p.set_defaults(func=_reset)

    p = sub.add_parser(
        "update",
        help="take the course's newest commit; your notebooks move with their chapters",
        description="Fetch the course's newest commit and fast-forward to it. Every notebook "
        "you changed is copied to notebooks/.backups/ first and put back under its chapter's "
        "current name (a notebook under an old name is carried to the new one). Refused, "
        "changing nothing, where that cannot be done safely.",
    )
    p.set_defaults(func=_update)

    p = sub.add_parser("solution", help="print the reference source of an exercise object")
    p.add_argument("name", help="e.g. LayerNorm, or an exercise name such as attention")
    p.set_defaults(func=_solution)

    p = sub.add_parser("export", help="your notebook, with its outputs, as an offline HTML page")
    p.add_argument("chapter", help="chapter number or name, e.g. 03")
    p.add_argument("--out", default="exports", help="output folder (default: exports/)")
    p.set_defaults(func=_export)

    p = sub.add_parser("corpus", help="fetch and cache the training corpus (setup does this)")
    p.set_defaults(func=_corpus)

    p = sub.add_parser("train", help="reproduce a shipped Shakespeare model from its seed")
    p.add_argument("--model", choices=("main", "draft", "llama"), default="main")
    p.add_argument("--steps", type=int, default=None, help="override the number of steps")
    p.add_argument("--out", default=None, help="output folder (default: models/<name>)")
    p.set_defaults(func=_train)

    p = sub.add_parser("serve", help="serve a model over OpenAI's completions API (chapter 8)")
    p.add_argument("--model", default="shakespeare", help="a shipped or saved model, or a folder")
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 opens it to other machines")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY'; or set COURSE_API_KEY (as vLLM reads "
        "VLLM_API_KEY): a command line is shown by ps to every user of the machine",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="PyTorch's threads (default 1): a step of a small model is too short for a second "
        "thread to pay; on a 2-core machine one stream made 0.78 ms a token with 1 or 2 when "
        "idle, but 1.3 ms with 1 and 25 ms with 2 when shared (README, 'Serving it')",
    )
    p.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=128,
        help="requests in flight at most (TGI's name and default); beyond them a 429 with "
        "Retry-After, and /health answers 503",
    )
    p.set_defaults(func=_serve)

    args = parser.parse_args(argv)
    if args.command == "build" and args.teacher and args.out is None:
        parser.error("--teacher needs --out: the committed notebooks/ are learner builds")
    try:
        return args.func(args)
    except ValueError as err:
        print(f"course {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
