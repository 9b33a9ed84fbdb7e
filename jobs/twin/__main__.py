"""`python -m jobs.twin <megatron flags>`: run the twin as a job's workload."""

from jobs.twin.loop import main

if __name__ == "__main__":
    raise SystemExit(main())
