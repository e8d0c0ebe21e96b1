"""HotpotQA answer EM / F1 as a Hugging Face `evaluate` metric (a thin wrapper of pipeline.tasks.hotpotqa.metric).

    import evaluate
    metric = evaluate.load("/abs/path/to/pipeline/tasks/hotpotqa/evaluate_metric.py")
    metric.compute(predictions=["the Eiffel Tower"], references=["Eiffel Tower"])
    # {'exact_match': 1.0, 'f1': 1.0, 'n': 1}

evaluate copies this file into its module cache and imports it there, so `pipeline` must be
importable by the caller (an installed project, or the repository root on sys.path).
Its import scanner reads one `import x` per line: keep the imports below that way.
"""

import datasets
import evaluate

from pipeline.tasks.hotpotqa.metric import aggregate

_DESCRIPTION = (
    "HotpotQA's official answer metrics (hotpot_evaluate_v1.py): answers are lower-cased, "
    "stripped of punctuation and of the articles a/an/the, whitespace-collapsed; exact match and "
    "token F1 (0 when either side is yes/no/noanswer and they differ), averaged, as fractions."
)
_KWARGS = """
Args:
    predictions: list of predicted answers (str; "" for no answer).
    references: list of gold answers (str).
Returns:
    exact_match: mean exact match in [0, 1]; f1: mean token F1 in [0, 1]; n: number of pairs.
"""
_CITATION = """@inproceedings{yang2018hotpotqa,
  title={HotpotQA: A Dataset for Diverse, Explainable Multi-hop Question Answering},
  author={Yang, Zhilin and Qi, Peng and Zhang, Saizheng and Bengio, Yoshua and Cohen, William W.
          and Salakhutdinov, Ruslan and Manning, Christopher D.},
  booktitle={EMNLP}, year={2018}}"""


class HotpotqaMetric(evaluate.Metric):
    """EM and F1 over (prediction, reference) answer strings."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
            reference_urls=["https://github.com/hotpotqa/hotpot/blob/master/hotpot_evaluate_v1.py"],
        )

    def _compute(self, predictions, references) -> dict:
        scores = aggregate(zip(predictions, references, strict=True))
        return {"exact_match": scores["em"], "f1": scores["f1"], "n": scores["n"]}
