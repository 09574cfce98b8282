"""course.claims: a section's checks assert at once and print one line; ledger prints a table."""
import pytest
import torch

from ckpt_lab.lessons import course


def test_claims_that_hold_print_one_line(capsys):
    with course.claims("kept bytes") as c:
        c.ratio("kept", 1000, 1001, 0.99, 1.01)
        c.ratio("peak", 2036, 2000, 0.99, 1.05)
        c.equal("grads", [torch.ones(3)], [torch.ones(3)])
        c.true("falls", True, "3 > 2 > 1")
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["✓ 4 claims hold (kept bytes) · measured/predicted 0.999–1.018"]
    assert "<details>" in c.html() and "3 &gt; 2 &gt; 1" in c.html()


@pytest.mark.parametrize("check, match", [
    (lambda c: c.ratio("kept", 2, 1, 0.9, 1.1), r"kept: measured 2 B, predicted 1 B, ratio 2\.000"),
    (lambda c: c.equal("grads", [torch.ones(2)], [torch.zeros(2)]), "grads: not equal"),
    (lambda c: c.equal("dtypes", torch.ones(2), torch.ones(2, dtype=torch.float64)), "not equal"),
    (lambda c: c.true("a U", False, "minimum at the edge"), "a U: does not hold. minimum at the edge"),
])
def test_a_failing_claim_raises_with_its_full_line(check, match, capsys):
    with pytest.raises(AssertionError, match=match):
        with course.claims() as c:
            check(c)
    assert capsys.readouterr().out == ""                 # nothing printed as if it held


def test_an_empty_block_is_an_error():
    with pytest.raises(AssertionError, match="checked nothing"):
        with course.claims("nothing"):
            pass


def test_ledger_prints_aligned_rows(capsys):
    course.ledger("Results", {"kept after forward": "64 KiB", "peak": "1.20 MiB"})
    assert capsys.readouterr().out.splitlines() == [
        "Results", "  kept after forward  64 KiB", "  peak                1.20 MiB"]


def test_one_claim_holds(capsys):
    with course.claims() as c:
        c.true("x", True)
    assert capsys.readouterr().out.strip() == "✓ 1 claim holds"
