"""Editing plans by hand: the plan designer's operations (the web app calls them; nothing here draws anything).

Every operation returns a new, validated `Plan` or raises `PlanError` with a one-line message; the plan it
started from is never changed, so a rejected edit loses nothing. Each module holds one idea:
  edit_history  what a plan records of its edits (`record_edit`, `edits`);
  painting      a method and/or capacity painted onto chosen layers (`paint`);
  table         the per-layer table and its edits read back (`to_table`, `from_table`);
  comparison    where two plans differ, and what turned one into the other (`diff`, `change_summary`);
  whole_plan    a plan rescaled to another budget, reset to full, or built from a profile;
  choices       the designer's small decisions (which phases a choice names, the palette, shortcuts, messages);
  saving        naming plan files safely, and saving without overwriting unless asked (`save_plan`).
Rescaling a plan to another budget is `polykv.routing.scale_budget`; `whole_plan.rescale` is the designer's use
of it (the plan keeps its name and description).
"""
