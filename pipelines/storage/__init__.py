"""Where the warehouse's data lives and how jobs reach it: Delta tables through delta-rs (no JVM) and the
Spark session (with Delta), the `docs` table written by ingest (sources validated, bad records to `rejected`), and
what a warehouse records about itself. In: corpus sources. Out: the docs table, read by enrichment and the index build.
"""
