"""Elastic training runtime: etcd v3 rendezvous for torchrun, the pre-warmed launcher, trainer helpers."""
