"""One module per research thread: what to measure, and how to turn measurements into findings."""
