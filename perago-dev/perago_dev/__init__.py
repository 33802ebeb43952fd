"""The local development stack: lakeFS and Conductor built and run by the project itself."""
