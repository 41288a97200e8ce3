"""Elastic training runtime: etcd v3 rendezvous for torchrun, the pre-warmed launcher, trainer helpers.

What the launcher and its workers exchange with the node agent (files, environment variables,
exit codes) is spotrun.node.protocol's.
"""
