"""Metadata predictor (scikit-learn) end to end."""

from __future__ import annotations

import pytest

pytest.importorskip("sklearn")

from lbbench.core import Request  # noqa: E402
from lbbench.predict import get_scheme, load_predictor  # noqa: E402
from lbbench.predict.data import load_corpus  # noqa: E402
from lbbench.predict.metadata import MetadataPredictor, train_metadata_model  # noqa: E402


@pytest.mark.parametrize("estimator", ["gbdt", "random_forest"])
def test_metadata_learns_task_lengths_and_roundtrips(tiny_corpus, tmp_path, estimator):
    scheme = get_scheme("paper")
    ex = load_corpus(tiny_corpus).examples
    mp = train_metadata_model(ex, scheme, estimator=estimator)
    reqs = [Request(i, 0.0, e.prompt_tokens, e.output_tokens, e.task) for i, e in enumerate(ex)]
    preds = mp.predict(reqs)
    acc = sum(p.bucket == scheme.bucket_of(r.output_tokens) for p, r in zip(preds, reqs)) / len(reqs)
    assert acc > 0.9  # the task decides the bucket in this corpus
    mp.save(tmp_path / "m")
    loaded = load_predictor(f"metadata:{tmp_path / 'm'}")
    assert isinstance(loaded, MetadataPredictor)
    assert loaded.predict(reqs) == preds
    assert loaded.predict([]) == []


def test_metadata_load_errors(tmp_path):
    from lbbench.predict import PredictorSpecError

    with pytest.raises(PredictorSpecError, match="^predictor metadata:"):
        load_predictor(f"metadata:{tmp_path}")
