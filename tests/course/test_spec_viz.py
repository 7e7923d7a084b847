"""miniengine.course.spec_viz: the exact acceptance calculations agree with the engine's keyed draws, the enumerated
law of speculative sampling is the target's, and the pictures draw."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from miniengine.attention import NoCacheBackend  # noqa: E402
from miniengine.course import spec_viz as sv  # noqa: E402
from miniengine.sampling import SamplingParams, sample_token  # noqa: E402

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)

PAIRS = [
    ([0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]),
    ([0.1, 0.1, 0.8, 0.0], [0.7, 0.1, 0.1, 0.1]),
    ([0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]),
    ([0.6, 0.4, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]),  # disjoint supports
]


@pytest.mark.parametrize("p,q", PAIRS)
def test_acceptance_is_one_minus_tv_and_one_step_emits_p(p, q):
    p, q = np.array(p), np.array(q)
    keep = np.nan_to_num(sv.accept_probs(p, q))
    assert np.isclose(np.sum(q * keep), 1 - sv.total_variation(p, q))
    assert np.allclose(sv.one_step_distribution(p, q), p, atol=1e-12)


def test_accept_probs_mark_tokens_the_draft_never_proposes():
    keep = sv.accept_probs([0.5, 0.5, 0.0], [0.25, 0.0, 0.75])
    assert keep[0] == 1.0 and np.isnan(keep[1]) and keep[2] == 0.0


@pytest.mark.parametrize("p,q", PAIRS)
def test_gumbel_agreement_lies_within_the_coupling_bounds(p, q):
    lo, hi = sv.coupling_bounds(p, q)
    a = sv.gumbel_agreement(p, q)
    assert lo - 1e-12 <= a <= hi + 1e-12


def quadratic_gumbel_agreement(p, q):
    """The formula as written: sum over i of 1 / sum_j max(p_j/p_i, q_j/q_i)."""
    return sum(1.0 / np.maximum(p / p[i], q / q[i]).sum() for i in np.flatnonzero((p > 0) & (q > 0)))


def test_gumbel_agreement_of_random_pairs_is_the_quadratic_formula_and_within_bounds():
    rng = np.random.default_rng(0)
    for trial in range(60):
        p, q = rng.dirichlet(np.full(30, 0.3)), rng.dirichlet(np.full(30, 0.3))
        p[rng.integers(30, size=5)] = 0
        q[rng.integers(30, size=3)] = 0
        if trial % 3 == 0:
            q[:10] = p[:10]  # ties of p/q
        p, q = p / p.sum(), q / q.sum()
        lo, hi = sv.coupling_bounds(p, q)
        a = sv.gumbel_agreement(p, q)
        assert lo - 1e-12 <= a <= hi + 1e-12
        assert np.isclose(a, quadratic_gumbel_agreement(p, q), rtol=1e-10, atol=1e-14)
    assert np.isclose(sv.gumbel_agreement(p, p), 1.0)


def test_gumbel_agreement_matches_the_engines_keyed_sampler():
    """Shared keyed noise, as the coupled verifier draws it: the agreement rate over many seeds sits on the formula."""
    p = np.array([0.45, 0.25, 0.15, 0.1, 0.05])
    q = np.array([0.2, 0.4, 0.1, 0.05, 0.25])
    n = 4000
    same = sum(sample_token(np.log(p), SamplingParams(seed=s), 7) == sample_token(np.log(q), SamplingParams(seed=s), 7)
               for s in range(n)) / n
    exact = sv.gumbel_agreement(p, q)
    assert abs(same - exact) < 4 * np.sqrt(exact * (1 - exact) / n)
    assert exact < 1 - sv.total_variation(p, q)  # strictly below the maximal coupling here


def bigram(seed, vocab=3, sharp=1.0):
    """A toy autoregressive model: the next-token distribution depends on the last token."""
    rng = np.random.default_rng(seed)
    table = rng.dirichlet(np.full(vocab, sharp), size=vocab + 1)  # row vocab: the start of the text
    return lambda prefix: table[prefix[-1] if prefix else vocab]


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_speculative_sampling_emits_the_targets_law_by_enumeration(gamma):
    p_next, q_next = bigram(1), bigram(2)
    law = sv.speculative_distribution(p_next, q_next, gamma, length=3)
    target = sv.autoregressive_distribution(p_next, 3)
    assert set(law) <= set(target)
    assert np.isclose(sum(law.values()), 1.0)
    assert max(abs(law.get(k, 0.0) - v) for k, v in target.items()) < 1e-12
    draft = sv.autoregressive_distribution(q_next, 3)
    assert max(abs(draft[k] - v) for k, v in target.items()) > 1e-3  # the check has power


def test_speculative_distribution_rejects_bad_arguments():
    with pytest.raises(ValueError, match="gamma and length must be >= 1"):
        sv.speculative_distribution(bigram(1), bigram(2), 0, 3)


def test_all_logits_are_the_models_rows(tiny_gqa):
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    rows = sv.all_logits(tiny_gqa, ids)
    assert rows.shape == (len(ids), tiny_gqa.config.vocab_size) and rows.dtype == np.float64
    with torch.no_grad():
        last = tiny_gqa(torch.tensor(ids), torch.arange(len(ids)), NoCacheBackend([len(ids)]),
                        logits_indices=torch.tensor([len(ids) - 1]))[0].double().numpy()
    assert np.allclose(rows[-1], last, atol=1e-5)
    assert sv.distributions(rows[:2], SamplingParams(temperature=0)).sum(axis=1).tolist() == [1.0, 1.0]


def test_top_tokens_are_ordered_by_p_then_q():
    p = np.array([0.1, 0.6, 0.0, 0.3])
    q = np.array([0.2, 0.1, 0.7, 0.0])
    assert sv.top_tokens(p, q, top=2).tolist() == [1, 3]
    assert sv.top_tokens(p, q, top=4).tolist() == [1, 3, 0, 2]


def test_token_label_makes_whitespace_visible(tok):
    newline = tok.encode("\n").ids
    assert "↵" in sv.token_label(tok, newline[0])


def test_the_picture_and_the_explorer_draw():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.25, 0.25, 0.25, 0.25])
    fig = sv.draw_verification(p, q, ["a", "b", "c", "d"], title="t")
    assert len(fig.axes) == 3
    plt.close(fig)
    pytest.importorskip("ipywidgets")
    logits = np.log(np.stack([p + 1e-9, q]))
    box = sv.verify_explorer(logits, logits[::-1], ["a", "b", "c", "d"], context=lambda i: f"row {i}")
    assert len(box.children) == 2
    plt.close("all")
