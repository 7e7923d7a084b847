"""SamplingParams validation and the keyed Gumbel-max sampler."""
import numpy as np
import pytest

from miniengine.sampling import SamplingParams, gumbel_noise, sample_token, top_k_mask, top_p_mask

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


@pytest.mark.parametrize("fields,message", [
    (dict(temperature=-0.5), r"temperature must be a finite number >= 0 \(0 means greedy\), got -0.5"),
    (dict(temperature=float("nan")), r"temperature must be .* got nan"),
    (dict(temperature="hot"), r"temperature must be .* got 'hot'"),
    (dict(top_k=-1), r"top_k must be an integer >= 0 \(0 means off\), got -1"),
    (dict(top_k=2.5), r"top_k must be an integer >= 0 .* got 2.5"),
    (dict(top_k=True), r"top_k must be an integer .* got True"),
    (dict(top_p=0), r"top_p must be a number in \(0, 1\] \(1 means off\), got 0"),
    (dict(top_p=1.5), r"top_p must be a number in \(0, 1\] .* got 1.5"),
    (dict(max_tokens=0), r"max_tokens must be an integer >= 1, got 0"),
    (dict(max_tokens=3.0), r"max_tokens must be an integer >= 1, got 3.0"),
    (dict(seed=1.5), r"seed must be an integer, got 1.5"),
    (dict(seed="7"), r"seed must be an integer, got '7'"),
])
def test_bad_sampling_params_name_the_field_value_and_range(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)


def test_good_sampling_params():
    SamplingParams(temperature=0, top_k=0, top_p=1.0, max_tokens=1, seed=-3)
    SamplingParams(temperature=2.0, top_k=50, top_p=1e-9, max_tokens=10**6, seed=np.int64(5))


def test_noise_is_keyed_by_seed_and_position_only():
    a = gumbel_noise(7, 12, 100)
    assert np.array_equal(a, gumbel_noise(7, 12, 100))
    assert not np.array_equal(a, gumbel_noise(7, 13, 100))
    assert not np.array_equal(a, gumbel_noise(8, 12, 100))
    assert np.isfinite(a).all()


def test_top_k_keeps_the_k_largest():
    logits = np.array([3.0, 1.0, 2.0, 0.0, 2.5])
    assert top_k_mask(logits, 2).tolist() == [True, False, False, False, True]
    assert top_k_mask(logits, 0).all() and top_k_mask(logits, 10).all()


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = np.array([0.1, 0.5, 0.3, 0.1])
    logits = np.log(probs)
    # Descending: 0.5, 0.3, 0.1, 0.1; the mass before each is 0, 0.5, 0.8, 0.9.
    assert top_p_mask(logits, 0.5).tolist() == [False, True, False, False]
    assert top_p_mask(logits, 0.75).tolist() == [False, True, True, False]
    assert top_p_mask(logits, 0.01).tolist() == [False, True, False, False]  # the top token always stays
    assert top_p_mask(logits, 1.0).all()


def test_greedy_is_argmax():
    assert sample_token(np.array([0.1, 2.0, -1.0]), SamplingParams(temperature=0), position=0) == 1


def test_gumbel_max_samples_the_softmax_distribution():
    """Over many positions, token frequencies match softmax(logits / T) (a 5-sigma bound per token)."""
    logits = np.array([1.0, 0.0, -1.0, 2.0])
    params = SamplingParams(temperature=0.7, seed=11)
    n = 20000
    counts = np.bincount([sample_token(logits, params, p) for p in range(n)], minlength=4)
    p = np.exp(logits / 0.7) / np.exp(logits / 0.7).sum()
    sigma = np.sqrt(n * p * (1 - p))
    assert np.all(np.abs(counts - n * p) < 5 * sigma), (counts, n * p)


def test_masked_tokens_are_never_sampled():
    logits = np.array([1.0, 0.9, 0.8, -5.0, 3.0])
    params = SamplingParams(temperature=1.5, top_k=2, seed=3)
    assert {sample_token(logits, params, p) for p in range(2000)} == {0, 4}
