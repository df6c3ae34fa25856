"""Contract suites: one per seam, run against every implementation."""
