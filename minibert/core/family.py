"""Family: everything that makes one model_type differ from BERT, in one record.

A family module (bert.py, roberta.py, …) builds its Family, with its own forward code where BERT's does not
compute it, and lists it in FAMILIES; families/registry.py registers every module named in its one table.
Config carries its Family; checkpoint, model, the tokenizers and sources read only this record, so a new family is
its module plus one word in that table (docs/families.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from minibert.core import site_names as site
from minibert.core.shows import POST_LN_ORDER, POST_LN_STEPS, Step, one_term
from minibert.errors import ConfigError

# The files each kind of tokenizer reads (sources.py fetches them from the Hub; tokenizers_hf.py reads them).
TOKENIZER_FILES = {
    "wordpiece": ("vocab.txt", "tokenizer.json"),  # minibert's own tokenizer.py
    "bpe": ("tokenizer.json", "vocab.json", "merges.txt"),  # byte-level BPE, through `tokenizers`
    "unigram": ("tokenizer.json",),  # SentencePiece's Unigram or BPE, through `tokenizers`
}
BERT_TOKENS = (("cls_token", "[CLS]"), ("sep_token", "[SEP]"), ("pad_token", "[PAD]"), ("unk_token", "[UNK]"),
               ("mask_token", "[MASK]"))
# The forward variations a family may select, the first of each being what model.py's Block and Embeddings
# compute. Any other choice needs the family's own code (Family.block / Family.embeddings).
VARIATIONS = {
    "norm": ("post", "pre"),  # LayerNorm after each residual add (BERT) or before each sublayer
    "positions": ("table", "rotary", "relative"),  # learned position rows added to the embeddings, or in attention
    "mlp": ("dense", "glu"),  # act(x W_in) W_out, or a gated unit (GeGLU)
    "attention": ("full", "local_global", "disentangled"),  # every key, sliding windows, content × position
}


@dataclasses.dataclass(frozen=True)
class LayerKeys:
    """Where one layer's weights are: the prefix of layer i ("encoder.layer.{i}") and, for each part of
    minibert's Block, the Hugging Face module under it."""

    prefix: str
    query: str
    key: str
    value: str
    out: str
    ln1: str
    mlp_in: str
    mlp_out: str
    ln2: str


@dataclasses.dataclass(frozen=True)
class HeadKeys:
    """Where one family keeps its embedding projection and heads (keys without the encoder's prefix)."""

    pooler: str | None = "pooler.dense"  # the bare model's pooler
    sequence_pooler: str = "pooler.dense"  # the dense layer a sequence classifier puts on the first token
    classifier: str = "classifier"  # the sequence classifier's output layer
    projection: str | None = None  # the E → D embedding projection
    mlm_dense: str = "cls.predictions.transform.dense"
    mlm_ln: str = "cls.predictions.transform.LayerNorm"
    mlm_bias: str = "cls.predictions.bias"
    tied: tuple[tuple[str, str], ...] = (  # key → minibert parameter it repeats (saved or not)
        ("cls.predictions.decoder.weight", "embed.word"), ("cls.predictions.decoder.bias", "mlm.decoder_bias"))


@dataclasses.dataclass(frozen=True)
class Part:
    """Where one role's weight is inside a block: the parameter's dotted name ("attn.W_QKV") and, where the family
    fuses several roles into that one array, the role's index along the fused axis (an axis of one block's
    parameter, no layer axis)."""

    name: str
    index: int | None = None
    axis: int = 0

    def written(self, *axes: str) -> str:
        """An element of the role as its stored parameter is indexed, given the role's own axes: ("…", "j") of a
        [D, F] role at index 0 of W_in's axis 1 is "W_in[:, 0, j]"; unfused, "W_in[:, j]"."""
        if self.index is not None:
            axes = (*axes[:self.axis], str(self.index), *axes[self.axis:])
        return f"{self.name.rsplit('.', 1)[-1]}[{', '.join(axes)}]"


def _role(name: str | None, shape: str, what: str):
    """A field of WeightRoles: BERT's Part (None: BERT's blocks have no such weight), the role's shape in one block
    and what it is, which Model.weights documents."""
    return dataclasses.field(default=None if name is None else Part(name), metadata={"shape": shape, "what": what})


@dataclasses.dataclass(frozen=True)
class WeightRoles:
    """Where each of a block's weights is, by its role: the one declaration of a family's parameter layout that
    Model.weights (and, through it, every tool) reads. A Part, or None where the family's blocks have no such weight
    (BERT's MLP has no gate). A gated MLP is TransformerLens' act(x·w_gate) ⊙ (x·w_in): w_gate's product is
    mlp.hook_pre, w_in's mlp.hook_pre_linear; a dense MLP's w_in gives mlp.hook_pre. ln1 and ln2 are the block's
    LayerNorms by their hook names (post-LN: after the attention add, after the MLP add; pre-LN: before each)."""

    q: Part | None = _role("attn.W_Q", "D, H, K", "query weights")
    k: Part | None = _role("attn.W_K", "D, H, K", "key weights")
    v: Part | None = _role("attn.W_V", "D, H, K", "value weights")
    b_q: Part | None = _role("attn.b_Q", "H, K", "query biases")
    b_k: Part | None = _role("attn.b_K", "H, K", "key biases")
    b_v: Part | None = _role("attn.b_V", "H, K", "value biases")
    o: Part | None = _role("attn.W_O", "H, K, D", "output weights of each head")
    b_o: Part | None = _role("attn.b_O", "D", "the attention output's bias")
    w_in: Part | None = _role("mlp.W_in", "D, F", "the MLP's input weights (a gated MLP's linear half)")
    b_in: Part | None = _role("mlp.b_in", "F", "the MLP's input bias (a gated MLP's linear half's)")
    w_gate: Part | None = _role(None, "D, F", "a gated MLP's activated half (None in a dense MLP)")
    b_gate: Part | None = _role(None, "F", "a gated MLP's activated half's bias")
    w_out: Part | None = _role("mlp.W_out", "F, D", "the MLP's output weights")
    b_out: Part | None = _role("mlp.b_out", "D", "the MLP's output bias")
    ln1_scale: Part | None = _role("ln1.scale", "D", "LayerNorm ln1's gain")
    ln1_bias: Part | None = _role("ln1.bias", "D", "LayerNorm ln1's bias")
    ln2_scale: Part | None = _role("ln2.scale", "D", "LayerNorm ln2's gain")
    ln2_bias: Part | None = _role("ln2.bias", "D", "LayerNorm ln2's bias")


ROLES = tuple(field.name for field in dataclasses.fields(WeightRoles))  # q, k, v, b_q, …, ln2_bias


@dataclasses.dataclass(frozen=True)
class Heads:
    """What sits on top of the encoder for one architecture name of config.json."""

    pooler: bool  # tanh(h_[CLS] W + b), pooler_output
    mlm: bool = False  # masked-LM logits over the vocabulary
    nsp: bool = False  # next-sentence logits on the pooled output
    classifier: str | None = None  # "sequence" (on the pooled output) or "token" (on every position)
    discriminator: bool = False  # ELECTRA's replaced-token detector: one logit per position


@dataclasses.dataclass(frozen=True)
class Family:
    """How one model_type differs from BERT: config.json, checkpoint keys, tokenizer and forward pass.

    Every default is BERT's, so a family states only what it changes."""

    model_type: str  # config.json's model_type
    name: str  # how people write it, for repr and messages
    prefix: str  # class-name prefix in config.json's architectures ("Roberta" → "RobertaForMaskedLM")
    key_prefix: str  # the encoder's key prefix in head checkpoints ("roberta.encoder.layer.0...")

    # ---- config.json -------------------------------------------------------------------------------
    renames: tuple[tuple[str, str], ...] = ()  # config.json key → the Hugging Face name Config uses
    keys: frozenset = frozenset()  # the family's own config.json keys that change nothing minibert computes
    values: tuple[tuple[str, tuple], ...] = ()  # keys the family's config.json may hold at these values only
    # Config fields the family's config.json does not have, and the value each takes.
    fixed: tuple[tuple[str, Any], ...] = ()
    # The family's own settings (config.json key → default), read into Config.settings: what its block code
    # needs beyond BERT's fields (ModernBERT's rotary base, its local window…).
    settings: tuple[tuple[str, Any], ...] = ()

    # ---- checkpoint keys ---------------------------------------------------------------------------
    layer_keys: LayerKeys = LayerKeys("encoder.layer.{i}", "attention.self.query", "attention.self.key",
                                      "attention.self.value", "attention.output.dense", "attention.output.LayerNorm",
                                      "intermediate.dense", "output.dense", "output.LayerNorm")
    head_keys: HeadKeys = HeadKeys()
    # Patterns (re.match, on keys without the encoder prefix) of keys released checkpoints carry beyond what the
    # architecture reads and transformers leaves unused too (DeBERTa-v3's pretraining heads): ignored, not refused.
    unused_keys: tuple[str, ...] = ()
    # Config → {checkpoint key: (minibert parameter, shape, converter)}; None: keys.bert_layout, which reads
    # layer_keys and head_keys. A family with other parameters gives its own function (core/keys.py has the pieces).
    key_table: Callable | None = None

    # ---- tokenizer ---------------------------------------------------------------------------------
    tokenizer: str = "wordpiece"  # a kind of TOKENIZER_FILES
    special_tokens: tuple[tuple[str, str], ...] = BERT_TOKENS  # defaults; tokenizer_config.json overrides

    # ---- forward pass (model.py reads these) -------------------------------------------------------
    # RoBERTa (fairseq) numbers positions from pad_token_id + 1 and gives padding the pad row.
    position_offset: bool = False
    token_types: bool = True  # has a segment-embedding table (DistilBERT has none)
    # Embeddings narrower than the blocks, projected up to hidden_size: never, "when_sizes_differ"
    # (ELECTRA builds the projection only then) or "always" (ALBERT).
    projection: str | None = None
    shared_layers: bool = False  # ALBERT: one block's weights applied num_hidden_layers times
    base_pooler: bool = True  # whether the bare <prefix>Model has a pooler
    pooler_activation: str = "tanh"  # of the pooler, or of the dense layer a sequence classifier puts on token 0
    mlm_activation: str | None = None  # of the masked-LM transform; None: the config's hidden_act
    pretraining: Heads | None = None  # what <prefix>ForPreTraining puts on top, if the family has one
    # The variations of VARIATIONS this family computes. Any but BERT's needs the family's own code:
    norm: str = "post"
    # Pre-LN: whether block 0 normalises its attention input (ln1). ModernBERT's embeddings end with a LayerNorm,
    # so its block 0 has none; model code, key table and hook table (minibert.core.sites) read this.
    first_ln1: bool = True
    positions: str = "table"
    mlp: str = "dense"
    attention: str = "full"
    # The family's own forward code, classes of its module (None: model.py's): an nnx.Module built as
    # Class(cfg, dtype, rngs, layer) that replaces model.Block (called as block(resid, key_mask, hooks, name)), and
    # one built as Class(cfg, dtype, rngs) that replaces model.Embeddings (embed(input_ids, token_type_ids, hooks)).
    block: type | None = None
    embeddings: type | None = None
    # Replaces the head stage (encoder.Encoder.head): built as Class(cfg, dtype, rngs), called as
    # head(hidden, word_embeddings, hooks, dropout, key_mask) → model.Output. For a family whose heads are not
    # BERT's pooler / MLM / classifier (ModernBERT: a final LayerNorm, then dense → act → norm before each head).
    head: type | None = None
    # Encoder-level state every block reads (DeBERTa's relative-position table): built once as
    # Class(cfg, dtype, rngs) into encoder.Encoder.shared, its weights stored once, and passed to each block call as
    # block(…, shared=it).
    shared: type | None = None
    # Where each weight of its blocks is, by role (fused q, k, v; a gated MLP's halves): what Model.weights reads,
    # so that no tool knows the block code's parameter names.
    weight_roles: WeightRoles = WeightRoles()

    # ---- what it shows (sites, lens, mixing, views and the workbench read these, never the family's name) ---
    block_order: tuple[str, ...] = POST_LN_ORDER  # the groups of a block's sites, in the order it runs them
    block_output: str = site.NORMALIZED_RESID_POST  # the site holding a block's output (the next block's input)
    final_norm: bool = False  # a LayerNorm after the last block (ln_final.*), which the head stage begins with
    # The LayerNorms the residual stream itself passes through inside a block, in order (post-LN: ln1 after the
    # attention add, whose output ends the attention sub-block, then ln2); none where a block normalises only its
    # sublayers' inputs (pre-LN: the attention sub-block ends at hook_resid_mid).
    stream_norms: tuple[str, ...] = (site.LN1, site.LN2)
    query_key: tuple[str, str] = (site.Q, site.K)  # the q and k whose products the scores are
    # The sites whose sum is the scores before the mask, each already divided by √(K·m) (DeBERTa's c2c, c2p, p2c);
    # none: the scores are q·k/√K. The first is always q·k/√(K·m).
    score_terms: tuple[str, ...] = ()
    score_scale: Callable = one_term  # Config → m of √(K·m): 1, or (DeBERTa) 1 + the number of position terms
    steps: tuple[Step, ...] = POST_LN_STEPS  # the step-through of one block (families/shows.py)

    def __post_init__(self):
        if self.tokenizer not in TOKENIZER_FILES:
            raise ConfigError(f"family {self.model_type!r}: tokenizer {self.tokenizer!r} is not one of "
                             f"{', '.join(TOKENIZER_FILES)}.")
        for variation, choices in VARIATIONS.items():
            choice = getattr(self, variation)
            if choice not in choices:
                raise ConfigError(f"family {self.model_type!r}: {variation} {choice!r} is not one of {choices}.")
        own_block = {"norm": self.norm != "post", "mlp": self.mlp != "dense", "attention": self.attention != "full",
                     "positions": self.positions == "relative"}
        if any(own_block.values()) and self.block is None:
            raise ConfigError(f"family {self.model_type!r} selects {_choices(self, own_block)}, which model.Block "
                             f"does not compute: name the family's block code in Family.block.")
        if self.positions == "rotary" and (self.block is None or self.embeddings is None):
            raise ConfigError(f"family {self.model_type!r} selects rotary positions: name its block code (which "
                             f"rotates q and k) in Family.block and its embeddings (no position table) in "
                             f"Family.embeddings.")

    @property
    def tokenizer_files(self) -> tuple[str, ...]:
        return TOKENIZER_FILES[self.tokenizer]

    def architectures(self) -> dict[str, Heads]:
        """The family's class names of config.json → the heads on top (<prefix>Model, <prefix>ForMaskedLM, …).
        Sequence classifiers of families without a pooler put a dense layer and the family's activation on token 0:
        minibert calls that layer the pooler."""
        suffixes = {
            "Model": Heads(pooler=self.base_pooler),
            "ForMaskedLM": Heads(pooler=False, mlm=True),
            "ForPreTraining": self.pretraining,
            "ForSequenceClassification": Heads(pooler=True, classifier="sequence"),
            "ForTokenClassification": Heads(pooler=False, classifier="token"),
        }
        return {self.prefix + suffix: heads for suffix, heads in suffixes.items() if heads is not None}

    def architectures_with(self, part: str) -> list[str]:
        """The family's architectures that have a head part ("pooler", "mlm", "nsp", "classifier" or
        "discriminator")."""
        return [name for name, heads in self.architectures().items() if getattr(heads, part)]


def _choices(family: Family, selected: dict[str, bool]) -> str:
    return ", ".join(f"{variation} = {getattr(family, variation)!r}" for variation, on in selected.items() if on)


BERT = Family("bert", "BERT", "Bert", "bert", pretraining=Heads(pooler=True, mlm=True, nsp=True))  # Config's default
