"""`python -m utils.offline CMD ...`: run a command with the network blocked, to test that the
course works offline after setup rather than assume it.

The block is a new user and network namespace (`unshare -rn`) with only the loopback interface
up (Jupyter kernels talk over it). Where the machine does not allow that, the command runs with
the network as it is, after a line saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

WRAPPER = 'ip link set lo up && exec "$@"'


def can_block() -> bool:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    probe = ["unshare", "-rn", "sh", "-c", WRAPPER, "sh", "true"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m utils.offline COMMAND [ARG ...]")
    if can_block():
        command = ["unshare", "-rn", "sh", "-c", WRAPPER, "sh", *argv]
    else:
        print("offline check: this machine cannot block the network (no user namespaces or no "
              "`unshare`/`ip`), so the next command runs with it", file=sys.stderr)  # fmt: skip
        command = argv
    sys.stdout.flush()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
