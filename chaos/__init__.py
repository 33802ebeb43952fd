"""The chaos run (`make chaos`): workers under faults, then an audit of the servers' records.

N real worker processes run a seeded mix of workflows against the local stack while a seeded
controller kills, pauses and restarts workers, restarts lakeFS and Conductor, and commits
foreign changes onto target branches; then the janitor runs and :mod:`chaos.audit` checks
Conductor's and lakeFS's own records (docs/chaos.md).
"""
