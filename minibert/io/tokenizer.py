"""BERT WordPiece tokenization from scratch, matching Hugging Face's `BertTokenizerFast`.

    tokenizer = Tokenizer.from_dir("weights/bert-base-uncased")
    batch = tokenizer(["I made the mistake."], pairs=None, max_length=None)
    batch.input_ids, batch.token_type_ids, batch.attention_mask     # int32 [B, T]
    batch.tokens, batch.word_ids, batch.offsets

Three stages, as in the original BERT code:
  1. normalize — drop control characters, turn odd whitespace into spaces, put spaces
     around CJK ideographs, strip accents (NFD, drop non-spacing marks), lower-case;
     every normalized character remembers which character of the input it came from,
     so tokens carry character offsets into the text the user passed;
  2. split into words at whitespace and around every punctuation character;
  3. WordPiece — greedy longest match from the left, continuations prefixed "##";
     a word with no full cover, or longer than 100 characters, becomes [UNK].
Special tokens written in the text ("[MASK]") are kept whole, as Hugging Face does.
"""

from __future__ import annotations

import dataclasses
import functools
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from minibert.errors import TokenizerError
from minibert.io.files import read_json_object

SPECIAL_TOKENS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
MAX_CHARS_PER_WORD = 100

# Unicode White_Space, as Rust's char::is_whitespace sees it (str.isspace also counts U+001C–U+001F).
_WHITESPACE = frozenset(map(chr, [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                                  0x2028, 0x2029, 0x202F, 0x205F, 0x3000]))
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_whitespace(char: str) -> bool:
    return char in _WHITESPACE


def _is_control(char: str) -> bool:
    """Control, format and private-use characters (not unassigned ones); tab and newlines are whitespace."""
    return char not in "\t\n\r" and unicodedata.category(char) in ("Cc", "Cf", "Co")


def _is_punctuation(char: str) -> bool:
    """ASCII symbols count too ("$", "+", "^" …), as in the original BERT code."""
    return (char.isascii() and not char.isalnum() and char.isprintable() and char != " ") or \
        unicodedata.category(char).startswith("P")


def _is_cjk(char: str) -> bool:
    code = ord(char)
    return any(low <= code <= high for low, high in _CJK_RANGES)


def is_text(batch) -> bool:
    """A text, or a list or tuple of texts (as opposed to a Batch or id arrays)."""
    return isinstance(batch, str) or (isinstance(batch, (list, tuple)) and all(isinstance(t, str) for t in batch))


@dataclasses.dataclass(frozen=True)
class Word:
    """One word of the input: WordPiece ids with their character spans in the original text."""

    ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]


@dataclasses.dataclass
class Batch:
    """Token ids for B texts (or text pairs), right-padded to a common length T.

    input_ids, token_type_ids, attention_mask: int32 [B, T]
    tokens:       list[list[str]]          "[PAD]" at padded positions
    word_ids:     list[list[int | None]]   word index within its sequence; None for [CLS], [SEP], padding
    sequence_ids: list[list[int | None]]   0 for text A, 1 for text B, None for special tokens and padding
    offsets:      list[list[tuple[int, int]]]  character span in the text it came from; (0, 0) for specials
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    tokens: list[list[str]]
    word_ids: list[list[int | None]]
    sequence_ids: list[list[int | None]]
    offsets: list[list[tuple[int, int]]]
    texts: list[str]
    pairs: list[str | None] | None = None  # None: no row has a second text; a None item: that row has none

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        """Real (unpadded) tokens per row, [B]."""
        return self.attention_mask.sum(1)

    def to_dict(self) -> dict[str, np.ndarray]:
        return dict(input_ids=self.input_ids, token_type_ids=self.token_type_ids, attention_mask=self.attention_mask)

    def real_tokens(self, row: int) -> list[str]:
        """Row `row`'s tokens without padding."""
        return self.tokens[row][:int(self.lengths[row])]

    def __getitem__(self, rows) -> Batch:
        """The Batch of some rows: batch[i] (one row), batch[1:3], batch[[0, 2]]. Padding stays as it was."""
        if isinstance(rows, str):  # batch["input_ids"], as a dict of arrays is read
            raise TokenizerError(f"batch[{rows!r}]: a Batch picks rows by number; its fields are attributes — "
                                 f"batch.{rows} if it has one (input_ids, token_type_ids, attention_mask, tokens), "
                                 f"or batch.to_dict()[{rows!r}].")
        try:
            picked = np.atleast_1d(np.arange(len(self))[rows])
        except IndexError:
            raise TokenizerError(f"batch[{rows!r}] is out of range: the batch has {len(self)} rows.") from None
        if not picked.size:
            raise TokenizerError(f"batch[{rows!r}] selects no row; the batch has {len(self)}.")

        def take(values):
            return [values[i] for i in picked]

        return Batch(self.input_ids[picked], self.token_type_ids[picked], self.attention_mask[picked],
                     take(self.tokens), take(self.word_ids), take(self.sequence_ids), take(self.offsets),
                     take(self.texts), None if self.pairs is None else take(self.pairs))

    def __iter__(self):
        """One single-row Batch per row."""
        return (self[row] for row in range(len(self)))


class BaseTokenizer:
    """What every family's tokenizer shares: its special tokens (the one place analyses, views and the CLI
    read "[CLS]" or "<s>" from), id ↔ token lookups, argument checks and padding into a Batch.

    A subclass sets `vocab`, `ids_to_tokens`, `special_tokens` ({"cls_token": "[CLS]", ...}),
    `model_max_length` and `segments` (whether sentence B gets segment id 1), and encodes one row in `_encode`.
    """

    vocab: dict[str, int]
    ids_to_tokens: dict[int, str]
    special_tokens: dict[str, str]
    model_max_length: int
    segments: bool = True

    def _encode(self, text: str, pair: str | None, max_length: int | None) -> dict[str, list]:
        raise NotImplementedError

    # ---- special tokens ---------------------------------------------------------------------------------

    def _special_id(self, name: str) -> int:
        return self.vocab[self.special_tokens[name]]

    cls_token = property(lambda self: self.special_tokens["cls_token"])
    sep_token = property(lambda self: self.special_tokens["sep_token"])
    pad_token = property(lambda self: self.special_tokens["pad_token"])
    unk_token = property(lambda self: self.special_tokens["unk_token"])
    mask_token = property(lambda self: self.special_tokens["mask_token"])
    cls_token_id = property(lambda self: self._special_id("cls_token"))
    sep_token_id = property(lambda self: self._special_id("sep_token"))
    pad_token_id = property(lambda self: self._special_id("pad_token"))
    unk_token_id = property(lambda self: self._special_id("unk_token"))
    mask_token_id = property(lambda self: self._special_id("mask_token"))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def convert_tokens_to_ids(self, tokens: Sequence[str] | str):
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(token, self.unk_token_id) for token in tokens]

    def convert_ids_to_tokens(self, ids):
        if np.ndim(ids) == 0:
            return self.ids_to_tokens[int(ids)]
        return [self.ids_to_tokens[int(i)] for i in ids]

    def __call__(self, texts: str | Sequence[str], pairs: str | Sequence[str] | None = None, *,
                 max_length: int | None = None, padding: str = "longest") -> Batch:
        """Tokenize texts (and optional second texts) into a padded Batch.

        pairs: one second text per text; a None item leaves that row a single text, so one batch may mix
        single sentences and pairs (pairs=[None, "B"]).
        max_length: truncate each row to this many tokens, longest sequence first (Hugging Face's
        "longest_first"); without it a row longer than the model's limit is an error.
        padding: "longest" (pad to the longest row) or "max_length" (pad every row to max_length).
        """
        texts = _text_list(texts, "texts")
        if not texts:
            raise TokenizerError("the batch is empty; pass at least one text, e.g. model.tokenize(['Hello world.']).")
        if pairs is not None:
            pairs = _text_list(pairs, "pairs")
            if len(pairs) != len(texts):
                raise TokenizerError(f"got {len(texts)} texts but {len(pairs)} pairs; pass one second text per text.")
        if padding not in ("longest", "max_length") or (padding == "max_length" and max_length is None):
            raise TokenizerError(f"padding must be 'longest' or 'max_length' (with max_length=N); got {padding!r}.")
        rows = [self._encode(_checked_text(text, f"texts[{i}]"),
                             None if pairs is None or pairs[i] is None else _checked_text(pairs[i], f"pairs[{i}]"),
                             max_length)
                for i, text in enumerate(texts)]
        width = max_length if padding == "max_length" else max(len(row["input_ids"]) for row in rows)
        return self._padded(rows, width, texts, pairs)

    def _padded(self, rows: list[dict], width: int, texts: list[str], pairs: list[str] | None) -> Batch:
        def pad(values, fill):
            return [row[values] + [fill] * (width - len(row[values])) for row in rows]

        ids = np.asarray(pad("input_ids", self.pad_token_id), np.int32)
        mask = np.asarray([[1] * len(row["input_ids"]) + [0] * (width - len(row["input_ids"])) for row in rows],
                          np.int32)
        return Batch(input_ids=ids, token_type_ids=np.asarray(pad("token_type_ids", 0), np.int32),
                     attention_mask=mask, tokens=[self.convert_ids_to_tokens(row) for row in ids],
                     word_ids=pad("word_ids", None), sequence_ids=pad("sequence_ids", None),
                     offsets=pad("offsets", (0, 0)), texts=texts, pairs=pairs)


class Tokenizer(BaseTokenizer):
    """BERT's basic tokenizer + WordPiece over a vocabulary (token → id)."""

    def __init__(self, vocab: dict[str, int], *, do_lower_case: bool = True, strip_accents: bool | None = None,
                 tokenize_chinese_chars: bool = True, model_max_length: int = 512,
                 special_tokens: dict[str, str] | None = None, segments: bool = True):
        self.segments = segments
        self.vocab = dict(vocab)
        self.ids_to_tokens = {i: t for t, i in self.vocab.items()}
        self.do_lower_case = do_lower_case
        self.strip_accents = do_lower_case if strip_accents is None else strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.model_max_length = model_max_length
        names = {name: f"[{name.split('_')[0].upper()}]" for name in SPECIAL_TOKENS} | (special_tokens or {})
        missing = [token for token in names.values() if token not in self.vocab]
        if missing:
            raise TokenizerError(f"the vocabulary lacks the special tokens {missing}; is this a BERT WordPiece vocab?")
        self.special_tokens = names
        self._wordpiece = functools.lru_cache(maxsize=1 << 16)(self._wordpiece_uncached)

    @classmethod
    def from_dir(cls, directory: str | Path, *, segments: bool = True) -> Tokenizer:
        """Read `vocab.txt` (or a WordPiece `tokenizer.json`) and `tokenizer_config.json` from a checkpoint dir.

        segments=False gives sentence B segment id 0, for models without segment embeddings (DistilBERT)."""
        directory = Path(directory)
        settings = _read_json(directory / "tokenizer_config.json")
        special = configured_special_tokens(directory, settings)
        max_length = configured_max_length(directory, settings, 512)
        flag = functools.partial(configured_flag, directory, settings)
        return cls(_read_vocab(directory), do_lower_case=flag("do_lower_case", True),
                   strip_accents=flag("strip_accents", None, allow_none=True),
                   tokenize_chinese_chars=flag("tokenize_chinese_chars", True),
                   model_max_length=max_length if max_length < 1e9 else 512, special_tokens=special,
                   segments=segments)

    def __repr__(self):
        return f"Tokenizer(vocab={len(self.vocab)}, do_lower_case={self.do_lower_case})"

    # ---- stage 1: normalize -------------------------------------------------------------------------------

    def normalize(self, text: str, start: int = 0) -> tuple[str, list[int]]:
        """The normalized text and, for each of its characters, the index of the input character it came from."""
        if text.isascii() and text.isprintable():  # nothing to drop, replace, split or strip: only case changes
            return (text.lower() if self.do_lower_case else text), list(range(start, start + len(text)))
        chars, origins = [], []
        for index, char in enumerate(text, start):
            if char in ("\0", "\ufffd") or _is_control(char):
                continue
            if _is_whitespace(char):
                char = " "
            elif self.tokenize_chinese_chars and _is_cjk(char):
                char = f" {char} "
            if self.strip_accents:
                char = "".join(c for c in unicodedata.normalize("NFD", char) if unicodedata.category(c) != "Mn")
            if self.do_lower_case:
                char = char.lower()
            chars.append(char)
            origins.extend([index] * len(char))
        return "".join(chars), origins

    # ---- stage 2: split into words ------------------------------------------------------------------------

    def _words(self, text: str) -> list[Word]:
        """Words of one text; special tokens written in it ("[MASK]") are words of their own."""
        words, start = [], 0
        for special, at in self._special_spans(text):
            words += self._plain_words(text[start:at], start)
            words.append(Word((self.vocab[special],), ((at, at + len(special)),)))
            start = at + len(special)
        return words + self._plain_words(text[start:], start)

    def _special_spans(self, text: str) -> list[tuple[str, int]]:
        """(special token, position) for each special token in the text, left to right; of two starting at
        the same character the longer wins. Each token's next occurrence is looked for again only once the
        spans have passed it, so every token reads the text once: linear in its length, however many hits."""
        specials = sorted(set(self.special_tokens.values()), key=len, reverse=True)
        following = {special: text.find(special) for special in specials}
        spans, at = [], 0
        while True:
            for special, position in following.items():
                if 0 <= position < at:  # overlapped by the span just taken: find the next one
                    following[special] = text.find(special, at)
            hits = [(position, special) for special, position in following.items() if position >= 0]
            if not hits:
                return spans
            position, special = min(hits, key=lambda hit: (hit[0], -len(hit[1])))
            spans.append((special, position))
            at = position + len(special)

    def _plain_words(self, text: str, start: int) -> list[Word]:
        normalized, origins = self.normalize(text, start)
        words, begin = [], None
        for i, char in enumerate(normalized + " "):
            if char == " " or _is_punctuation(char):
                if begin is not None:
                    words.append(self._word(normalized[begin:i], origins[begin:i]))
                    begin = None
                if char != " ":
                    words.append(self._word(char, origins[i:i + 1]))
            elif begin is None:
                begin = i
        return words

    # ---- stage 3: WordPiece -------------------------------------------------------------------------------

    def _word(self, word: str, origins: list[int]) -> Word:
        pieces = self._wordpiece(word)
        if pieces is None:
            return Word((self.unk_token_id,), ((origins[0], origins[-1] + 1),))
        ids = tuple(self.vocab[piece] for piece, _, _ in pieces)
        return Word(ids, tuple((origins[begin], origins[end - 1] + 1) for _, begin, end in pieces))

    def _wordpiece_uncached(self, word: str) -> tuple[tuple[str, int, int], ...] | None:
        """Greedy longest-match-first cover of `word` by vocabulary pieces: (piece, begin, end) or None."""
        if len(word) > MAX_CHARS_PER_WORD:
            return None
        pieces, begin = [], 0
        while begin < len(word):
            prefix = "##" if begin else ""
            end = next((end for end in range(len(word), begin, -1) if prefix + word[begin:end] in self.vocab), None)
            if end is None:
                return None
            pieces.append((prefix + word[begin:end], begin, end))
            begin = end
        return tuple(pieces)

    # ---- encoding ---------------------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of one text, without [CLS]/[SEP]."""
        return [self.ids_to_tokens[i] for word in self._words(_checked_text(text, "text")) for i in word.ids]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Token ids back to text: wordpieces joined, "##" continuations glued to the previous piece."""
        special = {self.vocab[token] for token in self.special_tokens.values()} if skip_special_tokens else set()
        tokens = [self.ids_to_tokens[int(i)] for i in ids if int(i) not in special]
        return " ".join(tokens).replace(" ##", "")

    def _encode(self, text: str, pair: str | None, max_length: int | None) -> dict[str, list]:
        """[CLS] A [SEP] (B [SEP]) for one row, truncated longest-first to max_length."""
        sequences = [self._words(text)] + ([self._words(pair)] if pair is not None else [])
        n_special = len(sequences) + 1
        counts = [sum(len(word.ids) for word in words) for words in sequences]
        limit = max_length if max_length is not None else self.model_max_length
        if sum(counts) + n_special > limit:
            if max_length is None:
                raise TokenizerError(
                    f"{text[:40]!r}… has {sum(counts) + n_special} tokens but the model takes at most "
                    f"{self.model_max_length}; pass max_length={self.model_max_length} to truncate it (longest "
                    f"first), or split the text.")
            if max_length < n_special + len(sequences):
                raise TokenizerError(f"max_length={max_length} leaves no room for text after the "
                                     f"{n_special} special tokens; use max_length >= {n_special + len(sequences)}.")
            counts = _truncated_counts(counts, max_length - n_special)
        row = dict(input_ids=[self.cls_token_id], token_type_ids=[0], word_ids=[None], sequence_ids=[None],
                   offsets=[(0, 0)])
        for sequence, (words, keep) in enumerate(zip(sequences, counts)):
            flat = [(i, span, w) for w, word in enumerate(words) for i, span in zip(word.ids, word.offsets)][:keep]
            row["input_ids"] += [i for i, _, _ in flat] + [self.sep_token_id]
            row["offsets"] += [span for _, span, _ in flat] + [(0, 0)]
            row["word_ids"] += [w for _, _, w in flat] + [None]
            row["sequence_ids"] += [sequence] * len(flat) + [None]
            row["token_type_ids"] += [sequence if self.segments else 0] * (len(flat) + 1)
        return row


def _truncated_counts(counts: list[int], budget: int) -> list[int]:
    """Longest-first truncation of one or two sequences to `budget` tokens in all (Hugging Face's rule:
    the shorter keeps up to half, the longer takes the rest; on a tie the second is the longer)."""
    if len(counts) == 1:
        return [budget]
    first, second = counts
    if first + second <= budget:
        return counts
    if first > second:
        short = min(second, budget // 2)
        return [budget - short, short]
    short = min(first, budget // 2)
    return [short, budget - short]


def _text_list(values, name: str) -> list:
    """One text, or a list, tuple or other iterable of texts, as a list (each text is checked as it is encoded)."""
    if isinstance(values, str):
        return [values]
    if isinstance(values, (bytes, Mapping)) or not isinstance(values, Iterable):
        raise TokenizerError(f"{name} is a {type(values).__name__}; pass a text (str) or a list of texts, "
                             f"e.g. model.tokenize(['Hello world.']).")
    return list(values)


def _checked_text(text, name: str) -> str:
    if not isinstance(text, str):
        raise TokenizerError(f"{name} is a {type(text).__name__}, not a string; pass text (str) to tokenize.")
    return text


def configured_special_tokens(directory: Path, settings: Mapping) -> dict[str, str]:
    """The special tokens a checkpoint names in tokenizer_config.json (`settings`) and special_tokens_map.json."""
    configured = directory / "tokenizer_config.json"
    special = {name: _content(settings[name], name, configured) for name in SPECIAL_TOKENS if settings.get(name)}
    mapped = directory / "special_tokens_map.json"
    return special | {name: _content(value, name, mapped) for name, value in _read_json(mapped).items()
                      if name in SPECIAL_TOKENS}


def configured_max_length(directory: Path, settings: Mapping, default: int) -> int | float:
    """tokenizer_config.json's model_max_length (`settings`), `default` where it has none. transformers writes
    a huge number (about 1e30) for "no limit": callers cap it."""
    value = settings.get("model_max_length", default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
        raise TokenizerError(f"{directory / 'tokenizer_config.json'}: model_max_length must be a positive number "
                             f"such as 512, got {value!r}. Fix it, or remove it to use the model's limit.")
    return value


def configured_flag(directory: Path, settings: Mapping, key: str, default, *, allow_none: bool = False):
    """A true/false setting of tokenizer_config.json (`settings`), `default` where it has none. A string such as
    "false" would count as true and change every token silently, so anything but a boolean is refused."""
    value = settings.get(key, default)
    if not isinstance(value, bool) and not (allow_none and value is None):
        also = " or null" if allow_none else ""
        raise TokenizerError(f"{directory / 'tokenizer_config.json'}: {key} must be true or false{also} (JSON "
                             f"booleans), got {value!r}. Fix the file.")
    return value


def _content(token, name: str, path: Path) -> str:
    """A special token as written in tokenizer configs: "[CLS]" or {"content": "[CLS]", ...}."""
    content = token.get("content") if isinstance(token, dict) else token
    if not isinstance(content, str) or not content:
        raise TokenizerError(f"{path}: {name} must be a token, \"[CLS]\" or {{\"content\": \"[CLS]\", ...}}, "
                             f"got {token!r}. Fix the file.")
    return content


def _read_json(path: Path) -> dict:
    """A tokenizer settings file that holds a JSON object; {} where there is none."""
    if not path.exists():
        return {}
    return read_json_object(path, "tokenizer settings are a JSON object", TokenizerError)


def _read_vocab(directory: Path) -> dict[str, int]:
    """vocab.txt (one token per line, id = line number), else the vocab inside a WordPiece tokenizer.json."""
    vocab_file = directory / "vocab.txt"
    if vocab_file.exists():
        data = vocab_file.read_bytes()
        try:
            lines = data.decode("utf-8").split("\n")
        except UnicodeDecodeError as error:
            line = data[:error.start].count(b"\n") + 1
            raise TokenizerError(f"{vocab_file}, line {line}: not valid UTF-8 (byte "
                                 f"0x{data[error.start]:02x}); a vocab.txt is UTF-8 text, one token per line. "
                                 f"Re-download it.") from None
        if lines and lines[-1] == "":
            lines.pop()
        return {token: i for i, token in enumerate(lines)}
    model = _read_json(directory / "tokenizer.json").get("model", {})
    if model.get("type") == "WordPiece":
        return dict(model["vocab"])
    raise TokenizerError(f"{directory} has no vocab.txt (nor a WordPiece tokenizer.json); BERT needs its vocabulary "
                         f"file next to config.json.")
