"""Checkpoints written by the training workers: local directories and object storage."""
