"""Recording (hot path), summaries, results as DataFrames, and plots (imported lazily)."""
