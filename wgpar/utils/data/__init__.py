"""Datasets, samplers and the DataLoader, as in ``torch.utils.data``.

    from wgpar.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, generator=0, device=dev)
    for xb, yb in loader:  # wgpar tensors on dev; the next batches upload on a background thread
        ...
"""

from .collate import default_collate, to_device
from .dataloader import DataLoader
from .dataset import Dataset, TensorDataset
from .sampler import BatchSampler, DistributedSampler, RandomSampler, Sampler, SequentialSampler
from .worker import WorkerInfo, get_worker_info

__all__ = ["Dataset", "TensorDataset", "DataLoader", "default_collate", "to_device", "Sampler", "SequentialSampler",
           "RandomSampler", "BatchSampler", "DistributedSampler", "get_worker_info", "WorkerInfo"]
