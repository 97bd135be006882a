"""Transfer to downstream models: point-in-time representation features (snapshots at a cadence,
an as-of join, the fallback policy), small downstream rankers trained alone, distilled, with
representations (full, int8, PCA) and both, and the report that compares them."""
