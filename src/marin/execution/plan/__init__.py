"""The plan layer: run options and policy, the decision, reading stored state."""
