"""Google Compute Engine: spot offers, launches, notices, catalog."""
