"""The tokenizers of the other families, through Hugging Face's `tokenizers` library.

RoBERTa (byte-level BPE) and ALBERT, XLM-R, CamemBERT (SentencePiece's Unigram or BPE) are read from the
checkpoint's `tokenizer.json` (or RoBERTa's `vocab.json` + `merges.txt`) and run by the same Rust code as
transformers' fast tokenizers, so ids, offsets and word ids match them exactly. WordPiece checkpoints
(BERT, DistilBERT, ELECTRA) keep minibert's own teaching tokenizer, tokenizer.py.

    tokenizer = tokenizer_for(directory, config)     # the right one for a checkpoint directory
    batch = tokenizer(["I made the mistake."])        # the same Batch as tokenizer.Tokenizer gives
    tokenizer.cls_token, tokenizer.sep_token          # "<s>", "</s>" for RoBERTa; "[CLS]", "[SEP]" for ALBERT
"""

from __future__ import annotations

from pathlib import Path

from minibert.core.config import Config
from minibert.core.family import Family
from minibert.errors import TokenizerError
from minibert.io.tokenizer import BaseTokenizer, Tokenizer, _read_json, configured_max_length, configured_special_tokens

SENTENCEPIECE_FILES = ("spiece.model", "sentencepiece.bpe.model", "spm.model")  # spm.model: DeBERTa-v3


def _segments_unread(config: Config) -> bool:
    """Whether a family whose segment table is its own setting (DeBERTa's type_vocab_size; Config's field is
    fixed at 1) gives sentence B segment 1: with no table (DeBERTa-v3, type_vocab_size 0: read by nobody) and with
    a table of two rows (read). DebertaV2Tokenizer gives it segment 1 either way, so minibert's batches are
    transformers'; a table of one row reads segment 0 only."""
    return "type_vocab_size" in dict(config.family.settings) and config.setting("type_vocab_size") in (0, 2)


def tokenizer_for(directory: str | Path, config: Config) -> BaseTokenizer:
    """The tokenizer of a checkpoint directory: WordPiece (vocab.txt or a WordPiece tokenizer.json) is
    minibert's own; byte-level BPE and Unigram go through `tokenizers`. Sentence B gets segment id 1 where the
    model has a segment table with two rows or more, or none at all as in DeBERTa-v3 (as transformers does)."""
    directory = Path(directory)
    segments = (config.family.token_types and config.type_vocab_size > 1) or _segments_unread(config)
    if (directory / "vocab.txt").exists():
        return Tokenizer.from_dir(directory, segments=segments)
    settings = _read_json(directory / "tokenizer_config.json")
    special = dict(config.family.special_tokens) | configured_special_tokens(directory, settings)
    backend = _backend(directory, config.family, settings, special)
    if type(backend.model).__name__ == "WordPiece":
        return Tokenizer.from_dir(directory, segments=segments)
    max_length = configured_max_length(directory, settings, config.max_tokens)
    return SubwordTokenizer(backend, special_tokens=special, segments=segments,
                            model_max_length=int(min(max_length, config.max_tokens)))


class SubwordTokenizer(BaseTokenizer):
    """A `tokenizers.Tokenizer` (BPE or Unigram, with the family's template of special tokens) that returns
    minibert's Batch."""

    def __init__(self, backend, *, special_tokens: dict[str, str], model_max_length: int, segments: bool):
        backend.no_padding()  # minibert pads (Batch), with the family's pad token
        self.backend = backend
        self.vocab = backend.get_vocab(with_added_tokens=True)
        self.ids_to_tokens = {i: t for t, i in self.vocab.items()}
        missing = [token for token in special_tokens.values() if token not in self.vocab]
        if missing:
            raise TokenizerError(f"the tokenizer's vocabulary lacks the special tokens {missing}; name the right "
                                 f"ones in tokenizer_config.json (cls_token, sep_token, pad_token, unk_token, "
                                 f"mask_token).")
        self.special_tokens = special_tokens
        self.model_max_length = model_max_length
        self.segments = segments

    def __repr__(self):
        return f"SubwordTokenizer({type(self.backend.model).__name__}, vocab={len(self.vocab)})"

    def tokenize(self, text: str) -> list[str]:
        """Subword tokens of one text, without the special tokens."""
        return self.backend.encode(text, add_special_tokens=False).tokens

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def _encode(self, text: str, pair: str | None, max_length: int | None) -> dict[str, list]:
        """One row with the family's special tokens, truncated longest-first to max_length by `tokenizers`."""
        if max_length is None:
            self.backend.no_truncation()
        else:
            self.backend.enable_truncation(max_length, strategy="longest_first")
        try:
            encoding = self.backend.encode(text, pair)
        except Exception as error:  # the Rust side raises a plain Exception, e.g. for a max_length too small
            raise TokenizerError(f"cannot tokenize {text[:40]!r} with max_length={max_length}: {error}") from None
        if max_length is None and len(encoding.ids) > self.model_max_length:
            raise TokenizerError(
                f"{text[:40]!r}… has {len(encoding.ids)} tokens but the model takes at most {self.model_max_length}; "
                f"pass max_length={self.model_max_length} to truncate it (longest first), or split the text.")
        types = encoding.type_ids if self.segments else [0] * len(encoding.ids)
        return dict(input_ids=encoding.ids, token_type_ids=types, word_ids=encoding.word_ids,
                    sequence_ids=encoding.sequence_ids, offsets=encoding.offsets)


def _backend(directory: Path, family: Family, settings: dict, special: dict[str, str]):
    """The `tokenizers.Tokenizer` of a directory: tokenizer.json, else a byte-level BPE from vocab.json and
    merges.txt (built as transformers' RoBERTa converter builds it, with tokenizer_config.json's `settings`
    and the `special` tokens)."""
    import tokenizers

    if (directory / "tokenizer.json").exists():
        try:
            return tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as error:
            raise TokenizerError(f"{directory / 'tokenizer.json'} is not a tokenizer `tokenizers` can read "
                                 f"({error}); re-download it.") from None
    if (directory / "vocab.json").exists() and (directory / "merges.txt").exists():
        return _byte_level_bpe(directory, settings, special)
    sentencepiece = [name for name in SENTENCEPIECE_FILES if (directory / name).exists()]
    if sentencepiece:
        raise TokenizerError(
            f"{directory} has only a SentencePiece model ({sentencepiece[0]}); minibert reads tokenizer.json. "
            f"Write it once with transformers: AutoTokenizer.from_pretrained(dir).save_pretrained(dir).")
    raise TokenizerError(f"{directory} has no tokenizer: a {family.name} checkpoint needs tokenizer.json "
                         f"(or vocab.json and merges.txt, or a WordPiece vocab.txt) next to config.json.")


def _byte_level_bpe(directory: Path, settings: dict, special: dict[str, str]):
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, processors

    prefix_space = bool(settings.get("add_prefix_space", False))
    try:
        model = models.BPE.from_file(str(directory / "vocab.json"), str(directory / "merges.txt"))
    except Exception as error:  # the Rust side raises a plain Exception (truncated JSON, a merge of unknown tokens)
        raise TokenizerError(f"{directory}: vocab.json and merges.txt do not make a BPE tokenizer ({error}); "
                             f"re-download both files (they must come from the same tokenizer).") from None
    backend = Backend(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(dict.fromkeys(special.values())))
    vocab = backend.get_vocab()
    cls, sep = special["cls_token"], special["sep_token"]
    backend.post_processor = processors.RobertaProcessing((sep, vocab[sep]), (cls, vocab[cls]),
                                                          trim_offsets=True, add_prefix_space=prefix_space)
    return backend
