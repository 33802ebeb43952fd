"""The smallest useful Perago task: write one greeting file and publish it."""
