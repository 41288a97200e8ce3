"""Azure ARM: spot offers, launches, notices, catalog."""
