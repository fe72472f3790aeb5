"""`finetune`: train a minibert Model on a task in JAX, with the hooks of run_with_hooks active throughout.

    from minibert import training
    result = training.finetune(model, training.examples("train.tsv"), task="sequence-classification")
    result.model              # a Model with the trained weights and the task's head
    result.history.loss       # per optimisation step

What one optimisation step computes is transformers' Trainer's: the task's mean cross-entropy over the batch
(classes, labelled tokens or masked tokens), its gradient with respect to the trainable parameters, then
optim.adamw. The step is one compiled program (forward, backward and AdamW), compiled once per row length: at
most data.STEP_PROGRAMS lengths, chosen from the run's own batches before the first step to pad the fewest tokens
(data.step_lengths); the progress bar says when one is compiled or loaded from the persistent compilation cache, and
result.step_lengths lists them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from minibert.core.config import Config
from minibert.core.encoder import GATHERED, unrolled_stack
from minibert.core.hooks import writers_for
from minibert.errors import InputError, is_whole
from minibert.io import checkpoint
from minibert.runtime.model import Inputs, Model, parameter_shapes
from minibert.training import data as data_
from minibert.training import guards, optim
from minibert.training.resume import Checkpoints, in_memory, on_disk, run_fingerprints

HEAD_CLASS = {"sequence-classification": "ForSequenceClassification",
              "token-classification": "ForTokenClassification", "masked-lm": "ForMaskedLM"}
# What a config.json without these keys means (transformers' BertConfig defaults).
TRAINING_DEFAULTS = {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "classifier_dropout": None,
                     "initializer_range": 0.02}


@dataclasses.dataclass
class History:
    loss: list[float] = dataclasses.field(default_factory=list)  # per optimisation step
    learning_rate: list[float] = dataclasses.field(default_factory=list)  # the rate each step used
    eval: list[dict] = dataclasses.field(default_factory=list)  # per epoch: epoch, loss, accuracy, f1


@dataclasses.dataclass
class Result:
    model: Model
    history: History
    new_parameters: list[str]  # parameters the base model lacked, initialised as transformers does
    devices: int = 1  # devices each step ran on (every process's under jax.distributed), rows split over them
    step_lengths: tuple[int, ...] = ()  # the row lengths the step ran at (data.step_lengths): one program each


# ---- the model for a task ---------------------------------------------------------------------------------


def task_config(cfg: Config, task: str, labels: tuple[str, ...]) -> Config:
    """The model's config with the task's head (<Family>ForSequenceClassification, …) and labels."""
    architecture = cfg.family.prefix + HEAD_CLASS[data_.checked_task(task)]
    if architecture not in cfg.family.architectures():
        raise InputError(f"{cfg.family.name} has no {architecture}, so minibert cannot fine-tune it for {task}.")
    return dataclasses.replace(cfg, architecture=architecture, id2label=labels or cfg.id2label)


def source_settings(model: Model) -> dict:
    """Dropout rates and initializer_range from the model's config.json (transformers' defaults if absent)."""
    settings = dict(TRAINING_DEFAULTS)
    directory = Path(model.source)
    if directory.is_dir():
        model_dir, _ = checkpoint.sentence_transformers_layout(directory)
        if (model_dir / "config.json").exists():
            config = json.loads((model_dir / "config.json").read_text())
            settings |= {k: config[k] for k in TRAINING_DEFAULTS if k in config}
    return settings


def initial_parameters(model: Model, shapes: Mapping[str, jax.ShapeDtypeStruct], seed: int,
                       initializer_range: float):
    """The base model's parameters where the task model (its parameters' `shapes`) has the same name and shape;
    the rest initialised as transformers' _init_weights does: weights N(0, initializer_range), LayerNorm gains 1,
    biases 0."""
    have = model.named_parameters()
    flat, new = {}, []
    keys = iter(jax.random.split(jax.random.key(seed), len(shapes)))
    for name, shape in shapes.items():
        key = next(keys)
        if name in have and have[name].shape == shape.shape:
            flat[name] = jnp.asarray(have[name], jnp.float32)
            continue
        new.append(name)
        if optim.decays(name):
            flat[name] = initializer_range * jax.random.normal(key, shape.shape, jnp.float32)
        else:
            flat[name] = (jnp.ones if name.endswith(".scale") else jnp.zeros)(shape.shape, jnp.float32)
    return flat, new


def with_head(model: Model, task: str = "sequence-classification", labels: tuple[str, ...] = ("LABEL_0", "LABEL_1"),
              *, seed: int = 0) -> Model:
    """`model` with the task's head: its own parameters where it has them, the head's new ones initialised as
    transformers does (what finetune starts from; save it to start transformers from the same weights)."""
    return _task_model(model, task, tuple(labels), seed)[0]


def _task_model(model: Model, task: str, labels: tuple[str, ...], seed: int) -> tuple[Model, list[str]]:
    if not is_whole(seed) or not 0 <= seed < 2**32:  # what both numpy's and jax's generators take
        raise InputError(f"seed={seed!r}: pass a whole number from 0 to 2**32 - 1.")
    cfg = task_config(model.config, task, labels)
    flat, new = initial_parameters(model, parameter_shapes(cfg), seed, source_settings(model)["initializer_range"])
    return Model.from_parameters(cfg, flat, model.tokenizer, pooling=model.pooling, source=model.source), new


# ---- loss and step ----------------------------------------------------------------------------------------


def task_loss(logits, batch, task: str):
    """Mean cross-entropy: over the batch's real rows (sequence), or over its labelled / masked tokens."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    labels = batch["labels"]
    if task == "sequence-classification":
        picked = jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]
        return -(picked * batch["weight"]).sum() / jnp.maximum(batch["weight"].sum(), 1.0)
    counted = labels != data_.IGNORE
    picked = jnp.take_along_axis(log_probs, jnp.where(counted, labels, 0)[..., None], axis=-1)[..., 0]
    return -(picked * counted).sum() / jnp.maximum(counted.sum(), 1)


@dataclasses.dataclass(frozen=True)
class TrainingStep:
    """Everything one compiled training step closes over (static: a new TrainingStep is a new program). The step's
    parameters, gradients and optimiser state are in one form, the task model's nested params dict (model.params,
    which its forward takes as it is); what it reads by name (which parameters stay float32, whether the last
    block may compute [CLS] alone) is read once per TrainingStep, not at each trace."""

    model: Model  # the task model: its forward, and the form of its parameters
    task: str
    rates: Mapping[str, float]  # forward_fn's dropout rates
    writer_def: object  # the structure of hooks.writers_for's {name: (HookFn, ...)}, flattened
    compute_dtype: object

    def logits(self, params, batch, key, writer_leaves):
        params = compute_parameters(params, self.compute_dtype, self.kept_float32)  # gradients reach the masters
        inputs = Inputs(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        # The hooks' leaves are the step's arguments (traced), so new hook values reuse the compiled step.
        out, _ = self.forward(params, inputs, key, writer_leaves=writer_leaves)
        return out.logits

    @functools.cached_property
    def forward(self) -> Callable:
        """The task model's forward with this TrainingStep's dropout and hooks (their leaves given at each trace)."""
        hooked = self.writer_def.node_data()[1]  # the names the hooks write: the keys of writers_for's dict
        return self.model.forward_fn(writer_def=self.writer_def, dropout=self.rates,
                                     first_token_only=self.first_token_only(hooked))

    @functools.cached_property
    def kept_float32(self):
        """Where compute_parameters keeps a parameter float32, a mask of the parameters' form (None in a float32
        step, which casts nothing)."""
        return None if self.compute_dtype == jnp.float32 else float32_parameters(self.model.params)

    def first_token_only(self, writers: Iterable[str]) -> bool:
        """Whether the step may compute the last block at [CLS] alone (Encoder.first_token_suffices): a sequence
        classifier's loss reads nothing else, unless a hook in the last block reads or writes another position."""
        last = f"blocks.{self.model.config.num_hidden_layers - 1}."
        return self.first_token_suffices and not any(name.startswith(last) for name in writers)

    @functools.cached_property
    def first_token_suffices(self) -> bool:
        """A sequence classifier whose head reads [CLS] alone, asked once per TrainingStep, not at each of its traces
        (the model's module is merged to answer it)."""
        return self.task == "sequence-classification" and self.model.module.first_token_suffices

    def loss(self, trainable, frozen, batch, key, writer_leaves):
        return task_loss(self.logits(optim.joined(trainable, frozen), batch, key, writer_leaves), batch, self.task)


class LateLosses:
    """Each update's loss, recorded one step late. float(loss) waits for the step that computed it: asked right
    after that step is dispatched, it leaves the accelerator idle while Python prepares the next batch (a host sync
    per step). Asked once the next step is dispatched, it waits for a step that is done or nearly so, and every
    loss still reaches the history and the progress bar. `flush` records what is pending (before a checkpoint, an
    evaluation, the end of the run)."""

    def __init__(self, record: Callable[[int, float, int], None]):
        self.record, self.pending = record, None  # record(update, mean loss, tokens)

    def add(self, update: int, losses: list, tokens: int) -> None:
        """Queue update's micro-batch losses (device scalars); record the update queued before it."""
        self.flush()
        self.pending = (update, losses, tokens)

    def flush(self) -> None:
        if self.pending is not None:
            update, losses, tokens = self.pending
            self.pending = None
            self.record(update, float(np.mean([float(x) for x in losses])), tokens)


def compiled_step(step: TrainingStep, optimizer: optax.GradientTransformation) -> Callable:
    """(trainable, frozen, opt_state, batch, key, writer_leaves) → (trainable, opt_state, loss), one program."""

    def train(trainable, frozen, opt_state, batch, key, writer_leaves):
        # unrolled: the scanned stack's backward costs ~2x and compiles slower (core.encoder.unrolled_stack)
        loss, grads = jax.value_and_grad(unrolled_stack()(step.loss))(trainable, frozen, batch, key, writer_leaves)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state, loss

    return jax.jit(train, donate_argnums=(0, 2))


def compute_parameters(params, dtype, kept=None):
    """The parameters a step computes with (a tree in either form of optim's), cast here and nowhere else (the
    optimiser keeps float32 masters). In `dtype`: every matmul weight and bias. Float32 still: the tables rows are
    gathered from (model.GATHERED: their gradient sums one row per token, 8,192 adds per token-type row at 32×512,
    which bf16 would round at every add; the embedded stream is cast once, Encoder.embedding) and LayerNorm's gain and
    bias (LayerNorm computes in float32: a bf16 gain would be converted straight back). `kept`:
    float32_parameters(params), made once by a caller that casts at every trace."""
    if dtype == jnp.float32:
        return params
    kept = float32_parameters(params) if kept is None else kept
    return jax.tree.map(lambda p, stays: p if stays else p.astype(dtype), params, kept)


def float32_parameters(params):
    """Whether compute_parameters keeps each parameter float32: the gathered tables, LayerNorm's gain and bias."""
    return optim.name_mask(params, lambda name: name in GATHERED or name.rsplit(".", 1)[-1] in ("scale", "bias"))


def compiled_eval(step: TrainingStep) -> Callable:
    """(params, batch, writer_leaves) → (loss, predictions) without dropout."""
    no_dropout = dataclasses.replace(step, rates={})

    def evaluate(params, batch, writer_leaves):
        logits = no_dropout.logits(params, batch, jax.random.key(0), writer_leaves)
        return task_loss(logits, batch, step.task), logits.argmax(-1)

    return jax.jit(evaluate)


class DataParallel:
    """Data parallelism over every device of the run: each batch's rows split evenly over them (padding rows of
    weight 0 make the count divisible), parameters and optimiser state replicated; jit then runs one program per
    device and XLA sums the gradients across them. With one device nothing is moved.

    Under jax.distributed (several processes, minibert.app.distributed.initialize) the devices are every
    process's: each process builds the same batches (same data, same seed) and places the rows its own devices
    hold, so the processes run one global step in lockstep, as the corpus survey does."""

    def __init__(self, devices=None):
        devices = sorted(jax.devices() if devices is None else devices, key=lambda d: (d.process_index, d.id))
        self.count, self.processes = len(devices), len({d.process_index for d in devices})
        mesh = jax.sharding.Mesh(np.array(devices), ("data",))
        self.by_row = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
        self.everywhere = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def rows(self, batch_size: int) -> int:
        return -(-batch_size // self.count) * self.count

    def split(self, batch: dict) -> dict:
        return batch if self.count == 1 else jax.device_put(batch, self.by_row)

    def replicated(self, tree):
        return tree if self.count == 1 else jax.device_put(tree, self.everywhere)

    def gathered(self, rows) -> np.ndarray:
        """A row-split result as one host array (from every process under jax.distributed)."""
        if self.processes == 1:
            return np.asarray(rows)
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(rows, tiled=True))

    def local(self, tree):
        """Replicated arrays as host arrays, so that the trained Model lives in this process alone."""
        return tree if self.processes == 1 else jax.tree.map(np.asarray, tree)


def dropout_rates(settings: Mapping, dropout: float | None) -> dict[str, float]:
    """Dropout(hidden=…, attention=…, classifier=…): the config's rates, or `dropout` for all three."""
    if dropout is not None:
        if not 0.0 <= dropout < 1.0:
            raise InputError(f"dropout={dropout!r}: pass a rate in [0, 1) or None for the config's rates.")
        return {"hidden": dropout, "attention": dropout, "classifier": dropout}
    hidden = settings["hidden_dropout_prob"]
    classifier = settings["classifier_dropout"]
    return {"hidden": hidden, "attention": settings["attention_probs_dropout_prob"],
            "classifier": hidden if classifier is None else classifier}


# ---- evaluation -------------------------------------------------------------------------------------------


def macro_f1(predicted: np.ndarray, gold: np.ndarray, classes: int) -> float:
    """Mean over classes of 2·TP / (2·TP + FP + FN) (a class absent from both counts 0; scikit-learn's macro)."""
    scores = []
    for c in range(classes):
        tp = np.sum((predicted == c) & (gold == c))
        wrong = np.sum((predicted == c) != (gold == c))
        scores.append(2 * tp / (2 * tp + wrong) if tp + wrong else 0.0)
    return float(np.mean(scores))


def evaluate(evaluator, params, encoded, settings, writer_leaves, classes: int, devices: DataParallel) -> dict:
    """Loss (mean over batches, weighted by what each batch counts), accuracy and macro-F1 on `encoded`."""
    order = np.arange(len(encoded))
    total, weight, predicted, gold = 0.0, 0.0, [], []
    for batch in data_.batches(encoded, order, **settings):
        loss, prediction = evaluator(params, devices.split(batch), writer_leaves)
        prediction = devices.gathered(prediction)
        if batch["labels"].ndim == 1:
            counted = batch["weight"] > 0
        else:
            counted = batch["labels"] != data_.IGNORE
        total += float(loss) * counted.sum()
        weight += counted.sum()
        predicted.append(np.asarray(prediction)[counted])
        gold.append(batch["labels"][counted])
    predicted, gold = np.concatenate(predicted), np.concatenate(gold)
    return {"loss": float(total / max(weight, 1)), "accuracy": float(np.mean(predicted == gold)),
            "f1": macro_f1(predicted, gold, classes)}


# ---- the loop ---------------------------------------------------------------------------------------------


def finetune(model: Model, data, task: str = "sequence-classification", *, num_labels: int | None = None,
             epochs: int = 3, batch_size: int = 16, learning_rate: float = 2e-5, weight_decay: float = 0.01,
             warmup: float | int = 0.1, schedule: str = "linear", max_grad_norm: float | None = 1.0,
             dropout: float | None = None, shuffle: bool = True, seed: int = 0, eval_data=None,
             resume: str | Path | None = None, hooks=None, trainable=None, accumulate: int = 1,
             compute_dtype=jnp.float32, progress: bool = True, checkpoint_every: int = 50) -> Result:
    """Fine-tune `model` on `data` (training.examples, or what it takes) for `task`; see the module docstring.

    A model that has the task's head continues from its weights; a base model gets a new head initialised as
    transformers does. `hooks`: {name: fn} as run_with_hooks takes them, applied in every step (interventional
    training). `trainable`: globs over parameter names (optim.parameter_names) that move; None moves all.
    `resume`: a directory where the run saves its state (every `checkpoint_every` updates and at each epoch's
    end) and from which a run with the same settings, data, base model and hooks continues, to the same bits
    (resume.py); a folder holding anything but a run's checkpoints is refused.
    `compute_dtype`: jnp.bfloat16 (or "bfloat16") computes in bf16 with fp32 master weights and optimiser state.
    `accumulate`: micro-batches of `batch_size` per update, their gradients averaged. Settings that cannot train
    (a rate ≤ 0, a negative decay, …) are InputErrors naming the setting; a run whose loss or weights stop being
    finite stops with a DivergedError naming the update, and saves nothing after it (guards.py).
    """
    task = data_.checked_task(task)
    rows = data_.examples(data, task=task)
    compute_dtype = _checked_settings(epochs, batch_size, learning_rate, weight_decay, max_grad_norm, compute_dtype)
    if compute_dtype == jnp.bfloat16 and jax.default_backend() == "cpu":
        warnings.warn(CPU_BF16, stacklevel=2)
    accumulate = optim.checked_accumulate(accumulate)
    if not is_whole(checkpoint_every) or checkpoint_every < 1:
        raise InputError(f"checkpoint_every={checkpoint_every!r}: pass a whole number of updates, at least 1.")
    names = data_.label_names(rows, task, num_labels, data_.source_name(data))
    start, new = _task_model(model, task, names, seed)
    cfg, settings = start.config, source_settings(model)
    # The step's one form of parameters: the nested params dict. `trainable`'s globs are matched to the dotted names
    # once, here, giving a mask of that form.
    params = start.params
    moving = optim.selected(optim.parameter_names(params), trainable)
    trainable_params, frozen = optim.split(params, optim.name_mask(params, moving.__contains__))
    # Copies: the step donates its parameters' buffers, which must not be the caller's model's.
    trainable_params = jax.tree.map(lambda p: jnp.array(p, copy=True), trainable_params)

    encoded = data_.encode(model, rows, task, names, data_.source_name(data))
    per_epoch = data_.steps_per_epoch(len(encoded), batch_size)
    total_steps = -(-epochs * per_epoch // accumulate)
    lr = optim.learning_rate_schedule(learning_rate, total_steps, warmup=warmup, schedule=schedule)
    guards.check_warmup(warmup, optim.warmup_steps(warmup, total_steps), total_steps)
    optimizer = optim.adamw(lr, weight_decay=weight_decay, mask=optim.decay_mask(trainable_params),
                            max_grad_norm=max_grad_norm, accumulate=accumulate)
    opt_state = optimizer.init(trainable_params)

    writers = writers_for(hooks, start.hook_names, cfg)  # the task model's names: its head's too
    writer_leaves, writer_def = jax.tree_util.tree_flatten(writers)
    step = TrainingStep(start, task, dropout_rates(settings, dropout), writer_def, compute_dtype)
    train = compiled_step(step, optimizer)
    devices = DataParallel()
    if devices.processes > 1 and resume is not None:
        raise InputError("resume= under jax.distributed (several processes) is not supported yet; run without "
                         "resume=, or in one process.")
    trainable_params, frozen, opt_state = devices.replicated((trainable_params, frozen, opt_state))
    orders = [data_.epoch_order(len(encoded), epoch, seed, shuffle) for epoch in range(epochs)]
    lengths = data_.step_lengths(data_.longest_rows(encoded, orders, batch_size), cfg.max_tokens)
    batch_settings = dict(batch_size=batch_size, task=task, buckets=lengths, pad_id=cfg.pad_token_id,
                          mask_id=_mask_id(model, task), vocab_size=cfg.vocab_size, rows=devices.rows(batch_size))
    evaluator = compiled_eval(step) if eval_data is not None else None
    # The eval batches pad to the step's lengths where they fit (the longer ones to the model's buckets past them).
    eval_buckets = lengths + tuple(b for b in model.programs.length_buckets if b > lengths[-1])
    eval_encoded = data_.encode(model, data_.examples(eval_data, task=task), task, names,
                                 data_.source_name(eval_data, "the eval data")) if evaluator else None

    history, micro = History(), 0
    checkpoints = Checkpoints(resume) if resume is not None else None
    run_settings = {"task": task, "labels": list(names), "examples": len(rows), "epochs": epochs,
                    "batch_size": batch_size, "learning_rate": learning_rate, "weight_decay": weight_decay,
                    "warmup": warmup, "schedule": schedule, "max_grad_norm": max_grad_norm, "dropout": dropout,
                    "shuffle": shuffle, "seed": seed, "accumulate": accumulate,
                    "compute_dtype": str(step.compute_dtype), "trainable": sorted(moving)}
    if checkpoints is not None:
        run_settings |= run_fingerprints(model, encoded, eval_encoded, writers)
        run_state = {"params": trainable_params, "opt": opt_state}
        found = checkpoints.restore(on_disk(run_state, trainable_params), run_settings)  # named as resume.py says
        if found is not None:
            micro, saved, meta = found
            saved = in_memory(saved, run_state, trainable_params)
            trainable_params, opt_state = devices.replicated((saved["params"], saved["opt"]))
            history = History(**meta["history"])

    def save():
        if checkpoints is not None:
            guards.check_weights(trainable_params, micro // accumulate, total_steps, learning_rate)
            checkpoints.save(micro, on_disk({"params": trainable_params, "opt": opt_state}, trainable_params),
                             {"settings": run_settings, "history": dataclasses.asdict(history)})

    dropout_key = jax.random.key(seed)
    shown = progress and jax.process_index() == 0  # one bar per run, not one per process
    with optim.Progress(total_steps, f"fine-tuning ({task})", enabled=shown) as bar:
        bar.bar.update(len(history.loss))

        def record(update: int, loss: float, tokens: int):
            history.loss.append(loss)
            with jax.default_device(jax.local_devices(backend="cpu")[0]):  # not queued behind the running step
                history.learning_rate.append(float(lr(update)))
            guards.check_loss(loss, update + 1, total_steps, history.learning_rate[-1])
            guards.check_growth(history.loss, update + 1, total_steps, history.learning_rate[-1])
            bar.update(loss, tokens)

        late = LateLosses(record)
        for epoch in range(micro // per_epoch, epochs):
            losses, tokens = [], 0
            first = micro - epoch * per_epoch
            for batch in data_.batches(encoded, orders[epoch], mask_seed=(seed, epoch), first=first, **batch_settings):
                key = jax.random.fold_in(dropout_key, micro)
                with bar.compiling(batch["input_ids"].shape[1]):
                    trainable_params, opt_state, loss = train(trainable_params, frozen, opt_state,
                                                              devices.split(batch), key, writer_leaves)
                micro += 1
                losses.append(loss)
                tokens += int(batch["attention_mask"].sum())
                if micro % accumulate == 0:
                    update = micro // accumulate - 1
                    late.add(update, losses, tokens)
                    losses, tokens = [], 0
                    if (update + 1) % checkpoint_every == 0 and micro % per_epoch:  # the epoch's end saves below
                        late.flush()
                        save()
            late.flush()
            if evaluator is not None:
                # the same masks every epoch
                eval_settings = dict(batch_settings, buckets=eval_buckets, mask_seed=(seed, epochs))
                scores = evaluate(evaluator, optim.joined(trainable_params, frozen), eval_encoded, eval_settings,
                                  writer_leaves, len(names) or cfg.vocab_size, devices)
                history.eval.append({"epoch": epoch + 1, **scores})
            if micro % accumulate == 0:  # a checkpoint never holds half an accumulation
                save()
    if checkpoints is not None:
        checkpoints.close()
    guards.check_weights(trainable_params, micro // accumulate, total_steps, learning_rate)

    trained = Model(cfg, devices.local(optim.joined(trainable_params, frozen)), model.tokenizer,
                    pooling=model.pooling, source=model.source)
    return Result(trained, history, new, devices.count, tuple(bar.lengths))


COMPUTE_DTYPES = ("float32", "bfloat16")  # float16 would need loss scaling, which finetune does not do
CPU_BF16 = ("compute_dtype=bfloat16 on a CPU is slower than float32, not faster: XLA:CPU has no bf16 matmul kernels "
            "and converts each bf16 product's operands to float32 and its result back (benchmarks/RESULTS.md, 'bf16 "
            "compute on a CPU'). Train in float32 here; bfloat16 pays on GPUs and TPUs.")


def _checked_settings(epochs, batch_size, learning_rate, weight_decay, max_grad_norm, compute_dtype) -> jnp.dtype:
    """Refuse settings that cannot train (a typo would otherwise run, silently doing nothing or diverging);
    returns compute_dtype as a dtype."""
    if not (is_whole(epochs) and is_whole(batch_size)) or epochs < 1 or batch_size < 1:
        raise InputError(f"epochs={epochs!r}, batch_size={batch_size!r}: both must be whole numbers, at least 1.")
    if not (isinstance(learning_rate, numbers.Real) and 0 < learning_rate < math.inf):
        raise InputError(f"learning_rate={learning_rate!r}: pass a positive, finite peak rate (e.g. 2e-5).")
    if not weight_decay >= 0:
        raise InputError(f"weight_decay={weight_decay!r}: pass 0 (none) or a positive decay (e.g. 0.01).")
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise InputError(f"max_grad_norm={max_grad_norm!r}: pass a positive norm to clip to, or None for no clipping.")
    try:
        dtype = jnp.dtype(compute_dtype)
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in COMPUTE_DTYPES:
        raise InputError(f"compute_dtype={compute_dtype!r}: pass one of {', '.join(COMPUTE_DTYPES)} (bfloat16: "
                         f"bf16 compute with float32 master weights).")
    return dtype


def _mask_id(model: Model, task: str) -> int | None:
    if task != "masked-lm":
        return None
    return int(model.tokenize([model.tokenizer.mask_token]).input_ids[0, 1])
