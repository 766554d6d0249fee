"""Systems under test: each starts real processes and yields what the load generator targets."""
