"""The prefill:decode capacity planner: measured profiles, the analytic model, the plan and its simulation."""
