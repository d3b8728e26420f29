"""Naming the op: the first graph node where a batched pass and single-token passes part, its plot data and text."""
