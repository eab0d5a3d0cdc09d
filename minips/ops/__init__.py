"""Operations beside the server's path: checks, limits, failures, telemetry, checkpoints."""
