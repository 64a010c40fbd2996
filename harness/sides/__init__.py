"""Framework side runners. Each runs in its own worker process and imports only its framework."""
