"""What every Reel process runs with: configuration, logging, the clock, metrics, OpenTelemetry, deathsig."""
