"""Job specs, job kinds, the ``tokenmill`` CLI and the Python submission API.

    from jobs import JobSpec, run, submit, status, wait
"""

from jobs.api import cancel, load, run, status, submit, wait
from jobs.spec import JobSpec, SpecFileError

__all__ = ["JobSpec", "SpecFileError", "cancel", "load", "run", "status", "submit", "wait"]
