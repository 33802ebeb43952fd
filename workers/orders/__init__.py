"""The orders pipeline: clean raw CSV, daily revenue per segment, a read-only quality report."""
