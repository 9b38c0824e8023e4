"""hvd_bridge.torch.elastic.sampler (horovod.torch.elastic.sampler): ElasticSampler."""
import random

import torch

from ..mpi_ops import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ElasticSampler: splits a dataset's indices over the ranks, like
    DistributedSampler, and after a reset splits what is left of the epoch over the new ranks.
    Put it in the TorchState (``TorchState(model, opt, sampler=sampler)``), call
    ``record_batch(batch_idx, batch_size)`` after each batch and ``set_epoch(epoch)`` at the end
    of each epoch. dataset: its size must not change; shuffle: a new order each epoch, the same
    on every rank (seeded with seed + epoch)."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_num = 0  # samples of this epoch done, over all ranks
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch` afresh (call it at the end of an epoch, so that a reset in the
        middle of one does not go over its samples again)."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """batch_size samples done on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        """Splits the epoch's remaining indices over the ranks there are now."""
        self.num_replicas, self.rank = size(), rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = -(-len(self.remaining_indices) // self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        # Padded with the first indices to a multiple of the ranks, then every rank's share.
        padded = self.remaining_indices + self.remaining_indices[
            :self.total_size - len(self.remaining_indices)]
        self.indices = padded[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
