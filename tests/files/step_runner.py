"""Runs ``hcfuse`` (its CLI main) and stops the run at one named step with a signal.

    python step_runner.py STEP[@N] SIGNAL -- optimize IN -o OUT ...

Inside this process, hcfuse.files.steps.reached is replaced by a hook that sends SIGNAL (KILL or INT)
to this process the N-th time (default 1) STEP is reached: SIGKILL ends the run there, SIGINT raises
KeyboardInterrupt right after the step, as Ctrl-C would. Exits with main's code otherwise.
"""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str]) -> int:
    target, signame, rest = argv[0], argv[1], argv[argv.index("--") + 1:]
    step, _, nth = target.partition("@")
    wanted = int(nth or 1)
    sig = {"KILL": signal.SIGKILL, "INT": signal.SIGINT}[signame]
    # a suite started in the background by a non-interactive shell inherits SIGINT ignored; a user's Ctrl-C
    # reaches a process that handles it, so restore Python's handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    seen = {"count": 0}

    from hcfuse.cli import main as hcfuse_main
    from hcfuse.files import steps

    def hook(name: str) -> None:
        if name == step:
            seen["count"] += 1
            if seen["count"] == wanted:
                os.kill(os.getpid(), sig)

    steps.reached = hook
    return hcfuse_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
