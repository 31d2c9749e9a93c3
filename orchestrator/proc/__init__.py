"""The job's processes: starting, owning and ending them (`process`), confining them (`sandbox`, `cgroups`),
and the `PATH` they get (`jobpath`). Below `git/`: it knows no repository, runner or job."""
