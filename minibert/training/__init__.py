"""Training inside minibert: fine-tuning (finetune), its data (examples), saving for transformers (save, which
minibert.io.checkpoint writes), and the optimiser every trainer shares (optim).

    from minibert import training
    result = training.finetune(model, training.examples("train.tsv"), task="sequence-classification")
    result.model.save("out/")
"""

from minibert.io.checkpoint import save
from minibert.training import optim
from minibert.training.data import TASKS, Example, examples
from minibert.training.finetune import History, Result, finetune, with_head

__all__ = ["TASKS", "Example", "History", "Result", "examples", "finetune", "optim", "save", "with_head"]
