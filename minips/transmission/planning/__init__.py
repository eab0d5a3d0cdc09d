"""The transmission planner: a plan's costs, the plan chosen."""
