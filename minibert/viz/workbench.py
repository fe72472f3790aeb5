"""The live workbench's computations: what `minibert serve` and the notebook widget (viz.explore) answer.

    wb = Workbench(model)                               # what `minibert serve` answers with
    wb.run({"text": "The cat [MASK] on the mat."})      # tokens, views, outputs (before / after an ablation)
    wb.step({"text": "…", "layer": 2, "head": 5, "query": 3})   # one head's computation, with its numbers

Every request is a JSON object and every answer a JSON-ready dict (docs/serve.md lists the fields), so the
HTTP server (minibert.app.serve) and the widget answer with the same function, `Workbench.answer`.

How it stays fast: the text is tokenized, padded to a length bucket (buckets.length_buckets) and run by one
program per row length Model.run pads the bucket to (Workbench.program_length: the buckets up to 64 share one),
which captures every value the views and the step-through show and ablates heads through a traced HookFn mask
(interventions.ablate_heads): an ablation, a new head or a new sentence of the same length reuse the compiled
program. Runs are kept in a small LRU cache, so the step-through of
another head or query reads the run it belongs to instead of running again. Layers, heads and token
positions are 0-indexed in requests and answers; the page labels heads "L-H", 1-indexed.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from minibert.analysis import flow, mixing
from minibert.analysis.interventions import ablate_heads
from minibert.core.config import head_label
from minibert.core.hooks import HookFn
from minibert.core.site_names import ATTN_SCORES, PATTERN, ROT_K, ROT_Q, K, Q, Z, every_block, in_block
from minibert.core.sites import PATTERNS
from minibert.errors import InputError
from minibert.runtime.buckets import bucket_length, length_buckets
from minibert.runtime.buckets import cut as cut_to_length
from minibert.runtime.pooling import pooled_tokens
from minibert.viz import panels, views
from minibert.viz._request import index as _index
from minibert.viz.steps import SHOWN, hook_name, step_through

MAX_CHARS = 2000  # per text: a paragraph; longer input is refused with a message, not truncated silently
MAX_TOKENS = 128  # per request (text and pair together): the views stay readable and the answers fast
TOP_K = 5  # masked-LM predictions shown per [MASK]
CACHED_RUNS = 4  # runs kept for the step-through and the "before" of an ablation (~55 MB each at 128 tokens)
MIXING_METHODS = ("attention", "rollout", "value_zeroing", "alti")
MAP_NAMES = {"rollout": "rollout", "value_zeroing": "value zeroing", "alti": "ALTI"}  # as the views label a map
ABLATION_MODES = ("zero", "mean")

@dataclasses.dataclass(frozen=True)
class Request:
    """One request's input, checked: the text (and sentence B), heads to ablate [[layer, head], …] and how."""

    text: str
    pair: str | None
    ablate: tuple[tuple[int, int], ...]
    mode: str


@dataclasses.dataclass(frozen=True)
class Run:
    """One forward on real tokens: captures {hook name: array without the batch axis}, the output fields."""

    tokens: list[str]
    offsets: list[tuple[int, int]]
    ids: np.ndarray  # [T]
    sentence_b_start: int | None
    captures: dict[str, np.ndarray]
    logits: np.ndarray | None
    similarity: float | None
    views: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)  # its views' data, once built

    def stack(self, site: str) -> np.ndarray:
        """One block site over every layer, [L, …]."""
        n_layers = sum(1 for name in self.captures if name.endswith("." + site) and name.startswith("blocks."))
        return np.stack([self.captures[f"blocks.{layer}.{site}"] for layer in range(n_layers)])


def _attention_change(before: Run, after: Run) -> dict:
    """Where an ablation shows in the attention: {per_layer: max |after − before| of each layer's patterns over its
    heads, queries and keys, per_head: the same of each head ([L][H]: the page's after − before map), first_layer:
    the first layer (0-indexed) where per_layer is not 0, or None}. The two runs
    are one compiled program on one input up to the ablated head's output, so the layers before it (and its own
    pattern, which the ablation follows) are equal bit for bit: any nonzero difference is the ablation's."""
    pattern = after.stack(PATTERN)  # [L, H, T, S]
    heads = np.abs(pattern.astype(np.float64) - before.stack(PATTERN)).reshape(*pattern.shape[:2], -1)
    gaps = heads.max(axis=(1, 2))
    changed = np.flatnonzero(gaps > 0)
    return {"per_layer": [float(gap) for gap in gaps], "per_head": heads.max(axis=2).tolist(),
            "first_layer": int(changed[0]) if changed.size else None}


TEXT_FIELDS = {"text": "the text", "pair": "sentence B"}  # a request's text fields, as the page labels them


def _text(body: Mapping, key: str, required: bool) -> str | None:
    value = body.get(key)
    if value is None or (value == "" and not required):
        if required:
            raise InputError(f"the request needs {key!r}: the text to run.")
        return None
    if not isinstance(value, str):
        raise InputError(f"{key!r} must be a string; got {type(value).__name__}.")
    name = TEXT_FIELDS[key]  # what a student reads beside the box they typed in, not the request's field name
    if not value.strip():
        raise InputError(f"{name} is empty; type a sentence.")
    if len(value) > MAX_CHARS:  # the page keeps the text whole (no maxlength cutting a paste): the student shortens it
        raise InputError(f"{name} has {len(value):,} characters; the workbench takes at most {MAX_CHARS:,} per text "
                         f"(its first {MAX_CHARS:,} end “…{value[MAX_CHARS - 20:MAX_CHARS]}”). Shorten it; nothing "
                         f"was cut.")
    return value


class Workbench:
    """Answers the workbench's requests for one model (fixed at construction; no request names a path)."""

    def __init__(self, model, *, max_tokens: int = MAX_TOKENS, resources: Mapping | None = None):
        """resources: what panels read besides the model, by name (`resource`): --transcoder's transcoders,
        --compare's model and --crosscoder's crosscoder."""
        cfg = model.config
        if model.tokenizer is None:
            raise InputError("the workbench needs a model with a tokenizer (minibert.load gives one).")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 3:
            raise InputError(f"max_tokens (minibert serve --max-tokens) must be a whole number of at least 3 "
                             f"([CLS], a word, [SEP]); got {max_tokens!r}.")
        self.model, self.max_tokens = model, min(max_tokens, cfg.max_tokens)
        self.buckets = length_buckets(self.max_tokens)
        # One run captures every value the step-through shows, of every layer (the views read pattern, q and k).
        wanted = (hook_name(step.site, layer) for layer in range(cfg.num_hidden_layers) for step in cfg.family.steps)
        present = set(model.hook_names)
        self._capture = [name for name in dict.fromkeys(wanted) if name in present]
        self._runs: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()  # guards the run cache; one forward at a time
        # One answer of each kind at a time: memory stays flat under concurrent clients (an answer holds its run's
        # captures and packed views, a few MB each at 128 tokens). A mixing map that compiles for seconds does not
        # hold up the runs and steps an edit asks for; info, tokenize and status wait for nothing.
        # Each panel (viz/panels.py) answers under its own lock, or one it shares with panels naming the same lock.
        answering, mixing_one = threading.Lock(), threading.Lock()
        self._panels = panels.table()
        clash = sorted(set(self._panels) & set(CORE_ACTIONS))
        if clash:
            raise InputError(f"the panel {clash[0]!r} is named as one of the workbench's own actions; rename it.")
        shared = {name: threading.Lock() for name in dict.fromkeys(p.lock or p.name for p in self._panels.values())}
        self._answer_locks = {"run": answering, "step": answering, "mixing": mixing_one,
                              **{p.name: shared[p.lock or p.name] for p in self._panels.values()}}
        self._actions = {**CORE_ACTIONS, **{p.name: p.answer for p in self._panels.values()}}
        self._resources = dict(resources or {})
        self._programs = FirstRuns()
        self._drawing = ThreadPoolExecutor(1, thread_name_prefix="workbench-views")  # see _built_views

    # ---- requests -------------------------------------------------------------------------------------

    def answer(self, action: str, body: Mapping) -> dict:
        """The answer to one API request: action one of `actions`, body its JSON object."""
        if action not in self._actions:
            raise InputError(f"unknown action {action!r}; the workbench answers {', '.join(self._actions)}.")
        if not isinstance(body, Mapping):
            raise InputError("the request body must be a JSON object, e.g. {\"text\": \"The cat sat.\"}.")
        lock = self._answer_locks.get(action)
        if lock is None:
            return self._actions[action](self, body)
        with lock:
            return self._actions[action](self, body)

    @property
    def actions(self) -> tuple[str, ...]:
        """The actions this workbench answers: CORE_ACTIONS, then its panels' (viz/panels.py)."""
        return tuple(self._actions)

    @property
    def programs(self) -> tuple[str, ...]:
        """What `status` may name: the compiled programs this workbench runs, its panels' included."""
        return (*CORE_PROGRAMS, *(what for p in self._panels.values() for what in p.programs))

    # ---- what a panel reads (viz/panels.py): the public side of the run cache and the programs ----------

    def request(self, body: Mapping) -> Request:
        """The body's text, sentence B, ablated heads and mode, checked (InputError naming a bad field)."""
        return self._request(body)

    def cached_run(self, request: Request) -> Run:
        """The run of this request, from the run cache when the page has just asked for it (the usual case: a
        panel asks after "run"), else run now and cached."""
        return self._run(request)

    def padded_inputs(self, request: Request) -> dict:
        """The request's one-row batch {input_ids, token_type_ids, attention_mask} padded to its length bucket,
        as the runs are: a panel's program then compiles once per bucket, not once per text length."""
        batch = self._batch(request)
        return self._padded(batch.input_ids, batch.token_type_ids)

    def compiling(self, what: str, length: int):
        """The context a panel's program `what` (one of its Panel.programs) runs in for rows of `length`: a
        first run compiles, and `status` says so meanwhile."""
        if what not in self.programs:
            raise InputError(f"{what!r} is not a program of this workbench's ({', '.join(self.programs)}): name it "
                             f"in the panel's programs.")
        return self._programs.first(what, length)

    def resource(self, name: str):
        """What the workbench was given for its panels under `name` (Workbench(resources=…)), or None."""
        return self._resources.get(name)

    def status(self, body: Mapping | None = None) -> dict:
        """What is compiling now (the page says "compiling for 64-token texts…" while it waits): [{what, tokens}],
        `what` one of `programs`, `tokens` the row length the program runs at (`program_length`)."""
        return {"compiling": self._programs.compiling()}

    def info(self, body: Mapping | None = None) -> dict:
        """What the page needs to draw its controls: the model, its sizes, its head, the limits."""
        cfg, tokenizer = self.model.config, self.model.tokenizer
        return {"model": self.model.source, "family": cfg.family.name, "architecture": cfg.architecture,
                "layers": cfg.num_hidden_layers, "heads": cfg.num_attention_heads, "d_model": cfg.hidden_size,
                "d_head": cfg.head_dim, "d_ffn": cfg.intermediate_size, "outputs": self._output_kinds(),
                "mask_token": tokenizer.mask_token, "unk_token": tokenizer.unk_token, "max_chars": MAX_CHARS,
                "max_tokens": self.max_tokens,
                "mixing_methods": list(MIXING_METHODS), "ablation_modes": list(ABLATION_MODES),
                "head_labels": [[head_label(layer, head) for head in range(cfg.num_attention_heads)]
                                for layer in range(cfg.num_hidden_layers)]}

    def tokenize(self, body: Mapping) -> dict:
        request = self._request(body)
        batch = self._batch(request)
        return {"tokens": batch.tokens[0], "offsets": [list(span) for span in batch.offsets[0]],
                "sequence_ids": batch.sequence_ids[0], "sentence_b_start": _b_start(batch)}

    def run(self, body: Mapping) -> dict:
        """Tokens, the head / model / neuron views, and the outputs; with heads to ablate, outputs before and
        after and the views of the ablated run."""
        request = self._request(body)
        before = self._run(dataclasses.replace(request, ablate=()))
        after = self._run(request) if request.ablate else before
        answer = {"tokens": after.tokens, "offsets": [list(span) for span in after.offsets],
                  "sentence_b_start": after.sentence_b_start, "ablated": [list(pair) for pair in request.ablate],
                  "mode": request.mode, "views": self._views(after),
                  "outputs": {"before": self._outputs(before)}}
        if request.ablate:
            answer["outputs"]["after"] = self._outputs(after)
            answer["change"] = _attention_change(before, after)
        return answer

    def step(self, body: Mapping) -> dict:
        """One head's computation for one query token, every value from the hooks (viz/steps.py). Where the request
        ablates this head, `ablated` says how and gives the steps of the run before the ablation, whose z is
        Σ_s α_s v_s (the ablated run's z is the replacement); else it is null."""
        request = self._request(body)
        cfg = self.model.config
        layer = _index(body, "layer", cfg.num_hidden_layers, "layers", 0)
        head = _index(body, "head", cfg.num_attention_heads, "heads", 0)
        run = self._run(request)
        query = _index(body, "query", len(run.tokens), "tokens here", min(1, len(run.tokens) - 1))
        walk = functools.partial(step_through, layer=layer, head=head, query=query, d_head=cfg.head_dim,
                                 model=self.model)
        ablated = None
        if (layer, head) in request.ablate:
            ablated = {"mode": request.mode, "before": walk(self._run(dataclasses.replace(request, ablate=())))}
        return {"layer": layer, "head": head, "query": query, "tokens": run.tokens, "shown": SHOWN,
                "steps": walk(run), "ablated": ablated}

    def mixing(self, body: Mapping) -> dict:
        """The head and model views of a context-mixing map instead of raw attention (one map per layer:
        shown as a single head), of the model as the request's ablation leaves it (`_mixing_maps`)."""
        request = self._request(body)
        method = body.get("method", "attention")
        if method not in MIXING_METHODS:
            raise InputError(f"method {method!r} is not one of {', '.join(MIXING_METHODS)}.")
        run = self._run(request)
        if method == "attention":
            return {"method": method, "views": self._views(run)}
        maps = self._mixing_maps(run, request, method)[:, None]  # [L, 1, T, T]
        tokens, b_start = run.tokens, run.sentence_b_start
        shown = {"head": views.head_view(tokens, maps, b_start, level=0).data,
                 "model": views.model_view(tokens, maps, b_start, level=0).data}
        for data in shown.values():  # the views name the one map per layer by its method, not "Head 1"
            data["meta"]["map_name"] = MAP_NAMES[method]
        return {"method": method, "views": shown}

    def program_length(self, length: int, rows: int = 1) -> int:
        """The row length `rows` rows of `length` tokens run at: padded to their bucket here, then further by
        Model.run (model.programs.padded_length: from 64 tokens for a few rows), so that several buckets share one
        program."""
        return self.model.programs.padded_length(bucket_length(length, self.buckets), rows)

    def warm_up_lengths(self) -> tuple[int, ...]:
        """One text length per program a run or similarity compiles (the longest bucket it serves), shortest first:
        what `warm_up` needs to be given for every program to compile once."""
        longest = {(self.program_length(bucket), self.program_length(bucket, 2)): bucket for bucket in self.buckets}
        return tuple(longest.values())

    def warm_up(self, length: int) -> None:
        """Compile the programs a text of `length` tokens runs, before a request waits for them. It holds no lock a
        request needs: a request for another program runs meanwhile, and one for this program waits for this
        compile only (which it would need anyway). Mixing maps compile when first asked (`mixing`)."""
        ids = np.full((1, length), self.model.tokenizer.cls_token_id)
        hooks = self._hooks((), self._replacement(Request("", None, (), "zero")))
        with self._programs.first("run", self.program_length(length)):
            self.model.run(self._padded(ids, np.zeros_like(ids)), names=self._capture, hooks=hooks)
        if self.model.pooling is not None:
            with self._programs.first("similarity", self.program_length(length, 2)):
                pair = np.full((2, length), self.model.tokenizer.cls_token_id)
                self.model.run(self._padded(pair, np.zeros_like(pair)), hooks=hooks)

    # ---- checking and running ---------------------------------------------------------------------------

    def _request(self, body: Mapping) -> Request:
        cfg = self.model.config
        ablate = body.get("ablate") or []
        if not isinstance(ablate, list) or not all(isinstance(pair, list) and len(pair) == 2 for pair in ablate):
            raise InputError("'ablate' must be a list of [layer, head] pairs, e.g. [[2, 5]].")
        heads = tuple(sorted({(_index({"layer": layer}, "layer", cfg.num_hidden_layers, "layers"),
                                _index({"head": head}, "head", cfg.num_attention_heads, "heads"))
                               for layer, head in ablate}))
        mode = body.get("mode", "zero")
        if mode not in ABLATION_MODES:
            raise InputError(f"'mode' must be one of {', '.join(ABLATION_MODES)}; got {mode!r}.")
        return Request(_text(body, "text", True), _text(body, "pair", False), heads, mode)

    def _batch(self, request: Request):
        # Cut one token past the model's positions, where the tokenizer would refuse with advice for Python callers
        # (pass max_length): a text over max_tokens still is after the cut, and _too_long counts it whole.
        batch = self.model.tokenize([request.text], None if request.pair is None else [request.pair],
                                    max_length=self.model.config.max_tokens + 1)
        if batch.input_ids.shape[1] > self.max_tokens:
            raise InputError(self._too_long(request, batch))
        return batch

    def _too_long(self, request: Request, batch) -> str:
        """Said so that a student can act on it: how many word pieces the text (and sentence B) has, how many fit;
        the limit is the lecturer's to change, unless it is the model's own."""
        tokenizer = self.model.tokenizer
        room = self.max_tokens - sum(sequence is None for sequence in batch.sequence_ids[0])  # [CLS] and each [SEP]
        change = ("the model takes no more" if self.max_tokens == self.model.config.max_tokens else
                  "whoever started it can change that: minibert serve --max-tokens")
        limit = (f"(this workbench takes {self.max_tokens} tokens with {tokenizer.cls_token} and "
                 f"{tokenizer.sep_token}; {change}).")
        a = len(tokenizer.tokenize(request.text))
        if request.pair is None:
            return f"the text is {a} word pieces long; shorten it to about {room} word pieces {limit}"
        b = len(tokenizer.tokenize(request.pair))
        return (f"the text and sentence B together are {a + b} word pieces long ({a} and {b}); shorten them to about "
                f"{room} word pieces together {limit}")

    def _padded(self, ids, types, mask=None) -> dict:
        """[B, T] ids and token types padded with masked padding to the bucket length (Model.run may pad further:
        program_length).
        mask: [B, T], where rows of several lengths were padded already (sentences A and B); else all real."""
        n_rows, length = ids.shape
        extra = ((0, 0), (0, bucket_length(length, self.buckets) - length))
        mask = np.pad(np.ones_like(ids) if mask is None else np.asarray(mask), extra)
        return {"input_ids": np.pad(ids, extra, constant_values=self.model.config.pad_token_id),
                "token_type_ids": np.pad(types, extra), "attention_mask": mask}

    def _head_mask(self, heads: tuple) -> np.ndarray:
        """[L, H] float32: 1 at each (layer, head) in `heads`."""
        cfg = self.model.config
        mask = np.zeros((cfg.num_hidden_layers, cfg.num_attention_heads), np.float32)
        for layer, head in heads:
            mask[layer, head] = 1
        return mask

    def _hooks(self, heads: tuple, replacement: np.ndarray) -> dict:
        """Ablation hooks with the same shapes whatever is ablated (an empty mask changes nothing): one program."""
        return ablate_heads(self._head_mask(heads), mean=replacement)

    def _run(self, request: Request) -> Run:
        key = (request.text, request.pair, request.ablate, request.mode if request.ablate else "zero")
        with self._lock:
            if key in self._runs:
                self._runs.move_to_end(key)
                return self._runs[key]
        replacement = self._replacement(request)
        batch = self._batch(request)
        length = batch.input_ids.shape[1]
        hooks = self._hooks(request.ablate, replacement)
        with self._programs.first("run", self.program_length(length)), self._lock:
            out, cache = self.model.run(self._padded(batch.input_ids, batch.token_type_ids), names=self._capture,
                                        hooks=hooks)
            captures = {name: np.asarray(cut_to_length(name, value, length))[0] for name, value in cache.items()}
            logits = None if out.logits is None else np.asarray(out.logits)[0]
            if logits is not None and logits.ndim >= 2:
                logits = logits[:length]
            similarity = self._similarity(request, hooks)
            run = Run(batch.tokens[0], list(batch.offsets[0]), np.asarray(batch.input_ids[0]), _b_start(batch),
                      captures, logits, similarity)
            self._runs[key] = run
            while len(self._runs) > CACHED_RUNS:
                self._runs.popitem(last=False)
        return run

    def _replacement(self, request: Request) -> np.ndarray:
        """What an ablated head outputs, [L, H, K]: zeros, or (mean mode) its mean z over the real tokens of the
        texts the output is computed from — with a similarity, A and B each encoded on its own (analysis.mean_z of
        the two texts, as tutorial 4 takes it); else the run's own tokens."""
        cfg = self.model.config
        if request.ablate and request.mode == "mean":
            if self._similar(request):
                return self._mean_z_apart(request)
            return self._run(dataclasses.replace(request, ablate=())).stack(Z).mean(axis=1)
        return np.zeros((cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim), np.float32)

    def _mean_z_apart(self, request: Request) -> np.ndarray:
        """[L, H, K]: each head's mean z over the real tokens of A and B, each encoded on its own, unablated."""
        cfg = self.model.config
        batch = self.model.tokenize([request.text, request.pair])
        padded = self._padded(batch.input_ids, batch.token_type_ids, batch.attention_mask)
        nothing = self._hooks((), np.zeros((cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim),
                                           np.float32))
        with self._programs.first("similarity", self.program_length(batch.input_ids.shape[1], 2)), self._lock:
            _, cache = self.model.run(padded, names=every_block(Z), hooks=nothing)
        z = np.asarray(cache.stack(Z), np.float64)  # [L, 2, T', H, K], T' ≥ the padded length
        real = np.zeros(z.shape[1:3])
        real[:, :padded["attention_mask"].shape[1]] = padded["attention_mask"]
        return ((z * real[None, :, :, None, None]).sum((1, 2)) / real.sum()).astype(np.float32)

    def _similar(self, request: Request) -> bool:
        """Whether the request has an A–B similarity: a sentence B and a sentence pooling to compute it with."""
        pooling = self.model.pooling  # no similarity where sentence_embeddings would refuse (no Pooling, Dense, …)
        return not (pooling is None or pooling["mode"] is None or pooling.get("unsupported") or request.pair is None)

    def _similarity(self, request: Request, hooks: dict) -> float | None:
        """Cosine similarity of sentence A's and B's embeddings (sentence-transformers checkpoints with a pair),
        each encoded on its own, with the model's pooling, under the same hooks."""
        if not self._similar(request):
            return None
        batch = self.model.tokenize([request.text, request.pair])
        with self._programs.first("similarity", self.program_length(batch.input_ids.shape[1], 2)):
            out = self.model.run(self._padded(batch.input_ids, batch.token_type_ids, batch.attention_mask),
                                 hooks=hooks)[0]
        hidden = np.asarray(out.last_hidden_state)[:, :batch.input_ids.shape[1]]  # pooled as the model's dtype
        a, b = _pooled(hidden, np.asarray(batch.attention_mask), self.model.pooling["mode"])
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))

    def _mixing_hooks(self, request: Request) -> dict:
        """The request's ablation with the ablated heads' patterns zeroed (`_mixing_maps`); the same hooks (shapes)
        whatever is ablated, so one program per bucket."""
        hooks = self._hooks(request.ablate, self._replacement(request))
        hooks[PATTERNS] = HookFn(_silenced_heads, mask=self._head_mask(request.ablate))
        return hooks

    def _mixing_maps(self, run: Run, request: Request, method: str) -> np.ndarray:
        """[L, T, T] context-mixing maps of one document (minibert.analysis; docs/context_mixing.md) of the model
        under the request's ablation (`run` is its run). An ablated head outputs a replacement no token feeds, so
        it moves nothing between tokens: its pattern counts as zeros — in rollout's mean over heads and, through a
        pattern hook beside the ablation's, in ALTI's terms (as mixing.alti asks); value zeroing runs under the
        same hooks (the ablated head's values are unused there anyway)."""
        silenced = self._head_mask(request.ablate)
        if method == "rollout":
            return flow.attention_rollout(run.stack(PATTERN) * (1 - silenced)[:, :, None, None])
        hooks = self._mixing_hooks(request)
        batch = self._batch(request)
        padded = self._padded(batch.input_ids, batch.token_type_ids)
        measure = {"value_zeroing": mixing.value_zeroing, "alti": mixing.alti}[method]
        length = len(run.tokens)
        with self._programs.first(method, padded["input_ids"].shape[1]):  # its own forward: not the run cache's lock
            return measure(self.model, padded, hooks=hooks)[:, 0, :length, :length]

    # ---- answers ----------------------------------------------------------------------------------------

    def _views(self, run: Run) -> dict:
        """The head, model and neuron views' data (View.data, drawn in the page by views.js), packed without
        compression (level 0): on a local connection, compressing costs more time than the bytes it saves.
        Built once per run and kept with it in the run cache: clicking a token or a head of the step-through asks
        for the same run again."""
        if not run.views:
            run.views.update(self._built_views(run))
        return run.views

    def _built_views(self, run: Run) -> dict:
        """The neuron view is drawn on a second thread meanwhile: NumPy lets go of the GIL in its array work, so on
        two cores the three views take about as long as the neuron view alone."""
        attention = run.stack(PATTERN)
        q, k, options = _neuron_inputs(run)
        tokens, b_start = run.tokens, run.sentence_b_start
        neuron = self._drawing.submit(views.neuron_view, tokens, q, k, attention, b_start,
                                      query_index=min(1, len(tokens) - 1), level=0, **options)
        return {"head": views.head_view(tokens, attention, b_start, level=0).data,
                "model": views.model_view(tokens, attention, b_start, level=0).data, "neuron": neuron.result().data}

    def _output_kinds(self) -> list[str]:
        heads = self.model.config.heads
        kinds = ["mlm"] if heads.mlm else []
        kinds += [f"{heads.classifier}_classes"] if heads.classifier else []
        kinds += ["similarity"] if self.model.pooling is not None else []
        return kinds

    def _outputs(self, run: Run) -> dict:
        """What the model's head produces: masked-LM top-k at each [MASK], class probabilities, A–B similarity."""
        cfg, tokenizer = self.model.config, self.model.tokenizer
        outputs: dict = {}
        if cfg.heads.mlm:
            positions = np.flatnonzero(run.ids == tokenizer.mask_token_id)
            outputs["mlm"] = [_top_k(run.logits[position], position, tokenizer) for position in positions]
        if cfg.heads.classifier == "sequence":
            outputs["classes"] = _labelled(_softmax(run.logits), cfg.id2label)
        elif cfg.heads.classifier == "token":
            outputs["token_classes"] = [_labelled(p, cfg.id2label) for p in _softmax(run.logits)]
        if run.similarity is not None:
            outputs["similarity"] = run.similarity
        return outputs


# The actions every workbench answers; its panels (viz/panels.py) add theirs.
CORE_ACTIONS = {"info": Workbench.info, "tokenize": Workbench.tokenize, "run": Workbench.run,
                "step": Workbench.step, "mixing": Workbench.mixing, "status": Workbench.status}
# what `status` names: the compiled programs every workbench runs (Workbench.programs adds its panels')
CORE_PROGRAMS = ("run", "similarity", *MIXING_METHODS[2:])


class FirstRuns:
    """Which of a workbench's programs (Workbench.programs, per bucket length) have run, and which run for the first
    time now: a first run compiles, seconds on a CPU, and the page says so. Two first runs of one program wait for one
    another (the second then finds it compiled) instead of compiling it twice."""

    def __init__(self):
        self._done: set[tuple[str, int]] = set()
        self._now: dict[tuple[str, int], threading.Lock] = {}
        self._guard = threading.Lock()

    @contextlib.contextmanager
    def first(self, what: str, length: int):
        """The context in which program `what` runs for rows of `length` (a bucket)."""
        key = (what, length)
        with self._guard:
            if key in self._done:
                lock = None
            else:
                lock = self._now.setdefault(key, threading.Lock())
        if lock is None:
            yield
            return
        with lock:
            yield
            with self._guard:
                self._done.add(key)
                self._now.pop(key, None)

    def compiling(self) -> list[dict]:
        with self._guard:
            return [{"what": what, "tokens": length} for what, length in sorted(self._now)]


def _b_start(batch) -> int | None:
    """Index of sentence B's first token in row 0, or None (as viz.document sets it)."""
    segment_b = [i for i, sequence in enumerate(batch.sequence_ids[0]) if sequence == 1]
    return segment_b[0] if segment_b else None


def _neuron_inputs(run: Run) -> tuple[np.ndarray, np.ndarray, dict]:
    """The neuron view's q and k — rotated where the family rotates them, as its scores use them — and its options:
    DeBERTa's three score terms, and the keys the model masks where it masks any (a local layer's window: −∞ in
    the captured scores; padding is cut off already), so that the view's softmax is the model's pattern."""
    rotated = in_block(0, ROT_Q) in run.captures
    q, k = (run.stack(site) for site in ((ROT_Q, ROT_K) if rotated else (Q, K)))
    options = {}
    if in_block(0, views.TERM_SITES[0]) in run.captures:
        options["terms"] = {term: run.stack(site) for term, site in zip(views.TERMS, views.TERM_SITES)}
    reach = np.isfinite(run.stack(ATTN_SCORES)[:, 0])  # masks are the same for every head
    if not reach.all():
        options["key_mask"] = reach
    return q, k, options


def _silenced_heads(pattern, ctx, mask):
    """pattern [B, H, T, S] with the heads where mask[layer, h] = 1 attending to nothing (all zeros)."""
    return (pattern * (1 - mask[ctx.layer])[None, :, None, None]).astype(pattern.dtype)


def _pooled(hidden: np.ndarray, mask: np.ndarray, mode) -> np.ndarray:
    """[B, D] sentence vectors as Model.sentence_embeddings pools them (normalising does not change a cosine)."""
    modes = (mode,) if isinstance(mode, str) else mode  # several: concatenated
    return np.concatenate([np.asarray(pooled_tokens(hidden, mask, m), np.float64) for m in modes], axis=-1)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(np.asarray(logits, np.float64) - np.max(logits, axis=-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


def _labelled(probabilities: np.ndarray, labels) -> list[dict]:
    return [{"label": label, "p": float(p)} for label, p in zip(labels, probabilities)]


def _top_k(logits: np.ndarray, position: int, tokenizer) -> dict:
    probabilities = _softmax(logits)
    best = np.argsort(-probabilities, kind="stable")[:TOP_K]
    return {"position": int(position), "top": [{"token": tokenizer.ids_to_tokens.get(int(i), "?"),
                                                "p": float(probabilities[i])} for i in best]}
