# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 5. Your own checkpoint
#
# The tutorials so far used the bundled all-MiniLM-L6-v2. Research usually starts from
# *your* model: a BERT fine-tuned with Hugging Face `transformers` and saved with
# `save_pretrained`. This tutorial makes such a checkpoint (a small classifier with random
# weights, so it runs in seconds), loads it with `minibert.load(path)`, and checks that
# minibert computes the same logits as `transformers`. Then: how names are resolved, what
# happens with a name that is not on disk, and what to do with a `pytorch_model.bin`.
#
# This tutorial needs PyTorch and `transformers`, which minibert itself does not:
# `pip install 'minibert[tutorials]'` installs them.

# %%
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers

import minibert
from minibert.app.tutorials import expect  # prints each claim and what it means when it fails
from minibert.io import sources

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()
workdir = Path(tempfile.mkdtemp(prefix="minibert-tutorial-"))

# %% [markdown]
# ## A fine-tuned-style classifier
#
# A `BertForSequenceClassification` with named labels (`id2label` goes into `config.json`),
# saved the way a fine-tuning script saves it: the model with `save_pretrained`, and next to
# it the tokenizer it was trained with — here the bundled checkpoint's WordPiece vocabulary.
# The weights are random (with a larger spread than the default initialisation, so the
# logits differ visibly between sentences).

# %%
bundled = sources.resolve()  # where the bundled checkpoint lives
hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(bundled)
config = transformers.BertConfig(
    vocab_size=hf_tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=128, initializer_range=0.2,
    id2label={0: "negative", 1: "neutral", 2: "positive"}, label2id={"negative": 0, "neutral": 1, "positive": 2},
)
torch.manual_seed(0)
classifier = transformers.BertForSequenceClassification(config).eval()
checkpoint = workdir / "my-classifier"
classifier.save_pretrained(checkpoint)
hf_tokenizer.save_pretrained(checkpoint)
print(sorted(p.name for p in checkpoint.iterdir()))

# %% [markdown]
# ## Load it and compare with transformers
#
# `minibert.load(path)` reads `config.json`, picks the head from `architectures`
# (here `BertForSequenceClassification`: encoder, pooler, classifier), reads
# `model.safetensors` through a strict key table (every key named, every shape checked)
# and the tokenizer saved beside it. The weights are random, so the predicted labels mean
# nothing; what matters is that both libraries compute the same numbers.

# %%
model = minibert.load(checkpoint)
print(model)
print("labels:", model.config.id2label)

texts = ["What a wonderful film.", "The plot was thin and the acting worse.", "It was fine, I guess."]
batch = model.tokenize(texts)
ours = np.asarray(model(batch).logits)

encoded = hf_tokenizer(texts, padding=True, return_tensors="pt")
expect((encoded["input_ids"].numpy() == np.asarray(batch.input_ids)).all(), "the same token ids as BertTokenizerFast",
       "the two tokenizers disagree on these texts: print both id rows to find the word.")
reference = transformers.BertForSequenceClassification.from_pretrained(checkpoint, attn_implementation="eager").eval()
with torch.no_grad():
    theirs = reference(**encoded).logits.numpy()

for text, row_ours, row_theirs in zip(texts, ours, theirs):
    label = model.config.id2label[int(row_ours.argmax())]
    print(f"{text:42s} minibert {np.array2string(row_ours, precision=4)}  "
          f"transformers {np.array2string(row_theirs, precision=4)}  → {label}")
print(f"largest difference: {np.abs(ours - theirs).max():.1e}")
expect(np.allclose(ours, theirs, rtol=0, atol=1e-5), "minibert's logits equal transformers' within 1e-5",
       "the two did not load the same weights or tokens: compare the folders and the batch each one reads.")

# %% [markdown]
# Everything from the previous tutorials works on it: the classifier has its own hook,
# `classifier.hook_logits`, and gradients flow to any attention pattern. For example, the
# gradient of the "positive" logit of the first sentence with respect to the last layer's
# attention:

# %%
positive = model.config.id2label.index("positive")
loss, grads = model.grad(batch, lambda out: out.logits[0, positive], names="blocks.1.attn.hook_pattern")
expect(np.isclose(float(loss), ours[0, positive], rtol=0, atol=1e-5),
       "model.grad's loss is the logit it differentiates",
       "model.grad returns loss_fn's value on the same run: check the row and label the lambda reads.")
g = np.asarray(grads["blocks.1.attn.hook_pattern"])[0]  # [H, T, S]
head, t, s = np.unravel_index(np.abs(g).argmax(), g.shape)
print(f"largest |∂logit/∂A|: head {head} (0-indexed), {batch.tokens[0][t]!r} → {batch.tokens[0][s]!r}: "
      f"{g[head, t, s]:+.4f}")

# %% [markdown]
# ## Names, the `weights/` store and the Hugging Face cache
#
# `minibert.load(name)` looks, in this order, at:
#
# 1. **a path** — a checkpoint directory (or a file in it);
# 2. **`weights/<name>`** — the project's local store: `$MINIBERT_WEIGHTS` if set, then
#    `./weights`, then the `weights/` folder of the minibert checkout;
# 3. **the bundled package** — `minibert.load()` with no name, or `"all-MiniLM-L6-v2"`;
# 4. **the Hugging Face cache** — a Hub id such as `"bert-base-uncased"` that
#    `huggingface_hub` has already downloaded (read offline).
#
# It never downloads on its own. `minibert.load("bert-base-uncased", download=True)` fetches
# the safetensors weights, config and vocabulary into the Hugging Face cache once; later
# loads find them there without the flag, offline.
#
# A store is a folder of checkpoint directories. Point `$MINIBERT_WEIGHTS` at one and load
# by name:

# %%
store = workdir / "store"
shutil.copytree(checkpoint, store / "sentiment-tiny")
os.environ["MINIBERT_WEIGHTS"] = str(store)
print("resolves to", sources.resolve("sentiment-tiny"))
by_name = minibert.load("sentiment-tiny")
expect((np.asarray(by_name(batch).logits) == ours).all(), "loading by name gives the same model, bit for bit",
       "the name resolved to another folder: see the path printed above.")
print("minibert.load('sentiment-tiny') gives the same logits")

# %% [markdown]
# A name found nowhere is an error that says where minibert looked and what to do:

# %%
try:
    minibert.load("acme/no-such-bert")
except sources.SourceError as error:
    message = str(error)
    print(message)
expect("download=True" in message and "weights/" in message, "the error says how to get the checkpoint",
       "the message above should name download=True and the weights/ folder.")

# %% [markdown]
# ## `.bin` checkpoints
#
# Older `transformers` versions, and many repositories on the Hub, store weights as
# `pytorch_model.bin`: a Python pickle, and unpickling a file can run arbitrary code.
# minibert reads safetensors by default. (`transformers` 5 always writes safetensors, so we
# make the legacy file the way older versions did: `torch.save(model.state_dict())`.)

# %%
legacy = workdir / "legacy-classifier"
legacy.mkdir()
torch.save(classifier.state_dict(), legacy / "pytorch_model.bin")
shutil.copy(checkpoint / "config.json", legacy)
hf_tokenizer.save_pretrained(legacy)
print(sorted(p.name for p in legacy.iterdir()))

try:
    minibert.load(legacy)
except minibert.CheckpointError as error:
    message = str(error)
    print(message)
expect("pickle" in message and "minibert convert" in message, "the error explains the pickle and the fix",
       "the message above should name the pickle and `minibert convert`.")

# %% [markdown]
# For a file you trust, either opt in for one load with `allow_pickle=True`, or convert it
# once to `model.safetensors` (`minibert convert path/pytorch_model.bin` on the command line;
# `minibert.convert_bin_to_safetensors` in Python) and load it normally from then on.

# %%
trusted = minibert.load(legacy, allow_pickle=True)
expect(np.allclose(np.asarray(trusted(batch).logits), ours, rtol=0, atol=1e-6),
       "the pickled pytorch_model.bin, loaded with allow_pickle=True, holds the same weights",
       "the .bin was written from other weights than the ones compared.")

converted = minibert.convert_bin_to_safetensors(legacy / "pytorch_model.bin")
print("wrote", converted.name)
from_safetensors = minibert.load(legacy)
expect(np.allclose(np.asarray(from_safetensors(batch).logits), ours, rtol=0, atol=1e-6),
       "the converted model.safetensors holds the same weights",
       "the conversion wrote other tensors than the .bin held.")
print("allow_pickle=True and the converted file both give the same logits as the original checkpoint")

# %%
del os.environ["MINIBERT_WEIGHTS"]
shutil.rmtree(workdir)
