"""Adapters: the only modules that import the lakeFS and Conductor SDKs."""
