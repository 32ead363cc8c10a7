"""What a run measured: the metrics the field reports, and the tables, CSV, JSON and plots that show them."""
