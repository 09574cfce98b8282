"""Lesson 8's predictions: each judge accepts the answer worked out another way (by hand from
the parameter counts, by the op-by-op formula, by counting FLOPs) and rejects the diagnostic
wrong ones with a hint."""
import pytest
import torch

from ckpt_lab import capacity, formulas
from ckpt_lab.training import fallback
from ckpt_lab.lessons import exercises
from ckpt_lab.training.models import build_model

from exercise_checks import in_your_code, judge, unanswered_and_malformed


def test_only_the_7b_fits_one_141gb_gpu_by_its_state():
    budget = 0.85 * 141e9
    released = {"7B": 6_738_415_616, "13B": 13_015_864_320, "70B": 68_976_648_192}
    by_hand = {m for m, n in released.items() if 16 * n < budget}      # state alone must fit
    assert by_hand == {"7B"} == exercises.lesson08.models_that_fit()
    assert judge("08.fits_141gb", {"7B"}) and judge("08.fits_141gb", "7B")
    for wrong in ({"7B", "13B"}, set(), {"70B"}, {"7B", "13B", "70B"}):
        ok, hint = exercises.EXERCISES["08.fits_141gb"].judge(wrong)
        assert not ok and "GiB" in hint
    assert not judge("08.fits_141gb", {"8B"})                          # unknown size


def test_planner_reads_low_most_at_the_densest_by_the_op_by_op_formula():
    """Independent of the measurement: lesson 7's op-by-op formula, which matches a measured
    step within 2% (lesson 8 asserts it), lies above the planner on every plan, most at the
    densest one. The plans are the planner's: checkpoint_sequential's segments of k blocks,
    the last one run plainly."""
    cfg, x, _ = exercises.lesson08.course_gpt()
    b, t = x.shape
    small = capacity.TransformerConfig(cfg.n_layer, cfg.n_embd, cfg.n_head, t, vocab=cfg.vocab_size,
                                       micro_batch=b, precision="fp32", dropout=False)
    planned = {r.strategy: r.activation_bytes for r in capacity.strategy_rows(small, 2 ** 40)
               if r.accumulation_steps == 1}
    layers = formulas.gpt_layers(b, t, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size, 4, False)
    L, n = cfg.n_layer, cfg.n_layer + 2                  # embedding, L blocks, head
    by_formula = {}
    for name, k in (("none", 0), ("segments of 1 block", 1), ("segments of 2 blocks", 2)):
        spans = [(0, n, False)] if not k else ([(0, 1, False)] + [         # checkpoint_sequential's
            (1 + j * k, 1 + (j + 1) * k, True) for j in range(L // k - 1)] + [(1 + L - k, n, False)])
        by_formula[name] = formulas.chain_peak_bytes(layers, spans, b * t, cfg.vocab_size, 4) / planned[name]
    assert min(by_formula.values()) > 1 and max(by_formula, key=by_formula.get) == "segments of 1 block"
    measured = exercises.lesson08.planner_ratios()
    assert min(measured.values()) > 1 and exercises.lesson08.planner_error() == ("low", "segments of 1")
    assert judge("08.planner_error", ("low", "segments of 1"))
    assert judge("08.planner_error", ["low", "densest"])
    for wrong in (("high", "segments of 1"), ("low", "none"), ("high", "none")):
        assert not judge("08.planner_error", wrong)
    for malformed in ("low", ("low",), ("sideways", "none"), ("low", "everywhere"), None):
        ok, hint = exercises.EXERCISES["08.planner_error"].judge(malformed)
        assert not ok and hint


def test_densifying_first_ends_at_more_flops_than_accumulating_first(one_thread):
    """Independent of the judge's ladders: FlopCounterMode counts the same FLOPs for 4
    accumulated micro-batches as for one step, and more for any checkpointed configuration."""
    cfg, x, y = exercises.lesson08.course_gpt()
    model = build_model(cfg)
    plain, four = fallback.StepConfig(0, 1, x.shape[0]), fallback.StepConfig(0, 4, x.shape[0])
    dense = fallback.StepConfig(1, 1, x.shape[0])
    flops = [fallback.config_flops(model, x, y, c) for c in (plain, four, dense)]
    assert flops[0] == flops[1] < flops[2]
    accumulate, densify = exercises.lesson08.ladder_flop_ratios()
    assert accumulate == 1.0 < densify
    assert exercises.lesson08.ladder_flops() == "densify first"
    assert judge("08.ladder_flops", "densify first") and judge("08.ladder_flops", "Densify first")
    for wrong in ("accumulate first", "same"):
        ok, hint = exercises.EXERCISES["08.ladder_flops"].judge(wrong)
        assert not ok and ("forward" in hint)
    assert not judge("08.ladder_flops", 1.2)


def lora_state_bytes(shapes, other_params, r, base_bits=16, optimizer="adamw"):
    """The worked solution of lesson 8's build task."""
    bits = {16: 16, 8: 8, 4: 4.127}[base_bits]          # 4-bit: NF4 + double-quantised constants
    base = sum(o * i for o, i in shapes) * bits / 8 + 2 * other_params
    adapters = sum(r * (o + i) for o, i in shapes)       # A: r x d_in, B: d_out x r
    optimizer_bytes = {"adamw": 8, "adamw8bit": 2}[optimizer]
    return base + adapters * (4 + 4 + optimizer_bytes)   # fp32 weights, gradients, state


def test_the_lora_state_judge_accepts_the_solution_and_rejects_plausible_mistakes(capsys):
    pytest.importorskip("peft")
    assert exercises.check("08.lora_state", lora_state_bytes) is True
    assert "✓" in capsys.readouterr().out

    def full_training_on_adapters(shapes, other_params, r, base_bits=16, optimizer="adamw"):
        """Mixed-precision habit: a master copy too, and the base's gradients."""
        base = sum(o * i for o, i in shapes) * base_bits / 8 + 2 * other_params
        return 2 * base + sum(r * (o + i) for o, i in shapes) * 16

    def four_bits_flat(shapes, other_params, r, base_bits=16, optimizer="adamw"):
        """Forgets the quantisation constants (4 bits, not 4.127)."""
        base = sum(o * i for o, i in shapes) * base_bits / 8 + 2 * other_params
        per = {"adamw": 16, "adamw8bit": 10}[optimizer]
        return base + sum(r * (o + i) for o, i in shapes) * per

    def no_gradients(shapes, other_params, r, base_bits=16, optimizer="adamw"):
        bits = {16: 16, 8: 8, 4: 4.127}[base_bits]
        base = sum(o * i for o, i in shapes) * bits / 8 + 2 * other_params
        return base + sum(r * (o + i) for o, i in shapes) * (4 + {"adamw": 8, "adamw8bit": 2}[optimizer])

    for wrong in (full_training_on_adapters, four_bits_flat, no_gradients):
        assert exercises.check("08.lora_state", wrong) is False
        out = capsys.readouterr().out
        assert "✗" in out and "expected" in out and "frozen" in out
    def unsolved(shapes, other_params, r, base_bits=16, optimizer="adamw"):
        ...

    assert exercises.check("08.lora_state", unsolved) is False
    assert "not answered yet" in capsys.readouterr().out
    assert exercises.check("08.lora_state", lambda *a, **k: 1 / 0) is False
    assert "raised ZeroDivisionError" in capsys.readouterr().out
    assert exercises.check("08.lora_state", 123) is False


@pytest.mark.parametrize("key", exercises.keys(8))
def test_unanswered_and_malformed(key, capsys):
    unanswered_and_malformed([key], 3.5, capsys)
    build_task = key == "08.lora_state"                 # judged by running, not predicted
    assert (exercises.EXERCISES[key].expected is None) == build_task


def test_in_your_code_oom_ladder_retries_clean(monkeypatch):
    """Lesson 8's copyable OOM loop: the allocator setting comes before `import torch`; a retry
    starts from empty gradients (an OOM mid-accumulation leaves partial sums in .grad), and the
    cache is emptied outside the except block (whose traceback holds the failed step's tensors)."""
    import sys

    code = in_your_code("08_capacity_and_oom")
    assert code.index("PYTORCH_CUDA_ALLOC_CONF") < code.index("import torch")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")            # restored after the test
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(sys.exc_info()[0]))
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 4), torch.randn(8, 4)
    seen = []

    def train_step(micro_batches):
        """k micro-batches into .grad; the 1-micro-batch step runs out of memory in its backward."""
        seen.append([p.grad for p in model.parameters()])
        for i, xm in enumerate(x.chunk(micro_batches)):
            (model(xm).square().sum() / micro_batches).backward()
            if micro_batches == 1 or (micro_batches == 2 and i == 1):
                raise torch.OutOfMemoryError("simulated")

    exec(code, {"ladder": [1, 2, 4], "train_step": train_step, "model": model})
    assert len(seen) == 3 and all(g is None for step in seen for g in step)   # every try from scratch
    assert emptied == [None, None]                                      # outside except, once per OOM
    want = [torch.zeros_like(p) for p in model.parameters()]
    for xm in x.chunk(4):                                               # the step that fitted, alone
        grads = torch.autograd.grad(model(xm).square().sum() / 4, list(model.parameters()))
        want = [w + g for w, g in zip(want, grads)]
    assert all(torch.allclose(p.grad, w) for p, w in zip(model.parameters(), want))


def test_in_your_code_oom_ladder_raises_when_no_rung_fits():
    """The copied loop must not fall through as if a step had trained when every rung fails."""
    code = in_your_code("08_capacity_and_oom").replace(
        'os.environ["PYTORCH_CUDA_ALLOC_CONF"]', "_unused")            # leave the environment alone

    def train_step(cfg):
        raise torch.OutOfMemoryError("simulated")

    with pytest.raises(RuntimeError, match="no configuration fits"):
        exec(code, {"ladder": [1, 2, 4], "train_step": train_step, "model": torch.nn.Linear(2, 2)})


def test_the_planners_plan_is_the_one_measured():
    """Lesson 8 measures "segments of k blocks" as the planner prices it: checkpoint_sequential
    over the blocks, the last segment run plainly; the op-by-op formula of that plan matches the
    measured step exactly."""
    from ckpt_lab import track_memory
    cfg, x, y = exercises.lesson08.course_gpt()
    L, n = cfg.n_layer, cfg.n_layer + 2
    layers = formulas.gpt_layers(x.shape[0], x.shape[1], L, cfg.n_embd, cfg.n_head, cfg.vocab_size, 4, False)
    for k in (1, 2):
        model = build_model(cfg)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        with track_memory() as mem:
            exercises.lesson08.gpt_step(model, x, y, k).backward()
        spans = [(0, 1, False)] + [(1 + j * k, 1 + (j + 1) * k, True) for j in range(L // k - 1)] \
            + [(1 + L - k, n, False)]
        assert formulas.chain_peak_bytes(layers, spans, x.numel(), cfg.vocab_size, 4) == pytest.approx(
            mem.peak_bytes, rel=0.01)
