"""The one error type for user mistakes: the CLI prints it without a traceback and exits with code 2."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix: bad recipe, missing file, wrong option, unsupported hardware.

    `problems` holds every problem found, each a line saying what is wrong, where, and how to fix it.
    """

    def __init__(self, *problems: str):
        self.problems = [p for p in problems if p]
        super().__init__("\n".join(self.problems))
