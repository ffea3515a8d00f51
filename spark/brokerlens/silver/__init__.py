"""Silver: cleaned, deduplicated, normalised tables built from bronze (intervals, snapshots,
effective limits)."""
