"""Lesson 5's exercises: each prediction's right answer, worked out independently (the formula,
a hand count, PyTorch's own checkpoint), passes; the usual wrong ones get a hint. The build
task's judge accepts a right count of a block's bytes and names the term a wrong one misses.
And the helper that matches saved storages to the formula's terms refuses storages that do not
line up."""
import pytest
import torch

from ckpt_lab import formulas
from ckpt_lab.lessons import exercises
from ckpt_lab.lessons import saved as saved_terms
from ckpt_lab.lessons.exercises import lesson05
from ckpt_lab.training.models import Block, GPTConfig

from exercise_checks import in_your_code, judge, unanswered_and_malformed


@pytest.fixture(autouse=True)
def _one(one_thread):
    yield

B, S, H, A = lesson05.BATCH, lesson05.SEQ, lesson05.HIDDEN, lesson05.HEADS


def test_seq_doubling_is_the_formulas_ratio():
    by_formula = (formulas.gpt_block_bytes(B, 2 * S, H, A, 4, mask_bytes=4)
                  / formulas.gpt_block_bytes(B, S, H, A, 4, mask_bytes=4))
    assert exercises.EXERCISES["05.seq_doubling"].expected() == pytest.approx(by_formula, rel=1e-9)
    assert judge("05.seq_doubling", round(by_formula, 2))
    assert not judge("05.seq_doubling", 2) and not judge("05.seq_doubling", 4)


def test_full_peak_cut_about_two_thirds_on_the_cpu_gpt():
    """Step peak (activations): the parameter gradients allocated before the step. Counted
    the other way (made in the step, about half) the answer is wrong, as are the forward's 90%
    and no cut at all."""
    cut = exercises.EXERCISES["05.full_peak_cut"].expected()
    assert 0.6 < cut < 0.72
    assert judge("05.full_peak_cut", round(cut, 2))
    for wrong in (0.9, 0.5, 0.1):
        assert not judge("05.full_peak_cut", wrong)


def test_sdpa_core_checkpoint_frees_only_the_logsumexp():
    share = exercises.EXERCISES["05.sdpa_selective"].expected()
    terms = formulas.transformer_layer_terms(S, B, H, A, attention="sdpa", dropout=False,
                                             act_bytes=4)
    lse = terms["softmax logsumexp (fp32, fused kernel)"]
    assert share == pytest.approx(lse / (sum(terms.values()) + 2 * 2 * B * S * 4), rel=1e-6)
    assert judge("05.sdpa_selective", 0) and judge("05.sdpa_selective", 0.01)
    assert not judge("05.sdpa_selective", 0.3)


def block_bytes(B, T, H, n_h):
    """The worked solution of the build task (notebooks/solutions/05_*)."""
    e, m = 4, 4
    return B * T * (H * (16 * e + 2 * m) + n_h * T * (2 * e + m) + 2 * 2 * e) + T * T


def test_block_bytes_judge_accepts_the_count_and_runs_it_against_real_blocks(capsys):
    assert [lesson05.measured_block_bytes(*size) for size in lesson05.BLOCK_SIZES] == [
        formulas.gpt_block_bytes(B_, T_, H_, n_h, 4, mask_bytes=4)
        for B_, T_, H_, n_h in lesson05.BLOCK_SIZES]
    assert exercises.check("05.block_bytes", block_bytes)
    assert "exact at all 5 sizes" in capsys.readouterr().out


def test_block_bytes_judge_names_what_a_wrong_count_misses(capsys):
    """Megatron's 16-bit count, and fp32 without the three small terms, are plausible and
    wrong; the hint names the kinds of term that are off, and by how much."""
    def megatron_16bit(B, T, H, n_h):
        return T * B * H * (34 + 5 * n_h * T / H)

    def no_small_terms(B, T, H, n_h):
        return block_bytes(B, T, H, n_h) - 16 * B * T - T * T

    assert not exercises.check("05.block_bytes", megatron_16bit)
    out = capsys.readouterr().out
    assert "the T·B·H terms" in out and "-38 bytes" in out and "-7 bytes" in out
    assert not exercises.check("05.block_bytes", no_small_terms)
    out = capsys.readouterr().out
    assert "layer norms' statistics (per token): -16 bytes" in out and "causal mask" in out
    assert "T·B·H" not in out.split("off in", 1)[1]
    assert not exercises.check("05.block_bytes", lambda B, T, H, n_h: None)
    assert "not answered yet" in capsys.readouterr().out
    assert not exercises.check("05.block_bytes", lambda B, T, H, n_h: 1 / 0)
    assert "ZeroDivisionError" in capsys.readouterr().out


def test_unanswered_and_malformed_never_raise(capsys):
    unanswered_and_malformed(exercises.keys(5), "twice", capsys)
    assert exercises.keys(5) == ["05.seq_doubling", "05.full_peak_cut", "05.sdpa_selective",
                                 "05.block_bytes"]


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
    assert "34 + 5 · n_h T/H" in table and table.count("\n") == len(ours) + 2
    fp32 = formulas.gpt_block_terms(B, S, H, A, 4, mask_bytes=4)
    wide = saved_terms.mapping_table(ours, paper, S * B * H, A * S / H, fp32)
    rows = {r.split(" | ")[0].strip("| "): r.split(" | ") for r in wide.splitlines()[2:-1]}
    assert all(len(r) == 5 for r in rows.values())
    assert rows["GELU input (4H)"][1:3] == ["8", "16"]              # activations: 2 -> 4 bytes
    assert rows["mlp dropout mask"][1:3] == ["1", "4"]              # masks on a CPU: 1 -> 4 bytes
    assert rows["softmax output"][2] == "4 · n_h T/H"
    assert rows["causal mask (~mask, bool)"][1] == rows["causal mask (~mask, bool)"][2]  # bool


def test_in_your_code_frees_every_core_and_keeps_the_gradients():
    """The copyable wrapper, applied to a GPT's blocks as the block says, frees each block's
    T x T terms and leaves the gradients bit for bit."""
    from types import SimpleNamespace

    from ckpt_lab.measure.memory import kept_after_forward
    from ckpt_lab.training.models import build_model

    config = GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    plain, wrapped = build_model(config), build_model(config)
    exec(in_your_code("05_transformers_selective"),
         {"model": SimpleNamespace(blocks=list(wrapped.blocks()))})
    freed = (kept_after_forward(lambda t: plain(t, t), idx)
             - kept_after_forward(lambda t: wrapped(t, t), idx))
    terms = formulas.gpt_block_terms(2, 16, 32, 2, 4, mask_bytes=4)
    assert freed == 2 * sum(terms[t] for t in saved_terms.CORE_TERMS)
    grads = []
    for gpt in (plain, wrapped):
        torch.manual_seed(1)
        gpt(idx, idx).backward()
        grads.append([p.grad for p in gpt.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
