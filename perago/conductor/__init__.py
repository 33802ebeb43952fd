"""What `perago register` does with Conductor: register tasks and workflows (``registry``)
and check workflow definitions against the tasks' models (``workflow_check``)."""
