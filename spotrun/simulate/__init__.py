"""Offline what-ifs: spot traces replayed through the controller's own planner."""
