"""User-facing errors. Any exception with a class attribute `user_facing = True` (also the ledger's,
which lives in orchestrator/ledger/ and does not import this module) is printed by the CLI as one line + exit 2."""


class UserError(Exception):
    """Bad input from the user: the message names the problem and the fix."""

    user_facing = True
