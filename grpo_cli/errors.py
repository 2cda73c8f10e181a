"""The two ways a command ends early with a message instead of a traceback: a user's mistake (UserError, exit code 2)
and a run that stopped on purpose (RunStopped, the exit code it carries)."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix: bad recipe, missing file, wrong option, unsupported hardware.

    `problems` holds every problem found, each a line saying what is wrong, where, and how to fix it.
    """

    def __init__(self, *problems: str):
        self.problems = [p for p in problems if p]
        super().__init__("\n".join(self.problems))


class RunStopped(Exception):
    """A training run that ended early on purpose, having saved what it could and said why: a signal asked it to stop,
    or its numbers went non-finite. Not the user's mistake; the CLI prints `problems` and exits with `code`."""

    code = 2

    def __init__(self, *problems: str, code: int | None = None):
        self.problems = [p for p in problems if p]
        if code is not None:
            self.code = code
        super().__init__("\n".join(self.problems))
