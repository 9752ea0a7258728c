"""Text cells whose window cannot train are errors where the study is planned, naming both numbers."""

import pytest

from dpstudy.study import sweeps
from dpstudy.util.errors import ConfigError
from dpstudy.workflow import windows


def study(tmp_path, **sweep_changes) -> tuple[dict, list]:
    sweep = {"name": "lm", "dataset": "synthetic_text", "model": "gpt", "grid": {"mode": ["single"]}}
    config = {
        "study": "lm",
        "data_root": str(tmp_path),
        "datasets": {"synthetic_text": {"train_size": 1000, "test_size": 300}},
        "sweeps": [{**sweep, **sweep_changes}],
    }
    config = sweeps.load(config)
    return config, sweeps.expand(config)


def test_a_window_that_fits_the_model_and_the_corpus_passes(tmp_path):
    windows.check(*study(tmp_path, set={"seq_len": 64}))  # gpt tiny: a context of 128


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"set": {"seq_len": 256}}, "seq_len 256 exceeds its context length 128"),  # gpt tiny's
        ({"set": {"seq_len": 100}, "grid": {"mode": ["ddp"], "gpus": [4], "backend": ["gloo"]}}, None),
        ({"set": {"model_args": {"vocab_size": 100}, "seq_len": 64}}, "the tokenizer has 256 symbols but"),
    ],
)
def test_a_window_the_cells_cannot_train_on_is_an_error_naming_the_sweep(tmp_path, changes, message):
    config, cells = study(tmp_path, **changes)
    with pytest.raises(ConfigError) as error:
        windows.check(config, cells)
    text = str(error.value)
    assert text.startswith("sweep 'lm': ")
    if message is None:  # 300 test tokens: 2 windows of 101 for 4 devices
        assert "seq_len 100 is too long for dataset 'synthetic_text': its test split has 300 tokens" in text
        assert "2 window(s) of 101 for 4 device(s)" in text
    else:
        assert message in text


def test_image_cells_are_not_its_business(tmp_path):
    config = sweeps.load(
        {
            "study": "i",
            "sweeps": [{"name": "a", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"]}}],
        }
    )
    windows.check(config, sweeps.expand(config))
