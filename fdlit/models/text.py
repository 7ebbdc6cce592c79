"""BERT-tiny (Turc et al. 2019, "Well-read students learn better") for Yahoo Answers
(Kovalchuk et al. 2026, Table 2).

``prajjwal1/bert-tiny`` on the Hugging Face hub is Google's ``bert_uncased_L-2_H-128_A-2`` (2 layers,
hidden 128, ~4.4 M parameters), pretrained on Wikipedia + BookCorpus; its tokenizer is the
``data.tokenizer`` default. It is loaded with ``transformers`` (``BertForSequenceClassification``:
pooled [CLS] -> dropout -> linear head of ``num_classes``, the head freshly initialised) and cached by
the hub client. Inputs are the N x 2 x L int64 tensors of :mod:`fdlit.data.hub` (token ids, mask).
"""

from __future__ import annotations

import torch

from fdlit.errors import ConfigError
from fdlit.models.base import ClientNetwork

DEFAULT_BERT = "prajjwal1/bert-tiny"


class BertClassifier(ClientNetwork):
    """A pretrained BERT encoder with a classification head.

    Args:
        input_shape: (2, L) of the token tensors; filled from the data.
        num_classes: output classes; filled from the data.
        model_name: hub id or local folder (``save_pretrained`` layout) of the encoder.
        pretrained: load the pretrained encoder weights; false initialises randomly from its config.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...] | None = None,
        num_classes: int | None = None,
        model_name: str = DEFAULT_BERT,
        pretrained: bool = True,
    ):
        super().__init__()
        if input_shape is not None and (len(input_shape) != 2 or input_shape[0] != 2):
            raise ConfigError("model", f"BertClassifier needs token inputs of shape (2, L), got {tuple(input_shape)}; "
                                       "use a text dataset (e.g. data.dataset: yahoo_answers)")
        from transformers import AutoConfig, BertForSequenceClassification

        try:
            if pretrained:
                self.bert = BertForSequenceClassification.from_pretrained(
                    model_name, num_labels=num_classes or 10, ignore_mismatched_sizes=True)
            else:
                cfg = AutoConfig.from_pretrained(model_name, num_labels=num_classes or 10)
                self.bert = BertForSequenceClassification(cfg)
        except OSError as exc:
            from fdlit.models.resnet import WeightsUnavailable

            raise WeightsUnavailable(
                "model.init_args.model_name",
                f"{model_name!r} (Hugging Face hub) is not cached and cannot be downloaded ({type(exc).__name__}). "
                f"Fetch it once:\n    hf download {model_name}\n"
                f"or pass a local folder: --model.model_name DIR",
            ) from None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=x[:, 0], attention_mask=x[:, 1]).logits
