"""Choosing how to decode on this machine: measured decode costs and the `auto` planner."""
