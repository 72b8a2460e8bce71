"""Pure plans: which samples go where, and where an epoch resumes. No I/O, no event loop,
no processes (an import-linter contract keeps it so); tested without a loop.

| module | role |
| --- | --- |
| ``sampler.py`` | epoch order, rank shards, the batch plan, a re-sharded remainder (one order sliced) |
| ``resume.py`` | ``state_dict`` contents, their checks, an epoch's plan (made once, by its runtime) |
| ``epochs.py`` | which epoch the next iteration runs: ``set_epoch``, automatic epochs, a loaded state |
| ``node.py`` | the ranks of one node (torchrun, srun): this rank's GPU and its part of the node's CPUs |
| ``locality.py`` | the shard-local order: shards whole, shuffled, mixed in a buffer; contiguous rank blocks |
| ``repack.py`` | full batches despite skipped samples (``drop_last`` with ``on_error="skip"``) |
| ``settings.py`` | ``Sampling``: the sampling part's settings (batch size, order, seed, ranks), checked |
"""
