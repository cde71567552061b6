"""BERT phase-1 pretraining for the trainium-operator training image.

Modules: `pretrain` (the torchrun script), `arguments`, `model_configs`, `shards` (HDF5 format
and reader), `make_shards` (synthetic data CLI), `check_shards` (validate a data folder),
`data_stream` (per-rank shard assignment, resumable position), `optimizers` (AdamW, LAMB,
warmup), `checkpoints`, `devices` (XLA/Neuron or CPU+gloo), `metrics`.
"""
