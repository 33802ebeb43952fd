"""The vocabulary every layer shares, with no dependency on any of them: what the runtime
needs from a versioned object store (``store``) and from an orchestrator
(``orchestrator``), every name Perago makes in lakeFS (``lakefs_names``), which logical
step an attempt is across retried sub-workflows (``step_lineage``), where a worker may read
and publish (``policy``), and the interruptible thread pool transfers run on
(``parallel``).

Each module is imported on its own; nothing is imported here. ``VERSION`` is here so that
any layer can name the release without importing the façade above it.
"""

VERSION = "0.1.0"
