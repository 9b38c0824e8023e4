"""hvd_bridge.common: what horovod.common holds for every framework binding (its exceptions)."""
