"""Workload traces: the Standard Workload Format reader and writer, and the columnar trace replay loads."""
