"""The schedule's steps, one module each; each registers itself (orchestrator/schedule/registry.py) and
policy.schedule.steps orders them (orchestrator/core/schema.py SCHEDULE_STEPS, the default)."""
