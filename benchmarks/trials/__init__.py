"""Trial code the tunehub side of the benchmarks runs (each directory is a sweep's ``code``)."""
