"""Comparing runs: task and sample scores and paired contrasts (`compare`), the table of runs (`run_table`), the
Compare page's default pair (`default_pair`), a run's answers beside FullKV's (`answers`)."""
