"""Running a plan on a suite: its settings (`settings`), a unit of work (`unit`), the run itself (`suite_runner`),
where runs execute (`backends`, `shards`) and what a model cannot run, refused before it starts (`fit`)."""
