"""Several processes surveying one corpus: device meshes, agreement between processes, and naming a
process that stopped answering. Starting jax.distributed is the application's job
(minibert.app.distributed.initialize), not the analysis's."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import weakref
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from minibert.errors import AnalysisError, DistributedError

_PLACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → (state, device ids, state on them)


def process_share() -> tuple[int, int] | None:
    """(index, count) of this process's share of a corpus file (CorpusFile.rows' shard); None: one process."""
    return (jax.process_index(), jax.process_count()) if jax.process_count() > 1 else None


def checked_devices(devices, reduce: str) -> list:
    local = jax.local_devices()
    if devices is None:
        return local
    devices = list(devices)
    if not devices:
        raise AnalysisError("devices is empty; leave it out to use every local device, or pass some of "
                            "jax.local_devices().")
    foreign = [d for d in devices if d not in local]
    if foreign:
        raise AnalysisError(f"devices {foreign} are not local devices of this process; pick from {local}.")
    if jax.process_count() > 1 and reduce == "global" and devices != local:
        raise AnalysisError("with several processes and reduce='global' every process shards over all its local "
                            "devices; leave devices out (or use reduce='local').")
    return devices


def gathered(values: np.ndarray) -> np.ndarray:
    """[processes, …]: every process's `values` (one small all-gather)."""
    from jax.experimental import multihost_utils  # imported when first needed, as survey's other multi-process parts

    return np.asarray(multihost_utils.process_allgather(values))


def summed_over_processes(counts: dict) -> dict:
    keys = sorted(counts)
    total = gathered(np.array([counts[k] for k in keys], np.int64)).sum(0)
    return {key: int(value) for key, value in zip(keys, total)}


def _digest(value) -> np.ndarray:
    """sha256 of a JSON-able value as 32 uint8: what the processes compare."""
    text = json.dumps(value, sort_keys=True, default=str)
    return np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8)


def check_processes_agree(run_id: dict, position: int, first_texts: list | None) -> None:
    """Before the first batch: every process runs the same settings and weights on the same corpus file
    from the same resume position, or the survey stops naming what differs. With lists of texts,
    every process getting the same first texts means each was handed the whole corpus."""
    items = {"settings": {k: v for k, v in run_id.items() if k not in ("weights", "corpus")},
             "weights": run_id.get("weights"), "corpus file": run_id["corpus"], "resume position": position}
    mine = np.stack([_digest(value) for value in items.values()] + [_digest(first_texts)])
    every = gathered(mine)  # [processes, items + 1, 32]
    for number, (name, value) in enumerate(items.items()):
        differ = [p for p in range(len(every)) if not np.array_equal(every[p, number], every[0, number])]
        if differ:
            raise DistributedError(f"processes {differ} differ from process 0 in their {name} (this process, "
                                   f"{jax.process_index()}, has {str(value)[:300]}); start every process with the "
                                   f"same model, settings, corpus file and resume file.")
    if first_texts is not None and all(np.array_equal(row, every[0, -1]) for row in every[:, -1]):
        raise DistributedError(f"all {len(every)} processes were given the same texts, so every document would count "
                               f"{len(every)} times; pass each process its own share, or a pathlib.Path to the "
                               f"corpus file, which survey shares out itself.")


def agreed(batches: list, buckets: Sequence[int], more: bool) -> tuple[list, bool]:
    """The same batch shapes in every process: each runs, per bucket, as many batches as the process
    with the most, the missing ones empty (None); `more`: whether any process has documents left."""
    if jax.process_count() == 1:
        return batches, more
    counts = np.array([more] + [sum(size == s for s, _ in batches) for size in buckets], np.int32)
    most = gathered(counts).max(0)
    padded = [b for size in buckets for b in [x for x in batches if x[0] == size]]
    for size, wanted in zip(buckets, most[1:]):
        padded += [(size, None)] * int(wanted - sum(size == s for s, _ in batches))
    return padded, bool(most[0])


def _coordination_client():
    """jax.distributed's key-value store client. JAX (0.10) keeps it in the private
    jax._src.distributed.global_state and has no public handle to it, yet a barrier that gives up after a
    timeout and names who is missing needs one (multihost_utils.sync_global_devices waits forever, and the
    runtime's heartbeat then aborts every process uncatchably). This is the one private JAX access."""
    from jax._src.distributed import global_state

    return global_state.client


def await_peers(tag: str, index: int, timeout: float) -> None:
    """Every process says it reached chunk `index` and waits (at most `timeout` seconds) for the others,
    through jax.distributed's key-value store, so that a process that died or hangs is named in an error
    here instead of leaving the others blocked in a collective."""
    client, me = _coordination_client(), jax.process_index()
    key = f"{tag}/{index}"
    client.key_value_set(f"{key}/{me}", "1")
    deadline, missing = time.monotonic() + timeout, []
    for peer in range(jax.process_count()):
        if peer != me:
            try:
                client.blocking_key_value_get(f"{key}/{peer}", max(1, int((deadline - time.monotonic()) * 1000)))
            except jax.errors.JaxRuntimeError:
                missing.append(peer)
    if missing:
        raise DistributedError(f"process {me}: processes {missing} did not reach the same point of the survey within "
                               f"timeout={timeout:g} s (stopped, killed or hung); this run is over. Start every "
                               f"process again with the same resume= file to go on from the last saved position.")
    # Every peer has now passed the previous chunk, so no one reads this process's key for it any more.
    client.key_value_delete(f"{tag}/{index - 1}/{me}")


@contextlib.contextmanager
def named_peer_failures(distributed: bool):
    """A collective that fails because a peer went away becomes a DistributedError that says so."""
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        if not distributed:
            raise
        first = str(error).strip().splitlines()[0][:300]
        raise DistributedError(f"process {jax.process_index()}: a collective with the other processes failed "
                               f"({first}); one of them has probably stopped. Start every process again with the "
                               f"same resume= file to go on from the last saved position.") from error


def mesh_over(devices: Sequence, distributed: bool) -> tuple[Mesh, NamedSharding, NamedSharding]:
    """(mesh with one axis "data", replicated sharding, rows sharded over "data")."""
    mesh = Mesh(np.array(jax.devices() if distributed else devices), ("data",))
    return mesh, NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("data"))


def placed_state(model, mesh: Mesh):
    """The weights replicated over the mesh, placed once per model and mesh: device_put to devices of
    several processes would compare the weights across processes on every call (one all-gather per
    array); the start-of-survey check compares one hash of them instead."""
    ids = tuple(d.id for d in mesh.devices.flat)
    placed = _PLACED.get(model)
    if placed is None or placed[0] is not model.state or placed[1] != ids:
        placed = _PLACED[model] = (model.state, ids, replicated(model.state, NamedSharding(mesh, PartitionSpec())))
    return placed[2]


def replicated(tree, sharding: NamedSharding):
    """Each array of `tree` on every device of `sharding`, built from this process's copy (no cross-process
    check: callers compare hashes once instead)."""
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)  # arrays already in place are kept, not copied

    def place(value):
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
    return jax.tree_util.tree_map(place, tree)
