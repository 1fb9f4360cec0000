"""One module per subcommand: what it does with a Session (run.py: trace,
count, profile and funccount, and the frame every run shares)."""
