"""The ranks of one node, as the launcher's environment says: how many share the node, which
GPU ``device="cuda"`` means for this one, and its part of the node's CPUs. Pure functions of
an environment mapping and a few counts (no I/O; ``os.environ`` and ``torch.cuda`` are read
by their callers), tested over env dicts.

Launchers, the first that applies:

- ``torchrun`` (and launchers that set its variables): ``LOCAL_RANK``, this process's index
  on its node, and ``LOCAL_WORLD_SIZE``, the processes on the node (``srun torchrun ...``
  comes here too: the ranks are torchrun's);
- MPI's ``mpirun``/``mpiexec``, each process a rank: Open MPI's
  ``OMPI_COMM_WORLD_LOCAL_RANK`` and ``OMPI_COMM_WORLD_LOCAL_SIZE``, else MPICH's and Intel
  MPI's (Hydra) ``MPI_LOCALRANKID`` and ``MPI_LOCALNRANKS`` (before Slurm's: ``mpirun``
  inside an allocation may see the ``SLURM_LOCALID`` of the daemon that started it);
- Slurm's ``srun``, each task a rank (only a step's tasks have ``SLURM_STEP_TASKS_PER_NODE``;
  a batch script has not): ``SLURM_LOCALID``, the processes on this node from
  ``SLURM_STEP_TASKS_PER_NODE`` (``"4(x2),3"``: this node's entry, by ``SLURM_NODEID``) or
  else ``SLURM_NTASKS_PER_NODE``, and ``SLURM_CPUS_PER_TASK``, the CPUs the job gave a task;
- neither: one process, the node's alone.

A variable that is not a whole number counts as absent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["VARIABLES", "NodeRanks", "cpus_per_rank", "node_ranks", "rank_gpu", "tasks_on_node"]

#: MPI launchers' ``(ranks on the node, local rank)`` variables, in the order they are looked for.
_MPI = (("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"), ("MPI_LOCALNRANKS", "MPI_LOCALRANKID"))
#: The local-rank variable that goes with the variable the ranks came from (for messages).
_LOCAL_RANK_OF = {
    "LOCAL_WORLD_SIZE": "LOCAL_RANK",
    "SLURM_STEP_TASKS_PER_NODE": "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE": "SLURM_LOCALID",
    **{size: rank for size, rank in _MPI},
}
#: Every variable :func:`node_ranks` reads, launcher by launcher (``aioloader doctor`` shows them).
VARIABLES = (
    "LOCAL_WORLD_SIZE",
    "LOCAL_RANK",
    *(name for pair in _MPI for name in pair),
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_NODEID",
    "SLURM_LOCALID",
    "SLURM_CPUS_PER_TASK",
)


@dataclass(frozen=True)
class NodeRanks:
    """This process among the processes of its node.

    ``ranks``: the processes on the node (1 when no launcher says); ``local_rank``: this one's
    index among them (None when unknown); ``launcher``: ``"torchrun"``, ``"mpirun"``, ``"srun"`` or None;
    ``cpus_per_task``: the CPUs Slurm gave each task (``SLURM_CPUS_PER_TASK``), else None;
    ``source``: the variable ``ranks`` came from, for messages."""

    ranks: int = 1
    local_rank: int | None = None
    launcher: str | None = None
    cpus_per_task: int | None = None
    source: str = ""


def _whole(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() else None


def tasks_on_node(tasks_per_node: str, node: int) -> int | None:
    """Slurm's tasks on node ``node`` of a step from ``SLURM_STEP_TASKS_PER_NODE``'s text:
    counts in node order, ``N(xK)`` for ``N`` on each of ``K`` nodes (``"4(x2),3"``: 4, 4, 3).
    None for text of another form, or a node past the list."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        found = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if found is None:
            return None
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts[node] if node < len(counts) else None


def node_ranks(env: Mapping[str, str]) -> NodeRanks:
    """The ranks of this process's node, from its environment (see the module docstring)."""
    if "LOCAL_RANK" in env or "LOCAL_WORLD_SIZE" in env:
        ranks = _whole(env, "LOCAL_WORLD_SIZE")
        return NodeRanks(max(1, ranks or 1), _whole(env, "LOCAL_RANK"), "torchrun", None, "LOCAL_WORLD_SIZE")
    for size, rank in _MPI:
        if size in env or rank in env:
            return NodeRanks(max(1, _whole(env, size) or 1), _whole(env, rank), "mpirun", None, size)
    if "SLURM_STEP_TASKS_PER_NODE" in env and "SLURM_LOCALID" in env:  # a task srun started
        step = env["SLURM_STEP_TASKS_PER_NODE"]
        ranks = tasks_on_node(step, _whole(env, "SLURM_NODEID") or 0)
        source = "SLURM_STEP_TASKS_PER_NODE"
        if ranks is None:
            ranks, source = _whole(env, "SLURM_NTASKS_PER_NODE"), "SLURM_NTASKS_PER_NODE"
        cpus = _whole(env, "SLURM_CPUS_PER_TASK")
        return NodeRanks(max(1, ranks or 1), _whole(env, "SLURM_LOCALID"), "srun", cpus or None, source)
    return NodeRanks()


def cpus_per_rank(usable: int, node: NodeRanks) -> int:
    """This rank's part of the node's ``usable`` CPUs (:func:`~aioloader.config.usable_cpus`:
    affinity and cgroup quota): the ``SLURM_CPUS_PER_TASK`` Slurm gave it (no more than
    ``usable``), else ``usable`` divided by the ranks on the node, rounded down; at least 1.
    Eight ranks on 16 usable CPUs get 2 each, so the node is used once, not eight times."""
    if node.cpus_per_task is not None:
        return max(1, min(usable, node.cpus_per_task))
    return max(1, usable // node.ranks)


def rank_gpu(node: NodeRanks, gpus: int, current: int, restricted: bool) -> tuple[int, str | None]:
    """Which of ``gpus`` CUDA devices ``device="cuda"`` (no index) is for this rank, when the
    loader starts, and a WARNING's text where two ranks of the node would deliver to one GPU.

    ``current``: the starting thread's current CUDA device (0 unless the user set one with
    ``torch.cuda.set_device``); ``restricted``: ``CUDA_VISIBLE_DEVICES`` is set. In order:

    - a current device other than 0 was set by the user: it;
    - the local rank unknown: device 0, with a WARNING if the node has several ranks;
    - ``srun`` and one GPU that ``CUDA_VISIBLE_DEVICES`` shows: Slurm bound this task to a GPU
      of its own (``--gpus-per-task``, ``--gpu-bind``): device 0;
    - else the local rank's GPU (``local_rank % gpus``), with a WARNING if the node has more
      ranks than GPUs."""
    if current != 0:
        return current, None
    ways = "call torch.cuda.set_device(...) before the loader starts, or pass device='cuda:N'"
    if node.local_rank is None:
        if node.ranks <= 1:
            return 0, None
        local = _LOCAL_RANK_OF.get(node.source, "LOCAL_RANK")
        return 0, (
            f"device='cuda': {node.source}={node.ranks} ranks on this node, but no {local}: which GPU "
            f"is this rank's cannot be told, and every rank would deliver to cuda:0; {ways}"
        )
    if node.launcher == "srun" and gpus == 1 and restricted:
        return 0, None
    index = node.local_rank % gpus
    if max(node.ranks, node.local_rank + 1) <= gpus:
        return index, None
    return index, (
        f"device='cuda': {node.source}={node.ranks} ranks on this node and {gpus} visible CUDA "
        f"device(s): local rank {node.local_rank} delivers to cuda:{index}, which another rank of "
        f"this node delivers to as well; {ways} (an explicit index is kept as given, without this warning)"
    )
