"""Background jobs: evaluations and profiles that run in their own process and outlive whoever started
them (the web app, a CLI call). A job survives page reloads and app restarts because everything about
it lives in files under `<workspace>/jobs/`:

  <id>.json        what to do (written once by the starter, then only to record the worker or a cancel)
  <id>.state.json  how far it got: status, fraction done, last message, error, result (the worker writes it)
  <id>.report.json an experiment job's report (`Report.to_dict`), written when it finishes
  <id>.log         the worker's output

An evaluation job runs its units one after another in one process (the model loads once) through
`run_suite`, so progress per run is the store's sample count, and a stopped job resumes where it
stopped when started again. A profile job runs `build_profile`. An experiment job runs one of the
library's experiments (`polykv.eval.experiments`: factorial, placement or sweep) through the entry point the CLI
calls too (`polykv.eval.experiments.run.run_experiment`); its runs are found again in the store, so it too resumes
where it stopped.

A job file records its worker: pid, the process's start time and the host. A process counts as the
job's worker only when all three match and its exact command line is the worker command for this
job's file, so a job file that names some other process (edited by hand, or left over after the pid
was reused) never gets that process signalled. Cancelling sends SIGTERM to that one process (the
worker records "cancelled" before it exits), waits until it has exited, and kills it if it has not
after the timeout. Every worker this process starts is waited for by a daemon thread, so none is left
a zombie under a long-lived starter (the app server).

Job files and state files are read with `polykv.files.read_json` and validated; a damaged one is
reported (`scan_jobs`), never fatal. Job ids are checked wherever a user can give one.

Run a job file by hand with `python -m polykv.jobs run <workspace>/jobs/<id>.json --workspace <workspace>`
(an experiment job: `python -m polykv.jobs.experiment run ...`, a search job: `python -m polykv.jobs.search
run ...`, the modules that run their work).

The package: `spec` (ids, file schemas, the builders of each kind, the job files), `process` (start,
liveness, signals, cancel), `progress` (state, ETA, log), `worker` (the worker's loop), `experiment` and
`search` (those kinds' work, launch and report), `backend` (the eval backend "subprocess", registered on
import). Jobs run evaluations, so this package sits above `polykv.eval` and `polykv.search`; neither
imports it.
"""

from polykv.jobs import backend as _backend  # noqa: F401  registers the "subprocess" eval backend
from polykv.jobs.process import _alive, _children, cancel, start
from polykv.jobs.progress import JobState, RunProgress, duration, eta, log_tail, state
from polykv.jobs.spec import (
    EXPERIMENTS,
    FINAL,
    MAX_JOB_BYTES,
    MAX_REPORT_BYTES,
    MAX_STATE_BYTES,
    DamagedJob,
    Job,
    RunUnit,
    check_id,
    eval_job,
    experiment_job,
    jobs_dir,
    list_jobs,
    load_job,
    profile_job,
    report_path,
    save_job,
    scan_jobs,
    search_job,
)
from polykv.jobs.worker import JobWork, main

__all__ = [
    "EXPERIMENTS",
    "FINAL",
    "MAX_JOB_BYTES",
    "MAX_REPORT_BYTES",
    "MAX_STATE_BYTES",
    "DamagedJob",
    "Job",
    "JobState",
    "JobWork",
    "RunProgress",
    "RunUnit",
    "_alive",
    "_children",
    "cancel",
    "check_id",
    "duration",
    "eta",
    "eval_job",
    "experiment_job",
    "jobs_dir",
    "list_jobs",
    "load_job",
    "log_tail",
    "main",
    "profile_job",
    "report_path",
    "save_job",
    "scan_jobs",
    "search_job",
    "start",
    "state",
]
