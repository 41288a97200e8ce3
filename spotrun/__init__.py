"""spotrun: train ML models on spot VMs, elastic through preemptions, with the true cost."""

__version__ = "0.1.0"
