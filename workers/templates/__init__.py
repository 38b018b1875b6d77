"""Built-in training loops, runnable as `builtin:<name>`."""
