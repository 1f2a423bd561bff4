"""The plan search on a workload: contenders, envelope and held-out runs, and `run_workload_search`, the one entry
point the CLI and the app's job call (`run`); the search and held-out samples (`samples`), answer_nll as the
objective (`objective`), the verdicts (`verdict`), the typed report (`report`), its page (`markdown`, with
`verdict_text` and `kv_table`) and several searches on one page (`summary`)."""
