"""Lesson 14's exercises: each prediction's right answer, worked out independently (the formula,
a count of matmuls), passes; the usual wrong ones get a hint. The build task's judge accepts a
chunked loss written with torch's checkpoint and rejects the plausible wrong ones with a hint.
And the lesson's copyable chunked loss is F.cross_entropy's, padding included."""
import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from ckpt_lab import formulas
from ckpt_lab.lessons import exercises
from ckpt_lab.lessons.exercises import lesson14

from exercise_checks import in_your_code, judge, right_then_wrong, unanswered_and_malformed

N, H, V = lesson14.ROWS, lesson14.HIDDEN, lesson14.VOCAB


def test_loss_tensors_is_three_as_the_formula_counts():
    by_formula = formulas.cross_entropy_peak_bytes(N, V, H) / (N * V * 4)
    assert by_formula == 3
    assert exercises.EXERCISES["14.loss_tensors"].expected() == pytest.approx(3, abs=1e-4)
    assert judge("14.loss_tensors", 3)
    assert not judge("14.loss_tensors", 2) and not judge("14.loss_tensors", 4)


def test_chunk_floor_is_the_formulas_and_levels_off():
    peaks = lesson14.chunk_peaks()
    for chunks, measured in peaks.items():
        formula = formulas.chunked_cross_entropy_peak_bytes(N, V, H, chunks, tracked=True)
        assert measured == pytest.approx(formula, rel=1e-3)
    assert peaks[16] == pytest.approx(peaks[4], rel=1e-3) and peaks[4] < 0.6 * peaks[1]
    assert exercises.EXERCISES["14.chunk_floor"].expected() == "levels off"
    assert judge("14.chunk_floor", "levels off") and judge("14.chunk_floor", " Levels  off")
    assert not judge("14.chunk_floor", "keeps falling")
    assert not judge("14.chunk_floor", "rises again")
    assert not judge("14.chunk_floor", "falls")                   # not one of the three


def test_chunk_price_is_one_matmul_on_three():
    assert exercises.EXERCISES["14.chunk_price"].expected() == pytest.approx(2 / 6)
    assert judge("14.chunk_price", 1 / 3) and judge("14.chunk_price", 0.33)
    assert not judge("14.chunk_price", 0.5) and not judge("14.chunk_price", 0)
    assert not judge("14.chunk_price", 1)


def chunked_loss(hidden, W, targets, C):
    """The worked solution of the build task (notebooks/solutions/14_*)."""
    def chunk_sum(h, t):
        return F.cross_entropy(h @ W.T, t, reduction="sum")
    total = 0
    for h, t in zip(hidden.chunk(C), targets.chunk(C)):
        total = total + torch.utils.checkpoint.checkpoint(chunk_sum, h, t, use_reentrant=False)
    return total / (targets != -100).sum()


def not_checkpointed(hidden, W, targets, C):
    """Right value and gradients, but every chunk's logits outlive it: no memory saved."""
    total = 0
    for h, t in zip(hidden.chunk(C), targets.chunk(C)):
        total = total + F.cross_entropy(h @ W.T, t, reduction="sum")
    return total / (targets != -100).sum()


def mean_over_all_rows(hidden, W, targets, C):
    """Divides by len(targets): wrong as soon as some targets are padding."""
    return chunked_loss(hidden, W, targets, C) * (targets != -100).sum() / len(targets)


def test_chunked_loss_judge_accepts_the_solution_and_names_the_near_misses(capsys):
    right_then_wrong("14.chunked_loss", chunked_loss, not_checkpointed, "peak is too high",
                     capsys)
    assert not exercises.check("14.chunked_loss", mean_over_all_rows)
    assert "not by len(t)" in capsys.readouterr().out
    assert not exercises.check("14.chunked_loss", lambda hidden, W, targets, C: None)
    assert "not answered yet" in capsys.readouterr().out
    assert not exercises.check("14.chunked_loss", lambda hidden, W, targets, C: 1 / 0)
    assert "ZeroDivisionError" in capsys.readouterr().out


def test_unanswered_and_malformed_never_raise(capsys):
    unanswered_and_malformed(exercises.keys(14), "chunks", capsys)
    assert exercises.keys(14) == ["14.loss_tensors", "14.chunk_floor", "14.chunk_price",
                                  "14.chunked_loss"]


def test_in_your_code_is_the_hugging_face_loss_with_padding():
    """The closing's lines, with the build task's chunked_loss, give a Hugging Face causal LM's
    own loss (labels=, shifted inside) and its gradients, when the batch holds padding."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    model = LlamaForCausalLM(config)        # fp32: HF's loss upcasts its logits to it
    ids = torch.randint(0, 64, (3, 11))
    mask = torch.ones_like(ids)
    mask[0, 7:] = mask[2, 4:] = 0                              # right padding, as a collator pads
    space = dict(model=model, ids=ids, mask=mask, chunked_loss=chunked_loss)
    exec(in_your_code("14_the_loss_at_large_vocabularies"), space)
    assert space["C"] == 3                                     # N = 30 rows, H = 16: C > 2.8
    got = [space["loss"].detach()] + [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    labels = ids.masked_fill(mask == 0, -100)
    want = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    want.backward()
    assert torch.allclose(got[0], want.detach(), rtol=1e-6)
    for a, p in zip(got[1:], model.parameters()):
        assert torch.allclose(a, p.grad, rtol=1e-5, atol=1e-7)
