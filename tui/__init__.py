"""Textual TUI for spotrun, installed as `spotrun.tui`; reads cluster state through spotrun.state.store only."""
