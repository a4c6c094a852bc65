"""A recipe: a Hugging Face ``transformers`` BERT for sequence classification, from a small config.

Nothing is downloaded: the model is built from ``BertConfig`` with random weights, the tokens are random ids.
It returns a ``ModelOutput`` (``.logits``, ``.loss``...), so the recipe says which tensor the scores are with
``outputs_of``. Replace ``build_model`` with ``AutoModelForSequenceClassification.from_pretrained(...)`` and the
batches with your tokenised evaluation set to validate a real checkpoint.
"""

import torch
import torch.nn.functional as F

from amp_lessons.l04_baseline_and_decision_boundary import Criteria

task = "classification"
cpu_threads = 1

criteria = Criteria(
    atol=0.02,
    rtol=0.02,
    allowed_decision_changes=1,
    application="route a support message to one of 3 queues; a changed route delays one customer",
)

VOCAB, LENGTH, CLASSES = 500, 24, 3


def _tokens(count: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (count, LENGTH), generator=generator)
    return ids, torch.randint(0, CLASSES, (count,), generator=generator)


EVAL_IDS, EVAL_Y = _tokens(48, seed=0)
TRAIN_IDS, TRAIN_Y = _tokens(160, seed=1)


def _transformers():
    """``import transformers`` without its import-time noise; on a torch that the installed torchao does not
    support (torchao 0.18 on torch 2.4), transformers is told torchao is absent instead of failing to import it."""
    import sys

    from amp_lessons.core.optional_libraries import quiet_import, torchao_support

    if not torchao_support().available:
        for name in [n for n in sys.modules if n == "torchao" or n.startswith("torchao.")]:
            del sys.modules[name]
        sys.modules["torchao"] = None  # find_spec("torchao") is then None: "not installed"
    with quiet_import():
        import transformers
        import transformers.models.bert.modeling_bert  # noqa: F401  (its import is where torchao would load)
    transformers.logging.set_verbosity_error()  # no "you should train this model" banner: random on purpose
    return transformers


def build_model():
    transformers = _transformers()
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        num_labels=CLASSES,
        attn_implementation="eager",
    )
    return transformers.BertForSequenceClassification(config)


def outputs_of(model, inputs):
    return model(input_ids=inputs).logits


def evaluation_batches():
    return [(EVAL_IDS[i : i + 16], EVAL_Y[i : i + 16]) for i in range(0, len(EVAL_Y), 16)]


def training_batches():
    return [(TRAIN_IDS[i : i + 16], TRAIN_Y[i : i + 16]) for i in range(0, len(TRAIN_Y), 16)]


def loss_fn(outputs, targets):
    return F.cross_entropy(outputs, targets)


def optimizer(params):
    return torch.optim.AdamW(params, lr=1e-4)
