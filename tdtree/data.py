"""Datasets and minibatches: a node's rows as a ``torch.utils.data`` dataset, and a shuffled minibatch
iterator that needs no DataLoader.

* ``td.as_dataset()`` (a :class:`TensorDictDataset`): ``len`` is the first batch dim (``len(td)``
  counts keys: a node is a mapping), a batch is read in one index operation. A tensorclass instance is
  a dataset itself.
* :func:`minibatches`: ``for batch in tdtree.data.minibatches(td, 64): ...``, one index operation per
  batch, the order torch's ``RandomSampler`` draws from the same generator.
* Preallocation: ``spec.memmap_like(prefix)`` (a node or tensorclass instance whose leaves may be meta
  tensors) creates the files at their final size; fill them with ``at[i:j].set_(chunk)``.

Imported on first use of ``tdtree.data``; the DataLoader support (``__getitems__``, the default collate
of nodes) is there from ``import tdtree``.
"""

from ._dataset import Minibatches, TensorDictDataset, minibatches

__all__ = ["TensorDictDataset", "Minibatches", "minibatches"]
