"""Clusters: many replicas (whole engines) behind a router, in one SimPy environment."""
