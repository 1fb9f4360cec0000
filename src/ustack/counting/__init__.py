"""Counting: the stream's samples and what the kernel counted, into
StackCounts by (event, thread, stack), for the whole run (`tally`) or
interval by interval, each holding the samples taken in it (`intervals`).

It sits between symbolizing and reporting: it names stacks through the
run's resolver (symbols/) and hands plain StackCounts (model) to report/;
it is given the running Session and imports nothing above it."""
