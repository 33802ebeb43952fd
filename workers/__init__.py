"""Example Perago task modules (each folder has a README)."""
