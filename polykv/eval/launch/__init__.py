"""Before a launch: its work counted as forward passes (`work`, for its cost) and the proposed first run
(`first_run`)."""
