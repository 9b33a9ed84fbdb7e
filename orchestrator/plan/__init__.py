"""The planner: pure functions from (model, hardware, stage) to ranked, explained candidates.

No I/O, no database, no submitit, no omegaconf: same input, same candidates.
"""
