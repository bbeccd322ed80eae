"""Showing traces to people: numbers, layout, explanations (en/zh), Rich tables, exports."""
