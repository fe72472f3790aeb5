"""Setting up the process for a multi-process run: starting jax.distributed changes JAX's global set-up,
so the program that runs (the `minibert stats --distributed` command, your script) does it once, first.

    from minibert.app.distributed import initialize
    initialize()                      # from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID
    result = corpus.survey(model, Path("corpus.txt"))   # every process, docs/scale_out.md
"""

from __future__ import annotations

import os

import jax

from minibert.errors import DistributedError


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, heartbeat_timeout: int = 100) -> None:
    """Start jax.distributed for a multi-process run (a corpus survey); call it in every process before anything else
    touches JAX. Arguments left out come from JAX_COORDINATOR_ADDRESS (host:port of process 0),
    JAX_NUM_PROCESSES and JAX_PROCESS_ID. On CPUs the collectives go over gloo.
    heartbeat_timeout: seconds after which the runtime declares a silent process dead and aborts every
    other one (SIGABRT, which no Python code can catch); survey's `timeout` should stay below it so that
    the survey stops first, with an error that names the process."""
    values = {"JAX_COORDINATOR_ADDRESS": coordinator_address, "JAX_NUM_PROCESSES": num_processes,
              "JAX_PROCESS_ID": process_id}
    values = {name: os.environ.get(name) if value is None else value for name, value in values.items()}
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise DistributedError(f"{', '.join(missing)} not set; pass the coordinator address (host:port of process "
                               f"0), the number of processes and this process's id, or set those variables.")
    try:
        count, index = int(values["JAX_NUM_PROCESSES"]), int(values["JAX_PROCESS_ID"])
    except ValueError:
        raise DistributedError(f"the number of processes and the process id must be integers; got "
                               f"{values['JAX_NUM_PROCESSES']!r} and {values['JAX_PROCESS_ID']!r}.") from None
    if not 0 <= index < count:
        raise DistributedError(f"process id {index} must lie in 0 … {count - 1} (the number of processes is {count}).")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(values["JAX_COORDINATOR_ADDRESS"], count, index,
                               heartbeat_timeout_seconds=int(heartbeat_timeout))


