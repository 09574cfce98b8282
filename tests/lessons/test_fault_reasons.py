"""Lesson 2's reasons for its grid's further rows: one for every row, naming the torch designs the
catalogue records as silently wrong, and the mechanisms two of them state, measured."""
import warnings

import pytest
import torch
from torch import nn

from ckpt_lab.checkpoint import case_scenarios, cases
from ckpt_lab.lessons import fault_reasons

FURTHER = cases.LESSON_ROWS[len(cases.FAULTS):]
TORCH = (fault_reasons.NON_REENTRANT, fault_reasons.REENTRANT)


def test_every_further_row_has_a_reason_and_no_reason_is_stale():
    assert [c.name for c in FURTHER] == list(fault_reasons.REASONS)


@pytest.mark.parametrize("case", FURTHER, ids=lambda c: c.name)
def test_a_reason_names_the_designs_the_catalogue_records_as_silently_wrong(case):
    assert fault_reasons.fooled(case.name) == {d for d in TORCH
                                               if case.expected[d] == cases.WRONG}


def _case(name):
    return next(c for c in FURTHER if c.name == name)


def test_the_reentrant_design_loses_the_graph_of_a_tensor_in_a_dict_and_of_an_unnamed_weight():
    reentrant = cases.WRAPS[fault_reasons.REENTRANT]
    x_grad, weight_grad, bias_grad = _case("dict output + residual").run(reentrant)
    assert x_grad is not None and weight_grad is None and bias_grad is None
    _, weight_grad, _ = _case("backward(inputs=[weight])").run(reentrant)
    assert weight_grad is None


def test_the_encoder_takes_its_fast_path_under_no_grad_zeros_at_the_padding():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    x, padded = torch.randn(2, 5, 8), case_scenarios.PADDING
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")            # nested tensors are a prototype
        fast = encoder(x, src_key_padding_mask=padded)
    ordinary = encoder(x.requires_grad_(), src_key_padding_mask=padded)
    assert torch.all(fast[padded] == 0) and torch.all(ordinary[padded] != 0)


def test_the_lines_name_each_row_and_fit_the_width():
    lines = fault_reasons.lines(FURTHER)
    assert len(lines) == len(FURTHER)
    assert all(len(line) <= 100 for line in lines)
    assert lines[0].startswith("dict output + residual: ")
