"""`python -m polykv.jobs run <workspace>/jobs/<id>.json --workspace <workspace>`: the worker of a job."""

import sys

from polykv.jobs.worker import main

sys.exit(main())
