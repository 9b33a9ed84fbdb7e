from orchestrator.cli import main

raise SystemExit(main())
