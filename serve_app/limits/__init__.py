"""Rate limits and error budgets, counted in one place for every replica and node."""
