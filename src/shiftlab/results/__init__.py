"""Results: metrics, the scoring of records, summary.json/.md, published numbers and when a run is
comparable with them, the suite table, and how runs are written for people."""
