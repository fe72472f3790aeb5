"""The workbench's "why this output" panel (issue 30): which tokens and which heads account for the output shown,
for the text as typed (no head ablated), computed only when the page asks (`why`), apart from tokens and patterns.

What is explained is one number of the output, the *target* (`target`):
    sequence classifier   the logit of the class the model predicts for the text
    masked LM             the top guess's logit at the first [MASK] (max over the vocabulary)
    token classifier      the top label's logit at the chosen query token
    a sentence model      nothing: its output is the similarity of two texts, which no one text's score stands in
                          for; the answer's `hint` says so, and where to look instead (Outputs, ablating heads)
    anything else         ‖h_[CLS]‖, the length of the final hidden state at [CLS] (a checkpoint with no head, a
                          masked LM without [MASK]): which tokens and heads build the vector the model ends with
                          at its first position; `hint` says how to get a score of the model's own instead
Token attributions: integrated gradients (STEPS Gauss–Legendre points, [PAD] baseline; docs/circuits.md), one per
token. Heads: each head's direct effect on the target along the skip path frozen at the run
(analysis.direct_attribution), the TOP_HEADS largest by |value|. Each (bucket length, target) is two compiled
programs; a target's only varying part is an int (class, position), which keys its program by value.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np

from minibert.analysis.circuits import direct_attribution, token_attribution
from minibert.core.config import head_label
from minibert.viz._panel import Panel
from minibert.viz._request import index

STEPS = 16  # integration points: the completeness gap the answer reports says how good that is for this text
TOP_HEADS = 5  # heads listed, by |direct effect|


def _class_logit(c: int):
    return lambda out: out.logits[:, c]


def _top_logit_at(position: int):
    return lambda out: jnp.max(out.logits[:, position], axis=-1)


def _cls_length(out):
    return jnp.linalg.norm(out.last_hidden_state[:, 0].astype(jnp.float32), axis=-1)


SIMILARITY_HINT = ("This model's output is the similarity of sentence A and sentence B: type a sentence B to see it "
                   "in Outputs, and click heads to ablate them to see which ones move it (tutorial 4 sweeps every "
                   "head). This panel explains a score of one text (a class, a masked-LM guess, a token's label), "
                   "which this model does not output.")
# With a sentence B typed: the similarity is in Outputs already (the page asked for a B that was there).
SIMILARITY_SHOWN_HINT = ("This model's output is the similarity of sentence A and sentence B, in Outputs above: click "
                         "heads to ablate them to see which ones move it (tutorial 4 sweeps every head). This panel "
                         "explains a score of one text (a class, a masked-LM guess, a token's label), which this "
                         "model does not output.")
CLS_LENGTH = "‖h[CLS]‖, the length of the vector the last layer writes at [CLS], the first token"


def target(model, run, query: int):
    """(metric function of the output, what it is in words, a hint or None) for one workbench Run (its logits, ids,
    tokens); (None, None, hint) for a sentence model, whose output (a similarity of two texts) is not explained."""
    heads, tokenizer = model.config.heads, model.tokenizer
    if heads.classifier == "sequence":
        c = int(np.argmax(run.logits))
        return _class_logit(c), f"the logit of the predicted class “{model.config.id2label[c]}”", None
    if heads.mlm and (run.ids == tokenizer.mask_token_id).any():
        position = int(np.flatnonzero(run.ids == tokenizer.mask_token_id)[0])
        return _top_logit_at(position), f"the top guess's logit at the first [MASK] (position {position})", None
    if heads.classifier == "token":
        return _top_logit_at(query), f"the top label's logit at the chosen token (position {query})", None
    if model.pooling is not None:
        return None, None, SIMILARITY_HINT
    hint = (f"Put {tokenizer.mask_token} in the text: the panel then explains the model's top guess there."
            if heads.mlm else "This checkpoint has no head, so it outputs no score of its own to explain.")
    return _cls_length, CLS_LENGTH, hint


def why(workbench, body: Mapping) -> dict:
    """The answer to the page's "why" request (docs/serve.md): {target, value, tokens, scores [T], baseline_value,
    completeness_gap, method, steps, heads: [{layer, head, label, value}], linear, hint}; for a sentence model
    only {target: None, tokens, hint}. `query` (0-indexed, default 0) is the token a token classifier's target
    reads."""
    request = workbench.request({**body, "ablate": []})
    run = workbench.cached_run(request)
    query = index(body, "query", len(run.tokens), "tokens here", 0)
    metric, described, hint = target(workbench.model, run, query)
    if metric is None:
        if hint == SIMILARITY_HINT and str(body.get("pair") or "").strip():
            hint = SIMILARITY_SHOWN_HINT
        return {"target": None, "tokens": run.tokens, "hint": hint}
    padded = workbench.padded_inputs(request)  # one program per bucket, as the runs
    length = len(run.tokens)
    with workbench.compiling("why", padded["input_ids"].shape[1]):
        tokens = token_attribution(workbench.model, padded, metric, steps=STEPS)
        direct = direct_attribution(workbench.model, padded, metric)
    order = np.argsort(-np.abs(direct.heads), axis=None, kind="stable")[:TOP_HEADS]
    top = [{"layer": int(layer), "head": int(head), "label": head_label(int(layer), int(head)),
            "value": float(direct.heads[layer, head])}
           for layer, head in zip(*np.unravel_index(order, direct.heads.shape))]
    return {"target": described, "value": float(tokens.metric[0]), "tokens": run.tokens,
            "scores": [float(s) for s in tokens.scores[0, :length]], "baseline_value": float(tokens.baseline_metric[0]),
            "completeness_gap": float(tokens.completeness_gap[0]), "method": tokens.method, "steps": STEPS,
            "heads": top, "linear": direct.linear, "hint": hint}


PANEL = Panel("why", answer=why, script="why_view.js", constructor="minibertWhy", programs=("why",))
