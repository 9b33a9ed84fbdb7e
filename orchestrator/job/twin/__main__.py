"""`python -m orchestrator.job.twin <megatron flags>`: run the twin as a job's workload."""

from orchestrator.job.twin.loop import main

if __name__ == "__main__":
    raise SystemExit(main())
