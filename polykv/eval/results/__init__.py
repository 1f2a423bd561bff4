"""The results database (`store`: runs, their per-task scores and per-sample records, in SQLite; `database`: the
file itself, its opening, schema and migrations; `rows`: the typed rows it reads back) and the processes writing
runs (`run_workers`)."""
