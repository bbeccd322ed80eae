"""Comparing traces: tolerances, golden files, ``expected`` sections and the grader (no Rich)."""
