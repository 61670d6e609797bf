"""`steplens detect`: the engine over a CSV, offline."""
