"""How a role's model spreads over its ranks: the parallel pieces of the workers, in one
folder (issue 38). `core/layout.RoleLayout` says how the ranks are arranged; these
modules do the sharding on the model:

- `parallelize.py`: a role's parallelism applied in one order (tp, then sp, then the
  backend's dp wrap);
- `tensor_parallel.py`: the DTensor plan of a model's layers, embedding and head, and
  clipping gradients held on several meshes;
- `vocab_parallel.py`: log-probs and entropy from a head sharded by vocabulary;
- `shard_build.py`: a tensor-parallel model built from safetensors one shard at a time;
- `gather.py`: sharded weights gathered whole bucket by bucket (sync, export);
- `sharded_checkpoint.py`: per-rank DCP checkpoints, resharded onto another layout;
- `safe_dcp.py`: the one door to a DCP directory (nothing from a run directory is
  unpickled).

The modules' old paths (in workers/ and workers/backends/) still import, with a
MovedImportWarning (`core/moved.py` lists them).
"""
