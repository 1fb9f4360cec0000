"""Where a run's intervals go besides files: a ClickHouse server (sent by a
background thread through a bounded on-disk queue) and read back by
`ustack report --from`. Imported only when --to or --from names one."""
