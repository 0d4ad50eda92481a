"""Published benchmarks: the committed JSON behind every results table, the scripts that made
them, and the table generator (``make_tables``)."""
