"""What reaches people: alert mail (exactly once), the daily report, and ad-hoc SQL over the
tables."""
