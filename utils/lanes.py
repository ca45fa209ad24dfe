"""Run shell commands side by side and fail if any fails: `make test` uses the second core.

    python -m utils.lanes "command one" "command two" ...

Each command's output is collected and printed whole when it ends (never interleaved), under a
line naming the command. The exit status is 0 only if every command exited 0.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time


def main(commands: list[str]) -> int:
    if not commands:
        print("usage: python -m utils.lanes COMMAND [COMMAND ...]", file=sys.stderr)
        return 2
    started = time.monotonic()
    lanes = []
    for command in commands:
        log = tempfile.TemporaryFile(mode="w+")
        lanes.append((command, log, subprocess.Popen(command, shell=True, stdout=log, stderr=log)))
    # Each lane's own end, not when its turn to print came: the lanes' balance is read off these.
    ended: dict[int, float] = {}
    while len(ended) < len(lanes):
        for i, (_, _, process) in enumerate(lanes):
            if i not in ended and process.poll() is not None:
                ended[i] = time.monotonic() - started
        time.sleep(0.2)
    failed = 0
    for i, (command, log, process) in enumerate(lanes):
        status = process.wait()
        log.seek(0)
        print(f"\n=== {command}  (exit {status}, ended after {ended[i]:.0f} s)", flush=True)
        sys.stdout.write(log.read())
        failed |= status != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
