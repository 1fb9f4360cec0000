"""One module per subcommand, each with main(args) that builds its Options
from the parsed arguments and runs it (run.py: trace, count, profile and
funccount, and the frame every run shares; record.py: record, report and
archive); arguments.py: each subcommand's arguments."""
