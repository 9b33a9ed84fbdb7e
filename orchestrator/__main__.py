import importlib.util
import signal
import sys

# The third-party packages every command needs (pyproject's dependencies). Looked up, not imported (`--help`
# stays light): without them the one useful line is which Python to use, not a traceback.
NEEDED = ("omegaconf", "hydra", "sqlalchemy", "yaml", "rich")
missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
if missing:
    print(
        f"error: {sys.executable} lacks the orchestrator's dependencies (no module {missing[0]!r}): run "
        "`source .venv/bin/activate` first, or `.venv/bin/python -m orchestrator ...` (`make install` builds .venv)",
        file=sys.stderr,
    )
    raise SystemExit(2)

from orchestrator.cli import main  # noqa: E402 - after the dependency check

if hasattr(signal, "SIGPIPE"):  # `python -m orchestrator ... | head` ends quietly, like any Unix tool
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
raise SystemExit(main())
