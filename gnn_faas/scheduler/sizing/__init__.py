"""Function sizing: memory formulas, latency profiles, the size search and the chart's sizing values."""
