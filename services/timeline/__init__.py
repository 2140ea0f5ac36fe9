"""Human-readable renderings of runs for the CLI: timelines, the attempt table and its cells."""
