"""Textual TUI for spotrun, installed as `spotrun.tui`.

It reads cluster state through spotrun.state and acts through spotrun.client.api, nothing else.
"""
