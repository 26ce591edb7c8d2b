"""Reports over run summaries: terminal (Rich) and JSON."""
