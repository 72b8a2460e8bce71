"""The ranks of one node (``aioloader.plan.node``), pure: what torchrun's and srun's
environments say, each rank's part of the node's CPUs, and which GPU ``device="cuda"`` is for
a rank. Then the settings a loader takes from them, and ``loader.stats`` saying how the node
was divided (the real two-rank runs are test_distributed.py's)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

import aioloader
from aioloader.config import LoaderConfig, usable_cpus
from aioloader.decode.settings import Decoding
from aioloader.plan.node import NodeRanks, cpus_per_rank, node_ranks, rank_gpu, tasks_on_node

TORCHRUN = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8", "RANK": "11", "WORLD_SIZE": "16"}
SRUN = {"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "2", "SLURM_LOCALID": "1"}


def test_torchrun_says_the_local_rank_and_the_ranks_on_the_node() -> None:
    assert node_ranks(TORCHRUN) == NodeRanks(8, 3, "torchrun", None, "LOCAL_WORLD_SIZE")
    assert node_ranks({"LOCAL_RANK": "1"}) == NodeRanks(1, 1, "torchrun", None, "LOCAL_WORLD_SIZE")
    assert node_ranks({"LOCAL_WORLD_SIZE": "4"}).local_rank is None
    # torchrun started by srun: the ranks are torchrun's, Slurm's CPUs per task are its whole task's
    both = node_ranks({**SRUN, "SLURM_CPUS_PER_TASK": "64", **TORCHRUN})
    assert (both.launcher, both.ranks, both.local_rank, both.cpus_per_task) == ("torchrun", 8, 3, None)


def test_no_launcher_is_one_process_alone_on_its_node() -> None:
    assert node_ranks({}) == NodeRanks()
    assert node_ranks({"RANK": "0", "WORLD_SIZE": "2"}) == NodeRanks()
    # a batch script's variables (no step): the script is one process, whatever it reserved
    assert (
        node_ranks({"SLURM_NTASKS_PER_NODE": "8", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "7"}) == NodeRanks()
    )
    # a variable that is not a whole number counts as absent
    assert node_ranks({"LOCAL_RANK": "x", "LOCAL_WORLD_SIZE": "-2"}) == NodeRanks(
        1, None, "torchrun", None, "LOCAL_WORLD_SIZE"
    )


def test_mpirun_says_the_local_rank_and_the_ranks_on_the_node() -> None:
    """Open MPI's variables, else MPICH's and Intel MPI's; before Slurm's (an ``mpirun`` in an
    allocation may carry its daemon's ``SLURM_LOCALID``), after torchrun's."""
    ompi = {"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_RANK": "6"}
    assert node_ranks(ompi) == NodeRanks(4, 2, "mpirun", None, "OMPI_COMM_WORLD_LOCAL_SIZE")
    hydra = {"MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "8", "PMI_RANK": "9"}
    assert node_ranks(hydra) == NodeRanks(8, 1, "mpirun", None, "MPI_LOCALNRANKS")
    assert node_ranks({**SRUN, **ompi}).launcher == "mpirun"
    assert node_ranks({**ompi, **TORCHRUN}).launcher == "torchrun"
    assert node_ranks({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}).local_rank is None
    unknown = node_ranks({"MPI_LOCALNRANKS": "2"})
    device, warning = rank_gpu(unknown, gpus=2, current=0, restricted=False)
    assert device == 0 and warning is not None
    assert "MPI_LOCALNRANKS=2 ranks on this node, but no MPI_LOCALRANKID" in warning
    assert rank_gpu(node_ranks(ompi), gpus=4, current=0, restricted=False) == (2, None)
    assert cpus_per_rank(16, node_ranks(ompi)) == 4


def test_srun_tasks_on_this_node_from_the_steps_layout() -> None:
    assert tasks_on_node("4(x2),3", 0) == tasks_on_node("4(x2),3", 1) == 4
    assert tasks_on_node("4(x2),3", 2) == 3
    assert tasks_on_node("8", 0) == 8
    assert tasks_on_node("4(x2),3", 3) is None
    assert tasks_on_node("four", 0) is None
    node = node_ranks({**SRUN, "SLURM_CPUS_PER_TASK": "6"})
    assert node == NodeRanks(3, 1, "srun", 6, "SLURM_STEP_TASKS_PER_NODE")
    odd = {**SRUN, "SLURM_STEP_TASKS_PER_NODE": "?", "SLURM_NTASKS_PER_NODE": "5"}
    assert node_ranks(odd) == NodeRanks(5, 1, "srun", None, "SLURM_NTASKS_PER_NODE")


@pytest.mark.parametrize(
    ("usable", "env", "share"),
    [
        (16, {}, 16),
        (16, {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}, 2),
        (16, {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, 8),
        (15, {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, 7),  # rounded down: the node used once
        (4, {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}, 1),  # at least 1
        (2, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, 1),
        (64, {**SRUN}, 21),  # 3 tasks on this node
        (64, {**SRUN, "SLURM_CPUS_PER_TASK": "10"}, 10),  # what Slurm gave the task
        (8, {**SRUN, "SLURM_CPUS_PER_TASK": "10"}, 8),  # never more than this process may use
    ],
)
def test_each_rank_takes_its_part_of_the_nodes_cpus(usable: int, env: dict[str, str], share: int) -> None:
    assert cpus_per_rank(usable, node_ranks(env)) == share


def test_a_rank_delivers_to_its_local_ranks_gpu() -> None:
    node = node_ranks(TORCHRUN)
    assert rank_gpu(node, 8, 0, False) == (3, None)
    assert rank_gpu(node_ranks({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}), 2, 0, False) == (0, None)
    assert rank_gpu(node_ranks({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}), 2, 0, False) == (1, None)
    assert rank_gpu(node_ranks(SRUN), 4, 0, False) == (1, None)
    assert rank_gpu(NodeRanks(), 4, 0, False) == (0, None)  # one process: the current device
    # a device the user set (torch.cuda.set_device) before the loader started wins
    assert rank_gpu(node, 8, 5, False) == (5, None)
    assert rank_gpu(NodeRanks(), 4, 2, False) == (2, None)


def test_two_ranks_on_one_gpu_are_warned_of() -> None:
    index, warning = rank_gpu(node_ranks(TORCHRUN), 4, 0, False)  # 8 ranks, 4 GPUs
    assert index == 3 and warning is not None
    assert "LOCAL_WORLD_SIZE=8 ranks on this node and 4 visible CUDA device(s)" in warning
    assert "local rank 3 delivers to cuda:3, which another rank" in warning
    assert "torch.cuda.set_device" in warning and "device='cuda:N'" in warning
    index, warning = rank_gpu(node_ranks({"LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8"}), 4, 0, False)
    assert index == 1 and warning is not None and "cuda:1" in warning
    # torchrun with one GPU shown (the same CUDA_VISIBLE_DEVICES for every rank): shared
    index, warning = rank_gpu(node_ranks({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}), 1, 0, True)
    assert index == 0 and warning is not None


def test_srun_binding_each_task_to_a_gpu_is_not_sharing() -> None:
    """``srun --gpus-per-task=1``: each task sees one GPU, its own, through
    CUDA_VISIBLE_DEVICES; local rank 1 delivers to that one, cuda:0, without a warning. One
    GPU not so restricted is the node's only one, shared."""
    assert rank_gpu(node_ranks(SRUN), 1, 0, True) == (0, None)
    index, warning = rank_gpu(node_ranks(SRUN), 1, 0, False)
    assert index == 0 and warning is not None and "SLURM_STEP_TASKS_PER_NODE=3" in warning


def test_ranks_on_a_node_without_a_local_rank_cannot_be_told_apart() -> None:
    index, warning = rank_gpu(node_ranks({"LOCAL_WORLD_SIZE": "2"}), 2, 0, False)
    assert index == 0 and warning is not None
    assert "LOCAL_WORLD_SIZE=2 ranks on this node, but no LOCAL_RANK" in warning
    assert "every rank would deliver to cuda:0" in warning
    assert rank_gpu(node_ranks({"LOCAL_WORLD_SIZE": "2"}), 2, 1, False) == (1, None)  # set: told
    assert rank_gpu(node_ranks({"LOCAL_WORLD_SIZE": "1"}), 2, 0, False) == (0, None)


@pytest.mark.parametrize(
    "launcher",
    [
        {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
        {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
        {"MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
    ],
    ids=["torchrun", "openmpi", "hydra"],
)
def test_the_loaders_defaults_divide_the_node(
    monkeypatch: pytest.MonkeyPatch, numbered: list[str], launcher: dict[str, str]
) -> None:
    """A loader made on a node of two ranks (as torchrun, Open MPI's or MPICH's mpirun say):
    the default ``num_workers`` and ``"auto"``'s processes are half the usable CPUs (at least
    1), ``stats`` says so; a number given is kept."""
    usable = usable_cpus()
    for name, value in launcher.items():
        monkeypatch.setenv(name, value)
    for workers in (None, "auto"):
        config = LoaderConfig.create({"batch_size": 4, "decode": None, "num_workers": workers})
        assert config.build.workers == config.build.cpus_per_rank == max(1, usable // 2)
        assert config.build.ranks_on_node == 2
    loader = aioloader.Loader(numbered, batch_size=4, decode=None, num_workers=3)
    assert loader.config.build.workers == 3
    stats = loader.stats
    assert (stats.ranks_on_node, stats.cpus_per_rank) == (2, max(1, usable // 2))
    for name in launcher:
        monkeypatch.delenv(name)
    stats = aioloader.Loader(numbered, batch_size=4, decode=None).stats
    assert (stats.ranks_on_node, stats.cpus_per_rank) == (1, usable)


def test_the_device_is_settled_when_the_loader_starts(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``settle_device``, the glue between the rule and torch.cuda (faked here: no GPU): cpu
    and ``cuda:N`` as given; ``"cuda"`` the local rank's GPU when CUDA was never initialised
    (no device can have been set), the current one when the user set it, the index an
    ``ImageDecoder(device="cuda:N")`` names; the warning logged where two ranks share."""
    from aioloader.run.start import settle_device

    base = aioloader.Loader(["a"], batch_size=1, decode=None).config

    def on(device: torch.device) -> LoaderConfig:  # a CUDA device this machine has not: not checked
        delivery = copy.copy(base.delivery)
        object.__setattr__(delivery, "device", device)
        return replace(base, delivery=delivery)

    assert settle_device(base) == torch.device("cpu")
    assert settle_device(on(torch.device("cuda", 2))) == torch.device("cuda", 2)
    cuda = on(torch.device("cuda"))
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert settle_device(cuda) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert settle_device(cuda) == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # torch.cuda.set_device(1)
    assert settle_device(cuda) == torch.device("cuda", 1)
    named = replace(cuda, decoding=Decoding(decode=aioloader.ImageDecoder(64, device="cuda:0")))
    assert settle_device(named) == torch.device("cuda", 0)
    assert caplog.records == []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with caplog.at_level("WARNING", logger="aioloader"):
        assert settle_device(cuda) == torch.device("cuda", 0)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "2 ranks on this node and 1 visible CUDA device(s)" in caplog.records[0].getMessage()
