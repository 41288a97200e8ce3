"""The user's machine: what the CLI's commands do (up, down, status, prices, logs, head bring-up)."""
