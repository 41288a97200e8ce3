"""AWS EC2: spot offers, launches, notices, catalog."""
