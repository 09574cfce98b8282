"""Lesson 5's predictions: each right answer, worked out independently (the formula, a hand
count, PyTorch's own checkpoint), passes; the usual wrong ones get a hint. And the helper that
matches saved storages to the formula's terms refuses storages that do not line up."""
import pytest
import torch

from ckpt_lab import formulas
from ckpt_lab.lessons import exercises
from ckpt_lab.lessons import saved as saved_terms
from ckpt_lab.lessons.exercises import lesson05
from ckpt_lab.training.models import Block, GPTConfig

from exercise_checks import in_your_code, judge, unanswered_and_malformed

B, S, H, A = lesson05.BATCH, lesson05.SEQ, lesson05.HIDDEN, lesson05.HEADS


def test_seq_doubling_is_the_formulas_ratio():
    by_formula = (formulas.gpt_block_bytes(B, 2 * S, H, A, 4, mask_bytes=4)
                  / formulas.gpt_block_bytes(B, S, H, A, 4, mask_bytes=4))
    assert exercises.EXERCISES["05.seq_doubling"].expected() == pytest.approx(by_formula, rel=1e-9)
    assert judge("05.seq_doubling", round(by_formula, 2))
    assert not judge("05.seq_doubling", 2) and not judge("05.seq_doubling", 4)


def test_full_peak_cut_about_half_on_the_cpu_gpt():
    cut = exercises.EXERCISES["05.full_peak_cut"].expected()
    assert 0.35 < cut < 0.65
    assert judge("05.full_peak_cut", round(cut, 2))
    assert not judge("05.full_peak_cut", 0.9) and not judge("05.full_peak_cut", 0.1)


def test_sdpa_core_checkpoint_frees_only_the_logsumexp():
    share = exercises.EXERCISES["05.sdpa_selective"].expected()
    terms = formulas.transformer_layer_terms(S, B, H, A, attention="sdpa", dropout=False,
                                             act_bytes=4)
    lse = terms["softmax logsumexp (fp32, fused kernel)"]
    assert share == pytest.approx(lse / (sum(terms.values()) + 2 * 2 * B * S * 4), rel=1e-6)
    assert judge("05.sdpa_selective", 0) and judge("05.sdpa_selective", 0.01)
    assert not judge("05.sdpa_selective", 0.3)


def test_unanswered_and_malformed_never_raise(capsys):
    unanswered_and_malformed(exercises.keys(5), "twice", capsys)
    assert len(exercises.keys(5)) == 3


def _saved(block, x):
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        block(x)
    return saved


def test_by_term_matches_every_term_and_refuses_a_wrong_formula():
    torch.manual_seed(0)
    block = Block(GPTConfig(block_size=64, n_embd=32, n_head=2, dropout=0.1))
    saved = _saved(block, torch.randn(2, 16, 32, requires_grad=True))
    terms = formulas.gpt_block_terms(2, 16, 32, 2, 4, mask_bytes=4)
    assert saved_terms.by_term(saved, terms, exclude=block.parameters()) == terms
    wrong = dict(terms, **{"softmax output": terms["softmax output"] // 2})
    with pytest.raises(ValueError, match="do not line up"):
        saved_terms.by_term(saved, wrong, exclude=block.parameters())
    with pytest.raises(ValueError, match="in no term"):          # a storage left over
        saved_terms.by_term(saved + [torch.zeros(3)], terms, exclude=block.parameters())


def test_the_mapping_covers_every_term_of_both_formulas():
    ours = formulas.gpt_block_terms(B, S, H, A, 2, mask_bytes=1)
    paper = formulas.megatron_layer_terms(S, B, H, A)
    assert set(saved_terms.MEGATRON_TERM) == set(ours)
    assert {t for t in saved_terms.MEGATRON_TERM.values() if t} == set(paper)
    table = saved_terms.mapping_table(ours, paper, S * B * H, A * S / H)
    assert "34 + 5 · as/h" in table and table.count("\n") == len(ours) + 2


def test_in_your_code_chunked_loss_is_cross_entropy_with_padding():
    """The copyable chunked loss is F.cross_entropy's mean, value and gradients, when some
    targets are padding (-100) and the chunks are unequal: a mean over len(t) would be wrong."""
    import torch.nn.functional as F
    space = {}
    exec(in_your_code("05_transformers_selective"), space)
    torch.manual_seed(0)
    h = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    W = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 50, (37,))
    t[::3] = -100                                               # padding, as a collator marks it
    got = space["chunked_ce"](h, W, t, chunks=8)
    want = F.cross_entropy(h @ W.T, t)
    assert torch.allclose(got, want, rtol=1e-12)
    for a, b in zip(torch.autograd.grad(got, (h, W)), torch.autograd.grad(want, (h, W))):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-14)
