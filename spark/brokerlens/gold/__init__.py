"""Gold: what operators ask about, built from silver: dispatch over-delivery and debt, unacked-range
holes and their alerts, producer health, and the token bucket they share."""
