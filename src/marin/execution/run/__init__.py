"""The run layer: scheduler, run loop, executors, report, the runner and the run/resolve API."""
