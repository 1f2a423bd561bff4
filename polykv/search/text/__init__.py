"""The plan search on text: per budget, TopRank, the best homogeneous plan, the search and the held-out verdict, and
`run_text_search`, the one entry point the CLI and the app's job call (`run`); the typed report and its Markdown
(`report`)."""
