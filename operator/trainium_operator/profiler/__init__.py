"""profiler layer."""
