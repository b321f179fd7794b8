import numpy as np

from configs import demo
from jaxspeech.evaluate import eval_bucket_spec


def test_eval_buckets_cover_the_longest_utterance():
    config = demo.get_config()
    config.data.eval_bucket_boundaries = (3.0, 6.5)
    spec = eval_bucket_spec(config, np.array([1.0, 4.0, 9.2], np.float32), multiple_of=2)
    assert spec.boundaries == (3.0, 6.5, 10.0)
    assert all(bs % 2 == 0 for bs in spec.batch_sizes)
    # Without eval buckets the training buckets are used; no extra bucket when all fit.
    config.data.eval_bucket_boundaries = None
    spec = eval_bucket_spec(config, np.array([1.0, 2.0], np.float32), multiple_of=1)
    assert spec.boundaries == tuple(config.data.bucket_boundaries)
