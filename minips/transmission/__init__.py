"""Transmission: what a plan is, the codecs, the planner."""
