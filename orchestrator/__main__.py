import signal

from orchestrator.cli import main

if hasattr(signal, "SIGPIPE"):  # `python -m orchestrator ... | head` ends quietly, like any Unix tool
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
raise SystemExit(main())
